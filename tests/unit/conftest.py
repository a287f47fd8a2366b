"""The unit tier: no subprocess, no fork, no process group, no cluster.

Enforced, not hoped for: while a unit test (or any fixture it pulls in, whatever its scope)
runs, starting a process or a torch.distributed process group raises `UnitTierViolation`,
naming the test and where it belongs. That keeps `python -m pytest tests/unit` a loop of
seconds, and the launcher's part of it runs without torch installed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest


class UnitTierViolation(AssertionError):
    pass


def _refuse(what: str):
    def refuse(*_args, **_kwargs):
        raise UnitTierViolation(
            f"a unit test started {what}: move it to tests/integration/ (tests/unit/ runs "
            "without processes or process groups)"
        )

    return refuse


@contextlib.contextmanager
def _no_processes():
    import _posixsubprocess

    patch = pytest.MonkeyPatch()
    try:
        patch.setattr(_posixsubprocess, "fork_exec", _refuse("a process"))
        patch.setattr(subprocess.Popen, "__init__", _refuse("a process"))
        patch.setattr(os, "fork", _refuse("a forked process"))
        if hasattr(os, "posix_spawn"):
            patch.setattr(os, "posix_spawn", _refuse("a process"))
        if "torch.distributed" in sys.modules:  # never imported here for the check's sake
            patch.setattr(
                sys.modules["torch.distributed"],
                "init_process_group",
                _refuse("a process group"),
            )
        yield
    finally:
        patch.undo()


UNIT = Path(__file__).resolve().parent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """One guard over a unit test's setup, call and teardown together.

    Patching each phase on its own leaked: a test that monkeypatches one of the guarded names
    (torch.distributed.init_process_group, say) saves the guard's refusal as the value to
    restore, and restores it at teardown, after the call phase's guard was undone, so every
    later test in that worker (integration tests included) found the refusal. Spanning all
    three phases puts the undo orders right: the test's monkeypatch restores the refusal, then
    the guard restores the original."""
    if UNIT not in Path(str(item.fspath)).resolve().parents:
        yield
        return
    with _no_processes():
        yield
    leaked = [name for name, value in _guarded() if getattr(value, "__name__", "") == "refuse"]
    if leaked:
        raise UnitTierViolation(f"{item.nodeid} left the unit-tier guard on {', '.join(leaked)}")


def _guarded():
    import _posixsubprocess

    yield "_posixsubprocess.fork_exec", _posixsubprocess.fork_exec
    yield "subprocess.Popen.__init__", subprocess.Popen.__init__
    yield "os.fork", os.fork
    if hasattr(os, "posix_spawn"):
        yield "os.posix_spawn", os.posix_spawn
    if "torch.distributed" in sys.modules:
        yield (
            "torch.distributed.init_process_group",
            sys.modules["torch.distributed"].init_process_group,
        )
