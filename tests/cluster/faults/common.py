"""What the node-loss and fault tests share: the elastic job's config, command and losses."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
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


CPU_CGROUP = "/sys/fs/cgroup/cpu"


@contextlib.contextmanager
def cpu_quota(cluster, host: str, share: float = 0.25) -> Iterator[None]:
    """``host``'s sshd (and so everything started there over ssh) in a cgroup v1 CPU quota of
    ``share`` of one core; on the way out every process left on the cluster is killed, the
    sshd put back and the group removed."""
    if not os.path.isfile(os.path.join(CPU_CGROUP, "cpu.cfs_quota_us")):
        raise RuntimeError(f"no cgroup v1 cpu controller at {CPU_CGROUP} (these tests need one)")
    group = os.path.join(CPU_CGROUP, f"zlaunch-slow-{os.getpid()}-{host}")
    os.mkdir(group)
    sshd = cluster._sshd[host].pid
    try:
        Path(group, "cpu.cfs_period_us").write_text("100000")
        Path(group, "cpu.cfs_quota_us").write_text(str(int(100000 * share)))
        Path(group, "cgroup.procs").write_text(str(sshd))
        yield
    finally:
        Path(CPU_CGROUP, "cgroup.procs").write_text(str(sshd))
        cluster.kill_all()  # the group cannot be removed while a process is in it
        for _ in range(50):
            try:
                os.rmdir(group)
                break
            except OSError:
                time.sleep(0.1)
