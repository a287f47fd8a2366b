"""A 1,024-rank job started as a new user would: 64 loopback hosts x 16 slots over real SSH
(tests/cluster/scale/farm.py: one sshd of its own on a private port, its own host key,
known_hosts and ssh_config), workers that import no torch (tests/cluster/scale/worker.py), and
nothing on zlaunch's command line but ``--hostfile``, ``--ssh-config`` and ``--grace-period``.
Once on the machine as it is, once with ``--busy N`` processes spinning (``yes > /dev/null``).

Measured per run, from the harness's clock as zlaunch's stderr lines arrive: command -> the
"run ... logs ..." note (every agent's hello is in and the specs go out), command -> the last
rank's first line (its worker writes the time just before), command -> exit; what zlaunch said
while the agents started (progress lines, slow agents); every rank's lines counted on the
console and every rank log compared byte for byte with what its worker printed.

Run as root from the repository root, one heavy run at a time on a shared machine::

    flock /tmp/zlaunch-heavy.lock python benchmarks/first_contact_scale.py \\
        [--hosts 64] [--slots 16] [--lines 100] [--busy 0,2] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks.scale_ssh import RUN_LIMIT, Reaped, _env, _read_times, check_logs  # noqa: E402
from tests.cluster.scale import farm as farm_mod  # noqa: E402
from tests.cluster.scale import worker as worker_mod  # noqa: E402

WORKER = os.path.abspath(worker_mod.__file__)
LINE_BYTES = 100
_TAG = re.compile(rb"^\[([^:\]]+):(\d+)\]")


def _busy(n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True)
        for _ in range(n)
    ]


def one_run(farm, hosts: int, slots: int, lines: int, busy: int, work: str) -> dict:
    world = hosts * slots
    hostfile = farm.hostfile(slots, f"hosts-{hosts}x{slots}", hosts)
    cwd = tempfile.mkdtemp(dir=work, prefix=f"busy{busy}-")
    records = os.path.join(cwd, "records")
    os.mkdir(records)
    argv = [
        sys.executable, "-m", "zlaunch", "--hostfile", hostfile, "--ssh-config",
        farm.ssh_config, "--grace-period", "3", WORKER, "--records", records,
        "--lines", str(lines), "--line-bytes", str(LINE_BYTES),
    ]  # fmt: skip
    env = _env()
    env.pop("ZLAUNCH_LOG_DIR", None)
    notes: list[tuple[float, str]] = []
    per_rank: collections.Counter[int] = collections.Counter()
    spinners = _busy(busy)
    load_before = os.getloadavg()[0]
    try:
        t0 = time.time()
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

        def read_err() -> None:
            for raw in proc.stderr:
                notes.append((time.time() - t0, raw.decode("utf-8", "replace").rstrip()))

        reader = threading.Thread(target=read_err, daemon=True)
        reader.start()
        for raw in proc.stdout:
            match = _TAG.match(raw)
            if match:
                per_rank[int(match.group(2))] += 1
        reaped = Reaped(proc)
        deadline = time.monotonic() + RUN_LIMIT
        while reaped.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.02)
        took = time.time() - t0
        reader.join(5)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        farm.kill_sessions()
    starts = _read_times(records, "start-")
    specs_at = next((t for t, text in notes if text.startswith("zlaunch: run ")), None)
    result = {
        "busy": busy,
        "load_before": load_before,
        "exit_code": reaped.code,
        "all_hellos_s": specs_at,
        "ranks_started": len(starts),
        "all_started_s": max(starts.values()) - t0 if starts else None,
        "exit_s": took,
        "controller_cpu_s": reaped.cpu,
        "ranks_with_every_line": sum(1 for r in range(world) if per_rank[r] == lines),
        "console_lines": sum(per_rank.values()),
        "progress_lines": [f"{t:.1f}s {x}" for t, x in notes if "answered; starting" in x],
        "slow_notes": [f"{t:.1f}s {x}" for t, x in notes if "slow to start" in x],
        "stderr_tail": [f"{t:.1f}s {x}" for t, x in notes[-12:]],
    }
    runs = os.path.join(cwd, "zlaunch_runs")
    run_dirs = [
        os.path.join(runs, n)
        for n in (os.listdir(runs) if os.path.isdir(runs) else ())
        if os.path.exists(os.path.join(runs, n, "run.json"))
        and not os.path.islink(os.path.join(runs, n))
    ]
    if len(run_dirs) == 1:
        result.update(check_logs(run_dirs[0], world, lines, LINE_BYTES))
    shutil.rmtree(cwd, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument("--busy", default="0,2", help="comma list: spinning processes per run")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="zl-first-contact-")
    results = []
    try:
        with farm_mod.LoopbackFarm.start(args.hosts) as farm:
            for busy in (int(x) for x in args.busy.split(",")):
                result = one_run(farm, args.hosts, args.slots, args.lines, busy, work)
                print(json.dumps(result, indent=1), flush=True)
                results.append(result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hosts": args.hosts, "slots": args.slots, "lines": args.lines,
                       "runs": results}, f, indent=1)  # fmt: skip
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
