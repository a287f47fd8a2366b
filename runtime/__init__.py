"""zlaunch runtime: a DeepSpeed-compatible training engine with ZeRO stages 0-3.

Workers import this package; it never imports `zlaunch`. ``import runtime`` stays light: the
engine (and torch) load on first use of `initialize` or `Engine`.
"""

from __future__ import annotations

__all__ = [
    "Engine",
    "add_config_arguments",
    "checkpointing",
    "dist",
    "init_distributed",
    "initialize",
    "zero",
]


def __getattr__(name: str):
    # Each name loads with its module on first use: importing this folder (and
    # `import runtime`, which the controller does to check a config) stays light.
    if name in ("Engine", "add_config_arguments", "initialize"):
        from runtime import engine

        return getattr(engine, name)
    if name in ("init_distributed",):  # DeepSpeed's deepspeed.init_distributed
        from runtime.distributed import script_comm

        return getattr(script_comm, name)
    if name in ("checkpointing", "dist", "zero"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
