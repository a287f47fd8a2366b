"""What keeping every rank's collective records costs in step time (zlaunch's hang report).

Under zlaunch every Python worker runs with torch's flight recorder on (``TORCH_FR_BUFFER_SIZE``)
and a thread that copies the recent records to a file every half second
(zlaunch/worker/collective_records.py). This runs ``train_bench.py --frameworks zlaunch`` with and
without that, alternately (off, on, off, on, ...: load on the host hits both alike), and prints
the median step time of each and the ratio on/off::

    python benchmarks/records_overhead.py --stages 2,3 --repeats 3 [--tiny] [--json out.json]

Stage 3 issues the most collectives per step (an all-gather per unit, forward and backward,
and the gradient reduce-scatters); ``--tiny`` (a 0.1M-parameter model) is the worst case: the
per-collective cost weighs most where the step is shortest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FR_ENVS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def step_seconds(
    stage: int, records: bool, args: argparse.Namespace, workdir: Path
) -> dict[str, float]:
    """Medians over the timed steps: wall time, and CPU time (all threads of the busiest
    rank: the recording's cost is CPU work, and CPU time is what a loaded host blurs least)."""
    out = workdir / "bench.json"
    env = {k: v for k, v in os.environ.items() if k not in FR_ENVS}
    env["PYTHONPATH"] = str(REPO)
    records_dir = workdir / "records"
    records_dir.mkdir(exist_ok=True)
    if records:
        env["BENCH_COLLECTIVE_RECORDS"] = str(records_dir)
    else:
        env.pop("BENCH_COLLECTIVE_RECORDS", None)
    argv = [sys.executable, str(REPO / "benchmarks" / "train_bench.py"), "--stage", str(stage),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--frameworks", "zlaunch",
            "--json", str(out), *(["--tiny"] if args.tiny else [])]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"train_bench exited {done.returncode}:\n{done.stderr[-2000:]}")
    if records and not list(records_dir.glob("rank-*.json")):
        raise SystemExit("the records were on but no rank wrote its file")
    [row] = json.loads(out.read_text())["rows"]
    return {
        "wall": row["step_time_s"],
        "cpu": row["cpu_time_s"],
        "min_wall": row["min_step_time_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stages = [int(s) for s in args.stages.split(",") if s.strip()]
    samples: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="zl-records-") as tmp:
        for repeat in range(args.repeats):
            for stage in stages:
                for records in (False, True):
                    key = f"stage{stage}-{'on' if records else 'off'}"
                    got = step_seconds(stage, records, args, Path(tmp))
                    samples.setdefault(key, []).append(got)
                    words = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in got.items())
                    print(f"[{repeat + 1}/{args.repeats}] {key}: {words}", flush=True)
    print(
        f"\n{'stage':<7}{'measure':<10}{'off (ms)':>10}{'on (ms)':>10}{'on/off':>8}   runs on/off"
    )
    for stage in stages:
        for measure in ("wall", "min_wall", "cpu"):
            off = [s[measure] for s in samples[f"stage{stage}-off"]]
            on = [s[measure] for s in samples[f"stage{stage}-on"]]
            m_off, m_on = statistics.median(off), statistics.median(on)
            runs = ", ".join(f"{a * 1e3:.1f}/{b * 1e3:.1f}" for a, b in zip(on, off, strict=True))
            print(
                f"{stage:<7}{measure:<10}{m_off * 1e3:>10.1f}{m_on * 1e3:>10.1f}"
                f"{m_on / m_off:>8.3f}   {runs}"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "samples": samples}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
