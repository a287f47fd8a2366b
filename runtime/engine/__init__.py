"""The engine: `initialize` (`build`) wraps a model into an `Engine` (`engine`).

The engine holds one sharding strategy (runtime.zero) and drives it; beside it, one concept
each: which backward ends an accumulation (`accumulation`), the step counters and their
checkpoint state (`train_counters`), DeepSpeed's getters (`queries`), work at the step
boundary (`step_hooks`), the training data loader (`dataloader`), torch.compile of the model
(`torch_compile`) and ZeRO inside a model-parallel layout (`model_parallel`). Its names load
on first use: ``import runtime`` stays free of torch.
"""

from __future__ import annotations

__all__ = [
    "Engine",
    "add_config_arguments",
    "initialize",
]


def __getattr__(name: str):
    # Each name loads with its module on first use: importing this folder (and
    # `import runtime`, which the controller does to check a config) stays light.
    if name in ("add_config_arguments", "initialize"):
        from runtime.engine import build

        return getattr(build, name)
    if name in ("Engine",):
        from runtime.engine import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
