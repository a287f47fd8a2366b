"""Every user-facing error the runtime raises is a runtime.errors.UserError.

A script (or zlaunch) tells "fix your input" from a runtime bug with one `except UserError`,
so a `raise ValueError(...)` about something the user wrote would slip past it. This test
reads every `raise` in runtime/ and refuses the builtin types unless the raise is listed
below in INTERNAL, with the reason it cannot be the user's doing. Exception classes defined in
runtime/ must derive from runtime.errors, not from the builtins directly.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.runtime.test_user_errors import builtin_uses  # shared with the unit half

ROOT = Path(__file__).resolve().parents[3]

# (file, enclosing function, exception) -> why no user can cause it.
INTERNAL = {
    ("runtime/comm.py", "Communicator.reduce_scatter", "ValueError"): (
        "the sizes come from the partition plan, not from the user"
    ),
    ("runtime/lr_schedules.py", "_IterationScheduler.lr_at", "NotImplementedError"): (
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


def runtime_builtin_uses() -> list[tuple[str, str, str, int]]:
    found = []
    for file in sorted((ROOT / "runtime").rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        if path != "runtime/errors.py":  # where the tree meets the builtins
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
