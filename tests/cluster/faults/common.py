"""What the node-loss and fault tests share: the elastic job's config, command and losses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
WORKER = str(REPO / "tests" / "cluster" / "faults" / "elastic_worker.py")
STEPS = 12


def config(tmp: Path, gas: int) -> str:
    path = tmp / f"config-gas{gas}.json"
    path.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": gas,
                "gradient_clipping": 1.0,
                "steps_per_print": 1,
                "optimizer": {"type": "Adam", "params": {"lr": 0.01, "eps": 1e-4}},
                "zero_optimization": {"stage": 2},
            }
        )
    )
    return str(path)


def losses(out: Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("losses-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def step_means(rows: list[dict], attempt: int) -> dict[int, float]:
    by_step: dict[int, list[float]] = {}
    for r in rows:
        if r["attempt"] == attempt:
            by_step.setdefault(r["step"], []).append(r["loss"])
    return {s: sum(v) / len(v) for s, v in by_step.items()}


def elastic_job(cluster, tmp: Path, *flags: str, steps: int = STEPS) -> list[str]:
    """The zlaunch command of the elastic job on node1..node3, one rank each."""
    return [
        sys.executable, "-m", "zlaunch", "--no-color",
        "--hostfile", cluster.hostfile(1), "--ssh-config", cluster.ssh_config,
        "--log-dir", str(tmp / "runs"), "--grace-period", "2",
        "--checkpoint-dir", str(tmp / "ckpt"), "--config", config(tmp, 2), *flags,
        WORKER, "--steps", str(steps), "--step-sleep", "0.4", "--out", str(tmp / "out"),
    ]  # fmt: skip


def attempts(tmp: Path) -> list[dict]:
    (run,) = [p for p in (tmp / "runs").iterdir() if p.is_dir() and not p.is_symlink()]
    return json.loads((run / "run.json").read_text()).get("attempts", [])
