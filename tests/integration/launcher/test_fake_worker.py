"""The fake worker does exactly what its flags say (it is the yardstick of the launcher tests)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.integration.launcher import fake_worker

WORKER = fake_worker.__file__


def start(tmp_path, *flags, rank=0, env=None, **kwargs):
    full_env = {**os.environ, "RANK": str(rank), "FAKE_WORKER_MARK": "m-42", **(env or {})}
    return subprocess.Popen(
        [sys.executable, WORKER, "--record-dir", str(tmp_path), *flags],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def run(tmp_path, *flags, rank=0, timeout=30, **kwargs):
    proc = start(tmp_path, *flags, rank=rank, **kwargs)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def record(tmp_path, rank=0):
    with open(fake_worker.record_path(str(tmp_path), rank)) as f:
        return json.load(f)


def wait_for_record(tmp_path, rank=0, timeout=20.0):
    path = fake_worker.record_path(str(tmp_path), rank)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"no record {path}"
        time.sleep(0.02)
    return record(tmp_path, rank)


def test_record_holds_env_identity_and_args(tmp_path):
    proc = start(tmp_path, "--local_rank=3", rank=5, cwd=str(tmp_path))
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    rec = record(tmp_path, 5)
    assert rec["rank"] == "5"
    assert rec["env"]["RANK"] == "5"
    assert rec["env"]["FAKE_WORKER_MARK"] == "m-42"
    assert rec["pid"] == proc.pid
    assert rec["pgid"] == proc.pid == rec["sid"]  # started in its own session
    assert rec["ppid"] == os.getpid()
    assert rec["hostname"] == socket.gethostname()
    assert rec["cwd"] == str(tmp_path)
    assert rec["argv"][0] == WORKER
    assert rec["extra_args"] == ["--local_rank=3"]
    assert rec["allreduce"] is None
    # Written atomically: nothing but the record is left in the directory.
    assert sorted(os.listdir(tmp_path)) == ["rank-5.json"]


@pytest.mark.parametrize("code", [0, 3, 77])
def test_exit_code(tmp_path, code):
    rc, _, _ = run(tmp_path, "--exit", str(code))
    assert rc == code
    assert record(tmp_path)["rank"] == "0"


@pytest.mark.parametrize("name,signum", [("SIGKILL", 9), ("TERM", 15), ("SIGSEGV", 11), ("6", 6)])
def test_signal_kills_itself(tmp_path, name, signum):
    rc, _, _ = run(tmp_path, "--signal", name)
    assert rc == -signum


def test_hang_until_sigterm(tmp_path):
    proc = start(tmp_path, "--hang")
    wait_for_record(tmp_path)
    time.sleep(0.3)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGTERM


def test_ignore_sigterm_survives_until_sigkill(tmp_path):
    proc = start(tmp_path, "--hang", "--ignore-sigterm")
    wait_for_record(tmp_path)  # SIGTERM is ignored from then on
    proc.send_signal(signal.SIGTERM)
    marker = tmp_path / "rank-0.sigterm"
    deadline = time.monotonic() + 10
    while not marker.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)
    assert proc.poll() is None
    proc.kill()
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert marker.read_text().startswith("SIGTERM at ")
    assert "rank=0 ignoring SIGTERM" in err


def test_lines_are_numbered_split_and_intact(tmp_path):
    n = 5001
    rc, out, err = run(tmp_path, "--lines", str(n), rank=2)
    assert rc == 0
    assert out.splitlines() == [fake_worker.line(2, s) for s in range(0, n, 2)]
    assert err.splitlines() == [fake_worker.line(2, s) for s in range(1, n, 2)]
    assert fake_worker.line(2, 7).startswith("rank=2 seq=000007 stream=err ")


@pytest.mark.parametrize("others,expect_hang", [("exit0", False), ("hang", True)])
def test_only_rank_applies_mode_to_one_rank(tmp_path, others, expect_hang):
    flags = ("--exit", "7", "--only-rank", "1", "--others", others)
    assert run(tmp_path, *flags, rank=1)[0] == 7
    proc = start(tmp_path, *flags, rank=0)
    if expect_hang:
        wait_for_record(tmp_path, 0)
        time.sleep(0.5)
        assert proc.poll() is None
        proc.kill()
        proc.communicate(timeout=10)
    else:
        proc.communicate(timeout=30)
        assert proc.returncode == 0


def test_delay_comes_before_the_mode(tmp_path):
    t0 = time.monotonic()
    rc, _, _ = run(tmp_path, "--delay", "0.6", "--exit", "4")
    assert rc == 4
    assert time.monotonic() - t0 >= 0.6
    # The record is written before the delay, so a test can see a worker that is waiting.
    assert record(tmp_path)["started_at"] < time.time() - 0.5


def test_unknown_signal_is_a_clear_error(tmp_path):
    rc, _, err = run(tmp_path, "--signal", "NOPE")
    assert rc == 1
    assert "unknown signal 'SIGNOPE'" in err


@pytest.mark.multirank
def test_allreduce_over_gloo(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [start(tmp_path, "--allreduce", rank=r, env=env) for r in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert [record(tmp_path, r)["allreduce"] for r in range(2)] == [3, 3]


def test_other_ranks_hang_ignoring_sigterm(tmp_path):
    proc = start(
        tmp_path, "--exit", "3", "--only-rank", "1", "--others", "hang", "--ignore-sigterm"
    )
    wait_for_record(tmp_path, 0)
    proc.send_signal(signal.SIGTERM)
    marker = tmp_path / "rank-0.sigterm"
    deadline = time.monotonic() + 10
    while not marker.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert proc.poll() is None
    proc.kill()
    proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL


def test_launcher_flags_are_recorded_not_mistaken_for_ours(tmp_path):
    rc, _, _ = run(tmp_path, "--li", "--local_rank=0", "--exit", "5")
    assert rc == 5
    assert record(tmp_path)["extra_args"] == ["--li", "--local_rank=0"]
