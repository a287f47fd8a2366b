"""Ranks leave their process group cleanly at exit (runtime.distributed.teardown).

Without the teardown, a gloo rank that finished its job dies with SIGABRT ("terminate called
without an active exception") during interpreter shutdown in about one two-rank run in five.
The deterministic check: after the runtime's atexit teardown no gloo worker thread is left.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.engine.mp_utils import REPO, free_port, rank_env

pytestmark = pytest.mark.multirank

WORKER = Path(__file__).with_name("exit_worker.py")


def start_ranks(*args: str, world_size: int = 2) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(world_size):
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), *args],
                env=rank_env(rank, world_size, port),
                cwd=str(REPO),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
        return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("stage", [2, 3])
def test_a_finished_rank_leaves_no_backend_thread_behind(stage):
    results = finish(start_ranks("train", str(stage)))
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{out[-3000:]}"
        assert f"rank {rank} trained" in out
        assert "backend threads left: 0" in out, out[-3000:]
        assert "terminate called" not in out


def test_ranks_that_hold_the_group_themselves_still_exit_cleanly():
    # The group outlives the teardown here, so its threads do too; the teardown waits for them
    # to fall idle. Several runs, since the failure it prevents is a race.
    for attempt in range(4):
        results = finish(start_ranks("train", "2", "--hold-group"))
        for rank, (code, out) in enumerate(results):
            assert code == 0, f"run {attempt}, rank {rank} exited {code}:\n{out[-3000:]}"
            assert "terminate called" not in out


def test_a_rank_failing_with_a_collective_in_flight_exits_at_once():
    procs = start_ranks("fail-in-collective")
    try:
        start = time.monotonic()
        out, _ = procs[0].communicate(timeout=60)
        took = time.monotonic() - start
        assert procs[0].returncode == 1, out[-3000:]
        assert "RuntimeError: rank 0 fails with a collective in flight" in out
        assert "terminate called" not in out
        assert procs[1].poll() is None  # its peer still sleeps: rank 0 did not wait for it
        assert took < 30, f"rank 0 took {took:.1f}s to exit"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
