"""Two source trees of this project side by side: did a change cost launch or step time?

For each tree, alternately (A, B, A, B, ...: load on the host hits both alike):

- **launch**: ``python -m zlaunch --num-gpus 2 <script>`` on localhost, command -> exit, for a
  script that only prints its rank (the controller, the agent and two workers start, report,
  exit and are reaped);
- **step**: ``benchmarks/train_bench.py --frameworks zlaunch`` of that tree, at the stages
  given (the GPT benchmark model, 2 ranks, fp32), its median step time over the timed steps.

Each tree runs with ``PYTHONPATH`` set to itself, so a worktree of an older commit
(``git worktree add /tmp/base REV``) is measured beside the working tree::

    python benchmarks/compare_trees.py --base /tmp/base --new . --repeats 3 --stages 2,3

Prints medians per tree and the ratio new/base; ``--json`` writes every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIVIAL = "import os; print('rank', os.environ['RANK'], flush=True)\n"


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), ZLAUNCH_LIVE="0", NO_COLOR="1")
    env.pop("ZLAUNCH_TRACE", None)
    return env


def launch_seconds(tree: Path, workdir: Path) -> float:
    script = workdir / "trivial.py"
    script.write_text(TRIVIAL)
    argv = [sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--log-dir",
            str(workdir / "runs"), str(script)]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=workdir, env=_env(tree), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{tree}: zlaunch exited {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed


def step_seconds(tree: Path, stage: int, steps: int, warmup: int, workdir: Path) -> float:
    out = workdir / f"stage{stage}.json"
    argv = [sys.executable, str(tree / "benchmarks" / "train_bench.py"), "--stage", str(stage),
            "--steps", str(steps), "--warmup", str(warmup), "--frameworks", "zlaunch",
            "--json", str(out)]  # fmt: skip
    done = subprocess.run(argv, cwd=tree, env=_env(tree), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: train_bench exited {done.returncode}:\n{done.stderr[-2000:]}")
    [row] = [r for r in json.loads(out.read_text())["rows"] if r["framework"] == "zlaunch"]
    return row["step_time_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="the tree to compare against")
    parser.add_argument("--new", required=True, type=Path, help="the tree measured")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stages", default="2,3", help="comma list of ZeRO stages ('' for none)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "new": args.new.resolve()}
    stages = [int(s) for s in args.stages.split(",") if s.strip()]
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    with tempfile.TemporaryDirectory(prefix="zl-compare-") as tmp:
        for repeat in range(args.repeats):
            for name, tree in trees.items():
                work = Path(tmp) / f"{name}-{repeat}"
                work.mkdir()
                samples[name].setdefault("launch", []).append(launch_seconds(tree, work))
                for stage in stages:
                    seconds = step_seconds(tree, stage, args.steps, args.warmup, work)
                    samples[name].setdefault(f"stage {stage} step", []).append(seconds)
                print(f"repeat {repeat} {name}: " + ", ".join(
                    f"{k} {v[-1]:.3f}s" for k, v in samples[name].items()), flush=True)  # fmt: skip
    print(f"\n{'measure':<16}{'base (median)':>15}{'new (median)':>15}{'new/base':>10}")
    for measure in samples["base"]:
        base = statistics.median(samples["base"][measure])
        new = statistics.median(samples["new"][measure])
        print(f"{measure:<16}{base:>14.3f}s{new:>14.3f}s{new / base:>10.3f}")
    if args.json:
        args.json.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()},
                                         "samples": samples}, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
