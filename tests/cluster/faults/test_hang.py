"""The hang watchdog through the real ``zlaunch``: a rank that stops making progress is
reported with every rank's stacks, the job is stopped (exit 124) and no process is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.launcher.helpers import alive, seconds_until

REPO = Path(__file__).resolve().parents[3]
WORKER = "tests/cluster/faults/hang_worker.py"

pytestmark = pytest.mark.multirank


def run_hanging_job(
    tmp_path: Path, mode: str, *extra: str, ranks: int = 2
) -> tuple[subprocess.CompletedProcess, dict, list[int]]:
    pids = tmp_path / "pids"
    pids.mkdir()
    runs = tmp_path / "runs"
    scratch = tmp_path / "tmp"  # the agent's files of collective records go here
    scratch.mkdir()
    env = dict(
        os.environ,
        HANG_PIDS=str(pids),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
        TMPDIR=str(scratch),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zlaunch",
            "--num-gpus",
            str(ranks),
            "--log-dir",
            str(runs),
            "--hang-timeout",
            "4",
            "--grace-period",
            "1",
            *extra,
            WORKER,
            mode,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (run,) = [p for p in runs.iterdir() if p.is_dir() and not p.is_symlink()]
    failure = json.loads((run / "failure.json").read_text())
    worker_pids = [int(p.read_text()) for p in sorted(pids.iterdir())]
    assert list(scratch.glob("zlaunch-*")) == []  # the agent removed the records it kept
    return proc, failure, worker_pids


def _stopped_soon_after_the_last_step(tmp_path: Path, timeout: float = 4.0) -> None:
    """The job ended within the hang timeout, the stacks wait (5 s), the grace (1 s) and a few
    seconds of slack after the last step boundary any rank reported."""
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and not p.is_symlink()]
    last_step = max(json.loads(line)["time"] for line in (run / "metrics.jsonl").open())
    ended = json.loads((run / "run.json").read_text())["end_time"]
    assert timeout <= ended - last_step <= timeout + 5 + 1 + 4, ended - last_step


def _last_collectives(hang: dict) -> dict[int, tuple[str, int, str]]:
    """Rank -> (operation, sequence number, state) of its last collective in the report."""
    return {
        rank: (g["records"][-1]["op"], g["records"][-1]["seq"], g["records"][-1]["state"])
        for g in hang["collective_groups"]
        for rank in g["ranks"]
    }


def _main_frames(group: dict) -> str:
    return "\n".join(next(t for t in group["threads"] if t["thread"] == "main")["frames"])


def test_sleeping_rank_is_named_with_every_rank_stacks(tmp_path):
    proc, failure, pids = run_hanging_job(tmp_path, "sleep")
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert failure["reason"] == "hang"
    root = failure["root_cause"]
    assert (root["rank"], root["host"], root["pid"]) == (1, "localhost", pids[1])
    assert "rank 1 on localhost not in a collective" in root["message"]
    assert "rank 0 on localhost waits for it in all_reduce #" in root["message"]
    last = _last_collectives(root["hang"])
    assert last[0][0] == "all_reduce" and last[0][2] == "issued"
    assert last[1][2] == "completed" and last[1][1] == last[0][1] - 1
    _stopped_soon_after_the_last_step(tmp_path)
    hang = failure["root_cause"]["hang"]
    groups = {tuple(g["ranks"]): g for g in hang["stack_groups"]}
    assert set(groups) == {(0,), (1,)}, hang
    assert "all_reduce" in _main_frames(groups[(0,)])  # waiting in the collective
    assert "hang_worker.py" in _main_frames(groups[(1,)])  # in the script's sleep
    assert "no rank reached a step boundary" in proc.stderr
    assert "ranks 0 (" in proc.stderr or "ranks 1 (" in proc.stderr  # the groups, printed
    assert seconds_until(lambda: not any(alive(p) for p in pids), 5.0) is not None


def test_stopped_rank_gives_no_stacks_and_is_still_gone(tmp_path):
    proc, failure, pids = run_hanging_job(tmp_path, "stop")
    assert proc.returncode == 124, proc.stderr[-3000:]
    root = failure["root_cause"]
    assert (root["rank"], root["host"], root["pid"]) == (1, "localhost", pids[1])
    assert (
        "rank 1 on localhost did not answer (stopped, or stuck outside Python)" in root["message"]
    )
    assert "rank 0 on localhost waits for it in all_reduce #" in root["message"]
    assert "rank 1 on localhost did not answer" in proc.stderr.splitlines()[-1]  # the last line
    status = subprocess.run(
        [sys.executable, "-m", "zlaunch", "status", "--log-dir", str(tmp_path / "runs")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    cause = next(line for line in status.stdout.splitlines() if line.startswith("cause"))
    assert cause.startswith("cause    rank 1 on localhost: ") and "did not answer" in cause
    hang = failure["root_cause"]["hang"]
    assert hang["no_dump"] == [1]
    assert [g["ranks"] for g in hang["stack_groups"]] == [[0]]
    assert "all_reduce" in _main_frames(hang["stack_groups"][0])
    assert "no stacks from rank(s) 1" in proc.stderr
    assert seconds_until(lambda: not any(alive(p) for p in pids), 5.0) is not None


@pytest.mark.parametrize(
    "mode, rank0_op, others_op",
    [
        ("barrier", "barrier", "all_reduce"),  # if rank == 0: dist.barrier()
        ("skip", "barrier", "all_reduce"),  # rank 0 skips an all_reduce
        ("stage3", "all_gather", "barrier"),  # a ZeRO-3 forward on rank 0 only
    ],
)
def test_a_collective_some_ranks_do_not_call_is_named(tmp_path, mode, rank0_op, others_op):
    """Rank 0 is in one collective while ranks 1 and 2 are in another at the same position of
    the group: said at once, and rank 0 named at the timeout."""
    proc, failure, pids = run_hanging_job(tmp_path, mode, ranks=3)
    assert proc.returncode == 124, proc.stderr[-3000:]
    root = failure["root_cause"]
    assert (root["rank"], root["host"], root["pid"]) == (0, "localhost", pids[0])
    last = _last_collectives(root["hang"])
    seq = last[0][1]
    assert last == {
        0: (rank0_op, seq, "issued"),
        1: (others_op, seq, "issued"),
        2: (others_op, seq, "issued"),
    }
    assert f"rank 0 on localhost in {rank0_op} #{seq}" in root["message"]
    assert f"ranks 1 and 2 on localhost in {others_op} #{seq}" in root["message"]
    # said before the hang timeout, once
    mismatch = [
        i for i, line in enumerate(proc.stderr.splitlines()) if "collective mismatch" in line
    ]
    timeout = [i for i, line in enumerate(proc.stderr.splitlines()) if "no rank reached" in line]
    assert len(mismatch) == 1 and mismatch[0] < timeout[0], proc.stderr[-3000:]
    _stopped_soon_after_the_last_step(tmp_path)
    assert seconds_until(lambda: not any(alive(p) for p in pids), 5.0) is not None


def test_restart_after_a_hang_uses_the_restart_budget(tmp_path):
    proc, failure, _ = run_hanging_job(tmp_path, "sleep", "--max-restarts", "1")
    assert proc.returncode == 124
    assert "restarting all ranks" in proc.stderr
    assert proc.stderr.count("no rank reached a step boundary for") >= 2


def test_collective_timeout_reaches_the_workers(tmp_path):
    """--collective-timeout is the workers' process-group timeout: with the watchdog off, the
    rank waiting for the sleeping one gives up after it (not after torch's 30 minutes)."""
    proc, failure, pids = run_hanging_job(
        tmp_path, "sleep", "--hang-timeout", "0", "--collective-timeout", "3"
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    root = failure["root_cause"]
    assert root["rank"] == 0
    assert any(
        "timed out" in line.lower() or "timeout" in line.lower() for line in root["last_lines"]
    )
    assert seconds_until(lambda: not any(alive(p) for p in pids), 5.0) is not None


def test_timeouts_from_the_environment():
    from runtime.distributed.collective_timeout import (
        DEFAULT_SECONDS,
        CollectiveTimeoutError,
        collective_timeout_seconds,
    )

    assert collective_timeout_seconds({}) == DEFAULT_SECONDS == 1800
    assert collective_timeout_seconds({"DEEPSPEED_TIMEOUT": "5"}) == 300  # minutes, as DeepSpeed
    both = {"DEEPSPEED_TIMEOUT": "5", "ZLAUNCH_COLLECTIVE_TIMEOUT": "42"}
    assert collective_timeout_seconds(both) == 42  # zlaunch's option wins
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(CollectiveTimeoutError, match="DEEPSPEED_TIMEOUT"):
            collective_timeout_seconds({"DEEPSPEED_TIMEOUT": bad})


@pytest.mark.parametrize(
    "args, message",
    [
        (["--hang-timeout", "nan"], "--hang-timeout must be"),
        (["--hang-timeout", "-1"], "--hang-timeout must be"),
        (["--collective-timeout", "0"], "--collective-timeout must be"),
    ],
)
def test_bad_timeouts_exit_2(tmp_path, args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--log-dir", str(tmp_path), *args, WORKER, "sleep"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
