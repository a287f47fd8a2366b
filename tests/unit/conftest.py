"""The unit tier: no subprocess, no fork, no process group, no cluster.

Enforced, not hoped for: while a unit test (or any fixture it pulls in, whatever its scope)
runs, starting a process or a torch.distributed process group raises `UnitTierViolation`,
naming the test and where it belongs. That keeps `python -m pytest tests/unit` a loop of
seconds, and the launcher's part of it runs without torch installed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys

import pytest


class UnitTierViolation(AssertionError):
    pass


_GUARD = {"on": False}
"""True while a unit test's setup or call runs (the phases the guard covers)."""


def _guarded(original, what: str):
    """`original`, refused while the guard is on.

    The wrappers are installed once and stay: the guard is a flag, not a patch. Patching per
    test leaked, because a test that monkeypatches one of these names (init_process_group, say)
    saves the guard's patch as the value to restore and restores it after the guard is undone,
    so every later test in that worker (integration tests too) found the refusal."""

    @functools.wraps(original)
    def refuse_while_guarded(*args, **kwargs):
        if _GUARD["on"]:
            raise UnitTierViolation(
                f"a unit test started {what}: move it to tests/integration/ (tests/unit/ runs "
                "without processes or process groups)"
            )
        return original(*args, **kwargs)

    refuse_while_guarded.unit_tier_guard = True
    return refuse_while_guarded


def _install(owner, name: str, what: str) -> None:
    current = getattr(owner, name)
    if not getattr(current, "unit_tier_guard", False):
        setattr(owner, name, _guarded(current, what))


def _install_all() -> None:
    import _posixsubprocess

    _install(_posixsubprocess, "fork_exec", "a process")
    _install(subprocess.Popen, "__init__", "a process")
    _install(os, "fork", "a forked process")
    if hasattr(os, "posix_spawn"):
        _install(os, "posix_spawn", "a process")
    if "torch.distributed" in sys.modules:  # never imported here for the check's sake
        _install(sys.modules["torch.distributed"], "init_process_group", "a process group")


@contextlib.contextmanager
def _no_processes():
    _install_all()
    _GUARD["on"] = True
    try:
        yield
    finally:
        _GUARD["on"] = False


# Setup and call only: a unit test's teardown may also finalize the session's fixtures (those
# of the cluster tier among them) when it is the worker's last test.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _no_processes():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _no_processes():
        yield
