"""`zlaunch stacks` at 16 ranks: the worker's stacks thread beside faulthandler, side by side.

Two local jobs of 16 ranks run the same script (a main thread in a loop of short sleeps and two
helper threads, one of them starting and ending threads all the time, as data loaders and
collectives' threads do); each is asked for its stacks ``--rounds`` times, alternating between
the jobs, and the wall time of every ``zlaunch stacks`` (signal to every rank, every dump in the
rank logs, grouped) is recorded. One job arms the stacks thread (the default), the other
faulthandler (``ZLAUNCH_STACKS_DUMPER=faulthandler``). Reported: the median time of each, their
ratio (thread / faulthandler), and how many ranks each job lost (faulthandler's dump of a
thread that starts or ends under it can crash a rank).

    python benchmarks/stacks_dump.py --ranks 16 --rounds 10 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = """
import threading, time
def churn():
    while True:
        t = threading.Thread(target=sum, args=(range(100),))
        t.start()
        t.join()
        time.sleep(0.02)
def idle():
    while True:
        time.sleep(0.5)
threading.Thread(target=churn, daemon=True).start()
threading.Thread(target=idle, daemon=True).start()
while True:
    time.sleep(0.2)
"""


def _zlaunch(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zlaunch", *args], env=env, **kw)


def _ready(runs: Path, ranks: int) -> bool:
    try:
        rows = json.loads((runs / "latest" / "ranks.json").read_text())["ranks"]
    except (OSError, ValueError, KeyError):
        return False
    return len(rows) == ranks and all(r.get("stacks") for r in rows)


def _alive(runs: Path) -> int:
    rows = json.loads((runs / "latest" / "ranks.json").read_text())["ranks"]
    return sum(1 for r in rows if r.get("state") == "running")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stacks-bench-"))
    script = work / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    jobs, runs = {}, {}
    for mode in ("thread", "faulthandler"):
        runs[mode] = work / mode
        runs[mode].mkdir()
        extra = ["--env", "ZLAUNCH_STACKS_DUMPER=faulthandler"] if mode == "faulthandler" else []
        with open(runs[mode] / "console.txt", "wb") as console:
            jobs[mode] = _zlaunch(
                "--num-gpus", str(args.ranks), "--log-dir", str(runs[mode]), *extra, str(script),
                env=env, stdout=console, stderr=subprocess.STDOUT,
            )  # fmt: skip
    times: dict[str, list[float]] = {"thread": [], "faulthandler": []}
    try:
        deadline = time.monotonic() + 120
        while not all(_ready(runs[m], args.ranks) for m in runs):
            if time.monotonic() > deadline:
                raise SystemExit("the jobs did not start within 120 s")
            time.sleep(0.2)
        for _ in range(args.rounds):
            for mode in times:
                if _alive(runs[mode]) < args.ranks:
                    continue  # a rank died: the job is being stopped
                start = time.monotonic()
                done = subprocess.run(
                    [sys.executable, "-m", "zlaunch", "stacks", "--log-dir", str(runs[mode])],
                    env=env, capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                if done.returncode == 0:
                    times[mode].append(time.monotonic() - start)
                time.sleep(0.3)
        lost = {m: args.ranks - _alive(runs[m]) for m in runs}
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)
        for job in jobs.values():
            job.wait(timeout=60)
    medians = {m: statistics.median(t) if t else None for m, t in times.items()}
    ratio = (
        medians["thread"] / medians["faulthandler"]
        if medians["thread"] and medians["faulthandler"]
        else None
    )
    result = {
        "ranks": args.ranks,
        "rounds": args.rounds,
        "seconds": times,
        "median_s": medians,
        "ratio_thread_over_faulthandler": ratio,
        "ranks_lost": lost,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
