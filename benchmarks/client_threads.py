"""A nanoGPT-shaped DDP script (tests/integration/clients/tiny_gpt_ddp.py) under torchrun and zlaunch, side by
side: per-step losses (bit for bit) and step time, with zlaunch's thread default and without it.

    python benchmarks/client_threads.py [--rounds 3] [--ranks 2] [--steps 10]

Each round runs, in turn: torchrun (which sets OMP_NUM_THREADS=1 for several processes per
node), zlaunch with its default (the node's usable cores / its ranks), and zlaunch with
OMP_NUM_THREADS set to every core (what ranks got before the default: torch's own choice).
OMP_NUM_THREADS is removed from the environment first. Prints the median of rank 0's
``step_ms`` per launcher and whether every launcher's losses equal torchrun's.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "integration" / "clients" / "tiny_gpt_ddp.py"
CORES = len(os.sched_getaffinity(0))


def _run(argv: list[str], env: dict[str, str], cwd: str) -> tuple[list[str], float]:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"{argv[:4]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    losses = [
        line[line.index("step ") :] for line in done.stdout.splitlines() if " loss 0x" in line
    ]
    step_ms = float(re.search(r"step_ms ([\d.]+)", done.stdout).group(1))
    return losses, step_ms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    script = [str(SCRIPT), "--steps", str(args.steps)]
    ranks = str(args.ranks)
    launchers = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc_per_node", ranks, *script],
        "zlaunch (default threads)": [sys.executable, "-m", "zlaunch", "--nproc_per_node", ranks,
                                      *script],
        f"zlaunch (OMP_NUM_THREADS={CORES}, as before)": [
            sys.executable, "-m", "zlaunch", "--nproc_per_node", ranks,
            "--env", f"OMP_NUM_THREADS={CORES}", *script],
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in launchers}
    losses: dict[str, list[list[str]]] = {name: [] for name in launchers}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(args.rounds):
            for name, argv in launchers.items():
                got, step_ms = _run(argv, env, cwd)
                losses[name].append(got)
                times[name].append(step_ms)
    reference = losses["torchrun"][0]
    print(f"{CORES} cores, {args.ranks} ranks, {args.steps} steps, {args.rounds} rounds")
    for name in launchers:
        same = all(run == reference for run in losses[name])
        runs = ", ".join(f"{t:.1f}" for t in times[name])
        print(
            f"{name:40s} step {statistics.median(times[name]):7.1f} ms (runs {runs})  "
            f"losses bitwise torchrun's: {same}"
        )


if __name__ == "__main__":
    main()
