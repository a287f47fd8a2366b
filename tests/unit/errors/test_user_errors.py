"""Every user-facing error the runtime raises is a runtime.errors.UserError.

A script (or zlaunch) tells "fix your input" from a runtime bug with one `except UserError`,
so a `raise ValueError(...)` about something the user wrote would slip past it. This test
reads every `raise` in runtime/ and refuses the builtin types unless the raise is listed
below in INTERNAL, with the reason it cannot be the user's doing. Exception classes defined in
runtime/ must derive from runtime.errors, not from the builtins directly.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BUILTINS = {"Exception", "ValueError", "TypeError", "RuntimeError", "NotImplementedError"}

# (file, enclosing function, exception) -> why no user can cause it.
INTERNAL = {
    ("runtime/zero/stage3/units.py", "Unit.leave", "RuntimeError"): (
        "users enter and leave in the coordinator's own pairs, never from a user's call"
    ),
    ("runtime/distributed/comm.py", "Communicator.reduce_scatter", "ValueError"): (
        "the sizes come from the partition plan, not from the user"
    ),
    ("runtime/distributed/comm.py", "Communicator.split", "ValueError"): (
        "hpZ's group size is checked against the world first (stage3.fetch.hpz_size)"
    ),
    ("runtime/zero/quantize.py", "BlockQuantizer.__post_init__", "ValueError"): (
        "the formats are constants of the code (stage3.fetch), not user input"
    ),
    ("runtime/optim/lr_schedules.py", "_IterationScheduler.lr_at", "NotImplementedError"): (
        "abstract method"
    ),
    ("runtime/zero/partition.py", "FlatGroup.shard_range", "ValueError"): (
        "ranks come from the process group"
    ),
    ("runtime/zero/partition.py", "plan_layout", "ValueError"): (
        "world size and bucket size are checked by the config first"
    ),
    ("runtime/zero/param_offload.py", "ShardStore.shards", "ValueError"): (
        "each rank asks its own store"
    ),
}


def builtin_uses(source: str, path: str) -> list[tuple[str, str, str, int]]:
    """(path, enclosing function or "class X", builtin, line) for each raise of a builtin
    exception type and each class deriving from one directly."""
    found = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                for base in child.bases:
                    if isinstance(base, ast.Name) and base.id in BUILTINS:
                        found.append((path, f"class {child.name}", base.id, child.lineno))
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in BUILTINS:
                    where = ".".join(scope) or "<module>"
                    found.append((path, where, exc.id, child.lineno))
            named = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, [*scope, child.name] if named else scope)

    visit(ast.parse(source), [])
    return found


def runtime_builtin_uses() -> list[tuple[str, str, str, int]]:
    found = []
    for file in sorted((ROOT / "runtime").rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        if path != "runtime/errors/tree.py":  # where the tree meets the builtins
            found += builtin_uses(file.read_text(), path)
    return found


def test_user_facing_errors_derive_from_user_error():
    refused = [
        f"{path}:{line} {where}: {name}"
        for path, where, name, line in runtime_builtin_uses()
        if (path, where, name) not in INTERNAL
    ]
    assert not refused, (
        "raise a runtime.errors class (InvalidValueError, InvalidTypeError, UsageError, "
        "UnsupportedError) for what the user wrote or did; for a condition no user can cause, "
        "add it to INTERNAL with the reason:\n  " + "\n  ".join(refused)
    )


def test_the_check_sees_raises_and_classes():
    source = (
        "class Bad(ValueError):\n    pass\n\n"
        "class Engine:\n    def step(self):\n        raise RuntimeError('call backward first')\n\n"
        "def load():\n    raise TypeError\n\n"
        "def fine():\n    raise UsageError('x')\n"
    )
    assert builtin_uses(source, "m.py") == [
        ("m.py", "class Bad", "ValueError", 1),
        ("m.py", "Engine.step", "RuntimeError", 6),
        ("m.py", "load", "TypeError", 9),
    ]


def test_runtime_errors_keep_their_builtin_types():
    from runtime.checkpoint.errors import CheckpointError
    from runtime.config import ConfigError
    from runtime.distributed.collective_timeout import CollectiveTimeoutError
    from runtime.errors import UserError
    from runtime.optim.loss_scaler import LossScaleAtMinimum

    for cls, builtin in (
        (ConfigError, ValueError),
        (CollectiveTimeoutError, ValueError),
        (LossScaleAtMinimum, RuntimeError),
        (CheckpointError, RuntimeError),
    ):
        assert issubclass(cls, UserError) and issubclass(cls, builtin), cls
