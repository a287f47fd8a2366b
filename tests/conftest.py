"""Fixtures shared by the whole test suite, and the machine set up for it.

Before anything else (the cluster modules look for sshd and friends when they are imported):
the system packages the test clusters need, installed as root (tests/system_packages.py). For
the whole session: a ``TORCH_EXTENSIONS_DIR`` of its own, so no C++ build lock left in
``~/.cache/torch_extensions`` by a killed build can hang a test, and a check at the end that no
test built anything there (tests/fixtures/deepspeed/no_jit.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests import system_packages

# Once, in the process that starts the workers; a failed install stops the run (pytest_configure).
_SETUP_FAILED = None if os.environ.get("PYTEST_XDIST_WORKER") else system_packages.ensure()

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "cluster")
"""tests/<tier>/...: unit (no process, no process group: seconds), integration (local launches,
gloo multi-rank), cluster (real sshd hosts, Slurm, faults, the model zoo). `-m unit` etc. select
a tier; the mark comes from the folder, so it cannot drift from where a test lives."""


def xdist_group(parts: tuple[str, ...]) -> str:
    """The unit the README's parallel run (`-n 2 --dist loadgroup`) hands one worker whole.

    A test file: its module fixtures run once. A cluster folder: its tests share that worker's
    test cluster (a session fixture per worker), and Slurm's folder is one group because the
    machine has one Slurm."""
    if parts[0] == "cluster" and len(parts) > 2:
        return "/".join(parts[:2])
    return "/".join(parts)


_EXTENSIONS: list[str] = []
"""The session's TORCH_EXTENSIONS_DIR (made by the process that starts the workers, which
inherit it)."""


def pytest_configure(config):
    if _SETUP_FAILED:
        raise pytest.UsageError(_SETUP_FAILED)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _EXTENSIONS.append(tempfile.mkdtemp(prefix="zlaunch-tests-torch-extensions-"))
        os.environ["TORCH_EXTENSIONS_DIR"] = _EXTENSIONS[0]
    workers = getattr(config.option, "numprocesses", None)
    if workers and config.getoption("dist", "no") != "loadgroup":
        raise pytest.UsageError(
            f"-n {workers} needs --dist loadgroup: tests/cluster/slurm shares the machine's one "
            "Slurm and a cluster folder shares one test cluster, so each must stay on one worker "
            "(run: python -m pytest -q -n 2 --dist loadgroup)"
        )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks it adds
def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(TESTS).parts
        tier = parts[0] if parts and parts[0] in TIERS else None
        if tier is None:
            misplaced.append(
                f"{item.nodeid}: not under tests/unit, tests/integration or tests/cluster"
            )
            continue
        item.add_marker(getattr(pytest.mark, tier))
        item.add_marker(pytest.mark.xdist_group(name=xdist_group(parts)))
        if "cluster" in getattr(item, "fixturenames", ()) and tier != "cluster":
            misplaced.append(
                f"{item.nodeid}: uses the cluster fixture; it belongs in tests/cluster"
            )
    if misplaced:
        raise pytest.UsageError("tests outside their tier:\n  " + "\n  ".join(misplaced))


def pytest_sessionfinish(session, exitstatus):
    """A test that made torch build a C++ extension depends on a compiler and on a build that
    can be killed half-way, leaving a lock every later build waits on: the run fails, naming
    what was built."""
    if not _EXTENSIONS:
        return
    try:
        built = sorted(os.listdir(_EXTENSIONS[0]))
    except FileNotFoundError:  # removed under the run: nothing of it can be judged
        return
    if built:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            f"C++ extensions were built during the tests ({', '.join(built)} in "
            f"{_EXTENSIONS[0]}): a comparison with DeepSpeed must not build its ops "
            "(tests/fixtures/deepspeed/no_jit.py)"
        )
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        else:
            print(f"ERROR: {message}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    if _EXTENSIONS:
        shutil.rmtree(_EXTENSIONS.pop(), ignore_errors=True)


def pytest_collection_finish(session):
    """Under `-n N` each worker's own torch ops use one thread, as a rank's do: the workers
    share the cores, and torch's default (a thread per core) in each would oversubscribe them.
    Collection has imported torch wherever a test module uses it."""
    torch = sys.modules.get("torch")
    if os.environ.get("PYTEST_XDIST_WORKER") and torch is not None:
        torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def runs_in_a_temporary_directory(tmp_path_factory):
    """Runs the tests start (without --log-dir) and the per-user index of runs go to a
    temporary directory, not the user's ./zlaunch_runs and ~/.local/state."""
    root = tmp_path_factory.mktemp("zlaunch-state")
    saved = {name: os.environ.get(name) for name in ("ZLAUNCH_LOG_DIR", "XDG_STATE_HOME")}
    os.environ["ZLAUNCH_LOG_DIR"] = str(root / "zlaunch_runs")
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    yield root
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def cluster():
    """A 3-host cluster (node1..node3), one per test session; see ``tests/cluster``.

    Skips where the machine cannot host it (not root, no sshd/ip/unshare); any other bring-up
    failure is an error, not a skip, so CI (root) always runs cluster tests.
    """
    from tests.cluster import Cluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    c = Cluster.start(n=3)
    try:
        yield c
    finally:
        c.close()
