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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _no_processes():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _no_processes():
        yield
