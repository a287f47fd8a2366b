"""Step time before and after a change to the step path, and with 16-bit gradient communication.

Runs ``train_bench.py --frameworks zlaunch`` (the benchmark GPT, 2 gloo ranks) in interleaved
rounds for each stage: a baseline checkout's runtime (``--baseline DIR``: another checkout of
this repository, e.g. a git worktree at the commit before the change), this tree's runtime,
and this tree's with ``--communication-data-type`` (default bf16). The order of the variants
rotates every round so that drift in the host's load falls on all of them alike; each
variant's step time is the median over rounds of the run's median step time, and the ratios
are taken against the baseline. Also reported: the runtime's own byte counter per step and
the largest relative loss difference from this tree's plain run::

    python benchmarks/step_comm_bench.py --baseline ../main --stages 1,2 --rounds 3 \\
        --markdown benchmarks/results/step_comm.md --json benchmarks/results/step_comm.json
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
from typing import Any

HERE = Path(__file__).resolve().parent


def _variants(baseline: Path, wire: str) -> dict[str, tuple[Path, list[str]]]:
    return {
        "baseline": (baseline / "benchmarks" / "train_bench.py", []),
        "this": (HERE / "train_bench.py", []),
        f"this + {wire} wire": (HERE / "train_bench.py", ["--communication-data-type", wire]),
    }


def _run(script: Path, extra: list[str], stage: int, args, out: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(script),
        "--frameworks",
        "zlaunch",
        "--stage",
        str(stage),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--precision",
        args.precision,
        "--json",
        str(out),
        *extra,
    ]
    if args.tiny:
        cmd.append("--tiny")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # each train_bench puts its own checkout first
    for attempt in (1, 2):
        done = subprocess.run(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if done.returncode == 0:
            return json.loads(out.read_text())["rows"][0]
        # A rank killed by the host (out of memory on a shared machine) is retried once.
        print(f"[step_comm_bench] run failed (attempt {attempt}): {done.stderr[-400:]}")
    raise SystemExit(f"step_comm_bench: {' '.join(cmd)} failed twice")


def run(args) -> dict[str, Any]:
    variants = _variants(Path(args.baseline).resolve(), args.wire)
    names = list(variants)
    result: dict[str, Any] = {
        "stages": {},
        "command": "python " + " ".join(sys.argv),
        "rounds": args.rounds,
        "load_avg_1min_before": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="step_comm_bench-") as scratch:
        tmp = args.workdir or scratch
        for stage in args.stages:
            runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    script, extra = variants[name]
                    out = Path(tmp) / f"s{stage}-r{r}-{names.index(name)}.json"
                    started = time.monotonic()
                    row = _run(script, extra, stage, args, out)
                    runs[name].append(row)
                    print(
                        f"[step_comm_bench] stage {stage} round {r + 1} {name}: "
                        f"{row['step_time_s'] * 1e3:.1f} ms/step ({time.monotonic() - started:.0f} s)",
                        flush=True,
                    )
            result["stages"][stage] = _summarize(runs, names)
    result["load_avg_1min_after"] = os.getloadavg()[0]
    return result


def _summarize(runs: dict[str, list[dict[str, Any]]], names: list[str]) -> dict[str, Any]:
    plain = runs["this"][0]["losses"]
    base = statistics.median(r["step_time_s"] for r in runs["baseline"])
    base_cpu = statistics.median(r["cpu_time_s"] for r in runs["baseline"])
    out = {}
    for name in names:
        rows = runs[name]
        step = statistics.median(r["step_time_s"] for r in rows)
        cpu = statistics.median(r["cpu_time_s"] for r in rows)
        out[name] = {
            "step_ms": step * 1e3,
            "ratio_to_baseline": step / base,
            # CPU time of the slowest rank's process per step: less sensitive than wall time
            # to other work on an oversubscribed host
            "cpu_ms": cpu * 1e3,
            "cpu_ratio_to_baseline": cpu / base_cpu,
            "per_round_ms": [r["step_time_s"] * 1e3 for r in rows],
            "step_phase_ms": {k: v * 1e3 for k, v in rows[0]["phase_s"].items()},
            "runtime_bytes_per_step": rows[0]["runtime_counter_bytes_per_step"],
            "loss_max_rel_diff_vs_this": max(
                abs(a - b) / abs(b) for a, b in zip(rows[0]["losses"], plain, strict=True)
            ),
            "losses": rows[0]["losses"],
        }
    return out


def render(directory: Path, baseline: Path, wire: str) -> dict[str, Any]:
    """The summary of the runs kept in `directory` (``--workdir`` of a run, finished or
    not): every stage with at least one run of each variant."""
    names = list(_variants(baseline, wire))
    result: dict[str, Any] = {
        "stages": {},
        "command": f"python benchmarks/step_comm_bench.py --render {directory}",
        "load_avg_1min_before": float("nan"),
        "load_avg_1min_after": os.getloadavg()[0],
    }
    for stage in sorted(
        {int(p.name[1 : p.name.index("-")]) for p in directory.glob("s*-r*-*.json")}
    ):
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for path in sorted(directory.glob(f"s{stage}-r*-*.json")):
            index = int(path.stem.rsplit("-", 1)[1])
            runs[names[index]].append(json.loads(path.read_text())["rows"][0])
        if all(runs.values()):
            result["stages"][stage] = _summarize(runs, names)
            result["rounds"] = min(len(v) for v in runs.values())
    return result


def format_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}`",
        "",
        f"1-minute load average before {result['load_avg_1min_before']:.1f}, after "
        f"{result['load_avg_1min_after']:.1f} (host cores: {os.cpu_count()}).",
        "",
        "| stage | variant | step ms (median of rounds) | x baseline | per round ms | "
        "CPU ms/step | x baseline | optimizer-step phase ms | runtime bytes/step | "
        "max rel loss diff vs this |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for stage, variants in result["stages"].items():
        for name, v in variants.items():
            rounds = " ".join(f"{ms:.0f}" for ms in v["per_round_ms"])
            sent = v["runtime_bytes_per_step"]
            lines.append(
                f"| {stage} | {name} | {v['step_ms']:.1f} | {v['ratio_to_baseline']:.3f} | "
                f"{rounds} | {v['cpu_ms']:.1f} | {v['cpu_ratio_to_baseline']:.3f} | "
                f"{v['step_phase_ms']['step']:.1f} | "
                f"{sent / 2**20:.2f} MiB | {v['loss_max_rel_diff_vs_this']:.1e} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="another checkout of this repository")
    parser.add_argument("--stages", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--wire", default="bf16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--workdir", help="keep every run's train_bench JSON here")
    parser.add_argument(
        "--render", action="store_true", help="summarize the runs kept in --workdir, run nothing"
    )
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    args.stages = [int(s) for s in args.stages.split(",")]
    if not (Path(args.baseline) / "benchmarks" / "train_bench.py").is_file():
        print(f"step_comm_bench: {args.baseline} has no benchmarks/train_bench.py", file=sys.stderr)
        return 2
    if args.render:
        result = render(Path(args.workdir), Path(args.baseline).resolve(), args.wire)
    else:
        if args.workdir:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
        result = run(args)
    text = format_markdown(result)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
