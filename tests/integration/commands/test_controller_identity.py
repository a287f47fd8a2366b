"""`zlaunch stop` and `zlaunch stacks` signal a run's controller only once it
is proven to be it: it holds the run's lock and has the start time and boot recorded at start.
A pid reused by another program, or a crafted run.json, is refused and the process untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.integration.commands.hostile_input import zlaunch
from tests.integration.launcher.helpers import alive
from zlaunch.commands.runs_common import controller_alive
from zlaunch.rundir.layout import RunDir, process_identity


@pytest.fixture
def victim():
    """An unrelated process whose command line even says "zlaunch"."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "zlaunch"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


def _crafted_run(tmp_path, pid: int, identity: dict | None) -> None:
    run = tmp_path / "runs" / "20261130-000000-abcdef"
    run.mkdir(parents=True)
    record = {
        "run_id": run.name,
        "status": "running",
        "controller_pid": pid,
        "controller": identity,
        "start_time": time.time(),
        "end_time": None,
        "exit_code": None,
    }
    (run / "run.json").write_text(json.dumps(record))
    rank = {"rank": 0, "host": "localhost", "state": "running", "stacks": True}
    (run / "ranks.json").write_text(json.dumps({"attempt": 0, "ranks": [rank]}))


@pytest.mark.parametrize("command", ["stop", "stacks"])
@pytest.mark.parametrize("forged", [False, True])
def test_a_crafted_run_never_gets_an_unrelated_process_signalled(tmp_path, victim, command, forged):
    # forged: the identity copied from /proc, as anyone can; without the lock it is refused.
    identity = process_identity(victim.pid) if forged else None
    _crafted_run(tmp_path, victim.pid, identity)
    result = zlaunch(tmp_path, command, "--log-dir", "runs", "--timeout", "1", timeout=60)
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "is not running on this machine" in err and "Traceback" not in err
    time.sleep(0.3)
    assert alive(victim.pid) and victim.poll() is None


def test_a_reused_pid_does_not_match_the_recorded_identity(victim):
    identity = dict(process_identity(victim.pid), start_ticks=1)  # an earlier process
    assert not controller_alive({"controller_pid": victim.pid, "controller": identity})
    assert controller_alive(
        {"controller_pid": victim.pid, "controller": process_identity(victim.pid)}
    )


def test_the_controller_holds_the_run_lock(tmp_path):
    run = RunDir.create(str(tmp_path), "r1", {})
    # Another process sees this one as the holder. (Not asked from here: closing any
    # descriptor of the file would drop this process's POSIX lock.)
    code = (
        "import sys; from zlaunch.rundir.layout import lock_holder; print(lock_holder(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, run.path], capture_output=True, text=True, check=True
    )
    assert int(out.stdout) == os.getpid()
    assert controller_alive(run.record())
