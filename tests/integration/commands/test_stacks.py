"""`zlaunch stacks` on this machine: parsing real faulthandler dumps, and a live local job.

The multi-host case (6 ranks, one stuck) is in test_cluster_visibility.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.commands.helpers import ranks_state, wait_for, zlaunch
from zlaunch.text.stack_dumps import group_ranks, parse_dump

STUCK = str(Path(__file__).with_name("stuck.py"))

DUMPER = """
import faulthandler, os, signal, sys, threading, time
faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
def helper_loop():
    time.sleep(30)
threading.Thread(target=helper_loop, daemon=True).start()
time.sleep(0.2)
def {name}():
    print("ordinary output", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)
{name}()
"""


def real_dump(function: str) -> str:
    """What faulthandler writes when a process with a helper thread is asked in ``function``."""
    out = subprocess.run(
        [sys.executable, "-c", DUMPER.format(name=function)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_parse_dump_keeps_the_stacks_and_drops_other_lines_and_thread_ids():
    dump = parse_dump(real_dump("in_step"))
    assert dump is not None
    (main_kind, main_frames), (other_kind, other_frames) = dump
    assert main_kind == "main" and main_frames[0].endswith(" in in_step")
    assert main_frames[-1].endswith(" in <module>")
    assert other_kind == "thread" and any(f.endswith(" in helper_loop") for f in other_frames)
    assert not any("ordinary output" in f or "0x" in f for _, fs in dump for f in fs)
    assert parse_dump("just a log line\n") is None


def test_group_ranks_puts_identical_stacks_together_largest_group_first():
    a, b = parse_dump(real_dump("in_step")), parse_dump(real_dump("in_loader"))
    assert a != b and a == parse_dump(real_dump("in_step"))  # thread ids do not matter
    groups = group_ranks({0: a, 1: a, 2: b, 3: a})
    assert groups == [([0, 1, 3], a), ([2], b)]


def start(runs: Path, *argv: str) -> subprocess.Popen:
    # Console output to a file: the dumps are printed there too, and an unread pipe would
    # fill up and stall the controller.
    runs.mkdir(parents=True, exist_ok=True)
    with open(runs / "console.txt", "wb") as console:
        return subprocess.Popen(
            [sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--log-dir", str(runs), *argv],
            stdout=console,
            stderr=subprocess.STDOUT,
        )


def test_stacks_of_a_local_job_show_who_is_stuck_and_leave_it_running(tmp_path):
    runs = tmp_path / "runs"
    job = start(runs, STUCK, "--stuck-rank", "1", "--chatter")
    try:
        rows = wait_for(
            lambda: (r := ranks_state(runs)) and len(r) == 2 and all(x["stacks"] for x in r) and r,
            60,
            "both ranks ready for stack dumps",
        )
        # Ask only once both ranks are past start-up (initialized, the chatter thread started):
        # CPython 3.11's faulthandler can crash a process whose threads start or end while it
        # dumps them, and a job is asked for stacks because it is stuck, not while it starts.
        wait_for(
            lambda: all(
                line in (runs / "console.txt").read_text()
                for line in ("rank 0 initialized", "rank 1 initialized", "still here")
            ),
            60,
            "both ranks initialized",
        )

        def sections() -> tuple[str, str, str] | None:
            """(output, rank 0's part, rank 1's part); None while both share one stack."""
            out = zlaunch("stacks", "--log-dir", str(runs))
            assert out.returncode == 0, out.stdout + out.stderr
            text = out.stdout
            at0, at1 = text.find("rank 0 (localhost):"), text.find("rank 1 (localhost):")
            if at0 < 0 or at1 < 0:
                return None
            return text, text[at0:at1] if at0 < at1 else text[at0:], text[at1:]

        # The ranks still start up for a moment; ask until rank 0 waits in backward for
        # rank 1, which sits in wait_for_data (and rank 0's records, written every half
        # second, say it waits).
        text, rank0, rank1 = wait_for(
            lambda: (
                (t := sections())
                and " in backward" in t[1]
                and " in wait_for_data" in t[2]
                and "waiting" in t[0]
                and t
            ),
            60,
            "rank 0 in backward, rank 1 in wait_for_data",
        )
        assert "2 rank(s), 2 distinct stacks" in text, text
        assert " in backward" in rank0 and "wait_for_data" not in rank0, text
        assert " in wait_for_data" in rank1 and " in backward" not in rank1, text
        # its second thread, printing all along, is shown too
        assert "other thread:" in rank1 and " in chatter" in rank1, text
        # the collective records say whom rank 0 waits for
        assert "all_reduce #2 group 0 [[32]] waiting" in text, text
        assert "suspect: rank 1 on localhost not in a collective" in text, text
        out = zlaunch("stacks", "--log-dir", str(runs), "--json")
        root = json.loads(out.stdout)["root_cause"]  # as failure.json holds it
        assert (root["rank"], root["host"], root["pid"]) == (1, "localhost", rows[1]["pid"])
        waiting = root["hang"]["collective_groups"][0]
        assert waiting["ranks"] == [0] and waiting["records"][-1]["state"] == "issued"
        assert [g["ranks"] for g in root["hang"]["stack_groups"]] == [[0], [1]]
        # Asking did not hurt: both ranks still run.
        assert job.poll() is None
        assert all(os.path.exists(f"/proc/{r['pid']}") for r in rows)
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
    # The job's own console says a dump was asked for instead of showing crash-like lines;
    # the rank logs keep the dumps.
    console = (runs / "console.txt").read_text()
    assert "by `zlaunch stacks` (not a crash;" in console
    assert "Thread 0x" not in console and 'File "' not in console, console
    assert "still here" in console  # the rank's other output still shows
    logs = "".join(p.read_text() for p in (runs / "latest").glob("attempt-0/*/rank-*.log"))
    assert "(most recent call first)" in logs and " in wait_for_data" in logs


def test_stacks_of_a_plain_python_script_without_the_runtime(tmp_path):
    """zlaunch.worker.boot arms faulthandler before any script: no runtime needed."""
    script = tmp_path / "plain.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(3600)\n")
    runs = tmp_path / "runs"
    job = start(runs, str(script))
    try:
        rows = wait_for(
            lambda: (r := ranks_state(runs)) and len(r) == 2 and all(x["stacks"] for x in r) and r,
            30,
            "both ranks ready for stack dumps",
        )
        out = zlaunch("stacks", "--log-dir", str(runs))
        assert out.returncode == 0, out.stderr
        assert "2 rank(s), 1 distinct stack" in out.stdout, out.stdout
        assert f'File "{script}", line 3 in <module>' in out.stdout, out.stdout
        assert "zlaunch/worker/boot.py" not in out.stdout and "runpy" not in out.stdout, out.stdout
        assert job.poll() is None and all(os.path.exists(f"/proc/{r['pid']}") for r in rows)
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)


def test_stacks_refuses_when_no_rank_listens_and_signals_nobody(tmp_path):
    runs = tmp_path / "runs"
    job = start(runs, "--no-python", "sleep", "3600")  # not Python: nothing to ask
    try:
        rows = wait_for(
            lambda: (r := ranks_state(runs)) and all(x["state"] == "running" for x in r) and r,
            30,
            "both ranks running",
        )
        out = zlaunch("stacks", "--log-dir", str(runs))
        assert out.returncode == 1
        assert "no running rank can dump its stacks" in out.stderr
        assert "--no-python" in out.stderr
        time.sleep(0.3)
        assert job.poll() is None and all(os.path.exists(f"/proc/{r['pid']}") for r in rows)
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
