"""Following and inspecting a 6-rank job on the test cluster (3 hosts x 2 slots) from a second
process, through the run directory only: ``zlaunch logs --follow`` and ``zlaunch status``.

Timings measured here are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.launcher import helpers

pytestmark = pytest.mark.cluster

idle_cluster = helpers.idle_cluster  # autouse: no process left on any host

TICKER = str(Path(__file__).resolve().parents[2] / "integration" / "commands" / "ticker.py")
WORLD = 6
LINE = re.compile(r"^\[(node\d):(\d+)\] rank=(\d+) seq=(\d+) t=([\d.]+)$")


def zlaunch(*args: str) -> list[str]:
    return [sys.executable, "-m", "zlaunch", *args]


def start_job(cluster, runs: Path, *ticker_args: str) -> subprocess.Popen:
    argv = zlaunch(
        "--hostfile", cluster.hostfile(2), "--ssh-config", cluster.ssh_config,
        "--log-dir", str(runs), TICKER, *ticker_args,
    )  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(predicate, timeout: float, what: str, job: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if job is not None and job.poll() is not None:
            raise AssertionError(
                f"zlaunch ended early while waiting for {what}: "
                + (job.stderr.read() if job.stderr else "its output went to a file")
            )
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_logs_follow_rank3_prints_its_lines_within_half_a_second_and_exits(
    cluster, procs, tmp_path
):
    runs = tmp_path / "runs"
    go = tmp_path / "go"
    job = start_job(cluster, runs, "--count", "30", "--interval", "0.1", "--go-file", str(go))
    procs.append(job)
    wait_for(lambda: (runs / "latest" / "run.json").exists(), 30, "the run directory", job)
    follower = subprocess.Popen(
        zlaunch("logs", "--log-dir", str(runs), "--follow", "--rank", "3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    procs.append(follower)
    arrivals: list[tuple[float, str]] = []

    def read() -> None:
        for raw in follower.stdout:
            arrivals.append((time.time(), raw.decode().rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # Every rank printed its first line and waits: once the follower shows rank 3's, it is
    # live, and every later line is printed while it follows.
    wait_for(lambda: arrivals, 60, "the follower's first line", job)
    go.touch()
    code = job.wait(timeout=90)
    job_ended = time.monotonic()
    assert code == 0, job.stderr.read().decode()
    follower.wait(timeout=10)
    exit_delay = time.monotonic() - job_ended
    reader.join(timeout=5)
    assert follower.returncode == 0, follower.stderr.read().decode()

    lines = [text for _, text in arrivals]
    parsed = [LINE.match(text) for text in lines]
    assert all(parsed), [t for t, m in zip(lines, parsed, strict=True) if not m][:5]
    # Only rank 3 (node2, the second slot), every one of its 40 lines, in order.
    assert {(m.group(1), m.group(2), m.group(3)) for m in parsed} == {("node2", "3", "3")}
    assert [int(m.group(4)) for m in parsed] == list(range(30))
    delays = [arrived - float(m.group(5)) for (arrived, _), m in zip(arrivals, parsed, strict=True)]
    live = delays[1:]
    print(
        f"\nlogs --follow latency over {len(live)} lines: median {statistics.median(live):.3f}s, "
        f"max {max(live):.3f}s; follower exited {exit_delay:.2f}s after the job"
    )
    assert max(live) < 0.5, sorted(live)[-5:]
    assert exit_delay < 3.0


def test_status_after_one_rank_is_killed_shows_every_rank_final_state(cluster, procs, tmp_path):
    runs = tmp_path / "runs"
    job = start_job(cluster, runs, "--count", "4", "--interval", "0.05", "--hang")
    procs.append(job)
    ranks_file = runs / "latest" / "ranks.json"

    def all_running():
        data = read_json(ranks_file)
        rows = (data or {}).get("ranks", [])
        return rows if len(rows) == WORLD and all(r["state"] == "running" for r in rows) else None

    rows = wait_for(all_running, 60, "every rank running", job)
    status = subprocess.run(
        zlaunch("status", "--log-dir", str(runs), "--no-color"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert status.returncode == 0, status.stderr
    assert status.stdout.count(" alive ") == WORLD, status.stdout
    victim = next(r for r in rows if r["rank"] == 3)
    os.kill(victim["pid"], signal.SIGKILL)
    code = job.wait(timeout=60)
    assert code == 128 + signal.SIGKILL

    result = subprocess.run(
        zlaunch("status", "--log-dir", str(runs), "--json"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "failed" and report["exit_code"] == 137
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert sorted(by_rank) == list(range(WORLD))
    assert by_rank[3]["state"] == "exited"
    assert (by_rank[3]["exit_code"], by_rank[3]["signal_name"]) == (137, "SIGKILL")
    assert (by_rank[3]["host"], by_rank[3]["pid"]) == ("node2", victim["pid"])
    for rank in set(range(WORLD)) - {3}:
        # Stopped by zlaunch: TERM to their process groups (python dies of SIGTERM).
        assert by_rank[rank]["state"] == "exited", by_rank[rank]
        assert (by_rank[rank]["exit_code"], by_rank[rank]["signal_name"]) == (143, "SIGTERM")
        assert by_rank[rank]["host"] == f"node{rank // 2 + 1}"
    assert report["root_cause"]["rank"] == 3

    table = subprocess.run(
        zlaunch("status", "--log-dir", str(runs), "--no-color"),
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    print("\n" + table)
    rank_lines = {
        int(m.group(2)): m.group(3)
        for m in re.finditer(
            r"^(node\d)\s+(\d+)\s+\d+\s+\d+\s+(.+?)\s+-\s+(?:\d+s ago|-)$", table, re.M
        )
    }
    assert rank_lines[3] == "killed by SIGKILL (exit 137)"
    assert all(rank_lines[r] == "killed by SIGTERM (exit 143)" for r in range(WORLD) if r != 3)
    assert "cause    rank 3 on node2: killed by SIGKILL" in table


def test_stacks_name_the_one_stuck_rank_among_six_on_three_hosts(cluster, procs, tmp_path):
    """Rank 3 (node2) sleeps where the others wait for its gradients: `zlaunch stacks` shows
    two groups, and asking does not disturb the job."""
    runs = tmp_path / "runs"
    stuck = str(Path(__file__).resolve().parents[2] / "integration" / "commands" / "stuck.py")
    argv = zlaunch(
        "--hostfile", cluster.hostfile(2), "--ssh-config", cluster.ssh_config,
        "--log-dir", str(runs), stuck, "--stuck-rank", "3",
    )  # fmt: skip
    # Output to a file: every dump is also printed on the console, and an unread pipe would
    # fill up and stall the controller.
    with open(tmp_path / "console.txt", "wb") as console:
        job = subprocess.Popen(argv, stdout=console, stderr=subprocess.STDOUT)
    procs.append(job)
    ranks_file = runs / "latest" / "ranks.json"

    def all_ready():
        rows = (read_json(ranks_file) or {}).get("ranks", [])
        return rows if len(rows) == WORLD and all(r.get("stacks") for r in rows) else None

    rows = wait_for(all_ready, 90, "every rank ready for stack dumps", job)
    # Ask once every rank is past start-up: CPython 3.11's faulthandler can crash a process
    # whose threads start or end while it dumps them (a stuck job is asked, not a starting one).
    wait_for(
        lambda: all(
            f"rank {r} initialized" in (tmp_path / "console.txt").read_text() for r in range(WORLD)
        ),
        90,
        "every rank initialized",
        job,
    )

    def two_groups():
        out = subprocess.run(
            zlaunch("stacks", "--log-dir", str(runs)), capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stdout + out.stderr
        text = out.stdout
        waiting, alone = "ranks 0-2,4-5 (node1, node2, node3):", "rank 3 (node2):"
        if waiting not in text or alone not in text:
            return None
        # both groups settled: the five in backward, rank 3 in its "data loader"
        settled = " in backward" in text[text.index(waiting) : text.index(alone)]
        return text if settled and " in wait_for_data" in text[text.index(alone) :] else None

    started = time.monotonic()
    text = wait_for(two_groups, 90, "ranks 0-2,4-5 waiting on rank 3", job)
    print(f"\n[measure] stuck rank found after {time.monotonic() - started:.2f}s:\n{text}")
    waiting = text[text.index("ranks 0-2,4-5") : text.index("rank 3 (node2):")]
    alone = text[text.index("rank 3 (node2):") :]
    assert "6 rank(s), 2 distinct stacks" in text
    assert " in backward" in waiting and " in wait_for_data" in alone

    def suspect():  # the collective records from three agents name rank 3 on node2
        out = subprocess.run(
            zlaunch("stacks", "--log-dir", str(runs), "--json"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        root = json.loads(out.stdout)["root_cause"] if out.stdout.strip() else {}
        return root if root.get("rank") == 3 else None

    root = wait_for(suspect, 60, "zlaunch stacks --json naming rank 3", job)
    assert root["host"] == "node2" and "rank 3 on node2 not in a collective" in root["message"]
    waiting_records = root["hang"]["collective_groups"][0]
    assert waiting_records["ranks"] == [0, 1, 2, 4, 5]
    assert waiting_records["records"][-1]["state"] == "issued"
    assert job.poll() is None  # still running: the dumps are not fatal
    assert sorted(h for h, p in ((h, cluster.pids(h)) for h in cluster.hosts) if p) == cluster.hosts
    assert all(r["state"] == "running" for r in (read_json(ranks_file) or {})["ranks"])
    assert len(rows) == WORLD
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=60) == 128 + signal.SIGTERM
