"""Identical lines of many ranks collapsed on the console, through the real `zlaunch` command
on localhost: 16 ranks of a torch-free script print the same warning; the
console shows rank 0's at once and the other fifteen as one ``[ranks 1-15]`` line, every rank
log keeps its own, and ``--no-collapse`` shows sixteen lines as before.
"""

from __future__ import annotations

import os
import subprocess
import sys

WARNING = "UserWarning: the same words from every rank"
RANKS = 16

# Every rank says the warning once all sixteen have started (a barrier of files), so the
# lines come close together even on a loaded machine; then a line of its own, then one line
# every rank says again (held after the ranks' own lines: they still fold into it).
SCRIPT = f"""
import os, sys, time
here = sys.argv[1]
rank = int(os.environ["RANK"])
open(os.path.join(here, f"up-{{rank}}"), "w").close()
deadline = time.monotonic() + 60
while sum(name.startswith("up-") for name in os.listdir(here)) < {RANKS}:
    assert time.monotonic() < deadline, "not every rank started"
    time.sleep(0.01)
print({WARNING!r}, file=sys.stderr, flush=True)
print(f"rank {{rank}} done", flush=True)
print("all done", flush=True)
"""


def launch(tmp_path, *options: str) -> subprocess.CompletedProcess:
    here = tmp_path / "barrier"
    here.mkdir()
    script = tmp_path / "warn.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", "--num-gpus", str(RANKS), "--log-dir", "runs"]
        + [*options, str(script), str(here)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "ZLAUNCH_LIVE": "0"},
        timeout=180,
    )


def rank_logs(tmp_path) -> dict[int, str]:
    logs = (tmp_path / "runs" / "latest").glob("attempt-0/*/rank-*.log")
    return {int(p.stem.split("-")[1]): p.read_text() for p in logs}


def test_sixteen_ranks_saying_the_same_warning_show_it_once_for_ranks_1_to_15(tmp_path):
    done = launch(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # rank 0's line and the fifteen others' as one; in either order (rank 0 may be the last to
    # be scheduled on a loaded machine, after the other fifteen's line was shown)
    said = sorted(line for line in done.stdout.splitlines() if WARNING in line)
    assert said == [f"[localhost:0]! {WARNING}", f"[ranks 1-15]! {WARNING}"], done.stdout
    # lines only one rank said print as before, with their host and rank, before "all done"
    lines = done.stdout.splitlines()
    assert sorted(line for line in lines if "all done" in line) == [
        "[localhost:0] all done",
        "[ranks 1-15] all done",
    ], done.stdout
    for rank in range(RANKS):
        own = lines.index(f"[localhost:{rank}] rank {rank} done")
        after = "[localhost:0] all done" if rank == 0 else "[ranks 1-15] all done"
        assert own < lines.index(after), done.stdout
    logs = rank_logs(tmp_path)
    assert sorted(logs) == list(range(RANKS))
    for rank, text in logs.items():  # the rank logs keep every line
        assert text.splitlines() == [WARNING, f"rank {rank} done", "all done"], (rank, text)


def test_no_collapse_shows_every_rank_s_line(tmp_path):
    done = launch(tmp_path, "--no-collapse")
    assert done.returncode == 0, done.stderr[-3000:]
    said = sorted(line for line in done.stdout.splitlines() if WARNING in line)
    assert said == sorted(f"[localhost:{r}]! {WARNING}" for r in range(RANKS)), done.stdout
