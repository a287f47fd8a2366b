"""Launch overhead: zlaunch vs DeepSpeed's launcher (pdsh runner) on the namespace test cluster.

Same cluster (3 hosts x 2 slots, real sshd), same worker script, one run, as ratios:

- **python started**: command -> the last rank's Python running its first line;
- **all past init**: command -> the last rank past ``init_process_group`` (gloo);
- **trivial job**: command -> launcher exit, for init + barrier + exit;
- **stop after a death**: one rank on node2 SIGKILLed while the others sleep outside any
  collective (``--mode sleep``) or loop in barriers (``--mode collective``) -> the last process
  of the job gone from every host (listed per host, not taken from the launcher's word). A
  launcher that never stops is reported as ``>LIMIT``.

Run as root from the repository root (needs ``pdsh`` and ``deepspeed``; ``DS_ACCELERATOR=cpu``
is set for DeepSpeed)::

    python benchmarks/launch_overhead.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SLOTS = 2
HOSTS = 3
WORLD = HOSTS * SLOTS


# ---- the worker (runs on the nodes under either launcher) -----------------------------------


def worker(record_dir: str, mode: str) -> int:
    t_start = time.time()
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t_init = time.time()
    rank = dist.get_rank()
    path = os.path.join(record_dir, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "t_start": t_start, "t_init": t_init,
                   "host": os.uname().nodename}, f)  # fmt: skip
    os.replace(path + ".tmp", path)
    dist.barrier()
    if mode == "exit":
        dist.destroy_process_group()
        with open(os.path.join(record_dir, f"done-{rank}"), "w") as f:
            f.write(repr(time.time()))
        return 0
    if mode == "collective":
        value = torch.zeros(1)
        while True:
            dist.all_reduce(value)
            time.sleep(0.01)
    while True:
        time.sleep(3600)


# ---- the harness ----------------------------------------------------------------------------


class Launcher:
    name = ""

    def __init__(self, cluster, workdir: str):
        self.cluster = cluster
        self.workdir = workdir
        self.hostfile = cluster.hostfile(SLOTS)

    def argv(self, record_dir: str, mode: str) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)


class Zlaunch(Launcher):
    name = "zlaunch"

    def argv(self, record_dir, mode):
        return [
            sys.executable, "-m", "zlaunch", "-H", self.hostfile, "--ssh-config",
            self.cluster.ssh_config, "--log-dir", os.path.join(self.workdir, "zlaunch_runs"),
            "--grace-period", "5", os.path.abspath(__file__), "--worker", record_dir, mode,
        ]  # fmt: skip


class DeepSpeed(Launcher):
    name = "deepspeed"

    def __init__(self, cluster, workdir):
        super().__init__(cluster, workdir)
        # DeepSpeed and pdsh call plain `ssh`; this one reads the cluster's ssh config.
        self.bindir = os.path.join(workdir, "bin")
        os.makedirs(self.bindir, exist_ok=True)
        wrapper = os.path.join(self.bindir, "ssh")
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {cluster.ssh_config} "$@"\n')
        os.chmod(wrapper, 0o755)
        # Exported to every node by DeepSpeed's runner (it reads ./.deepspeed_env).
        with open(os.path.join(workdir, ".deepspeed_env"), "w") as f:
            f.write("DS_ACCELERATOR=cpu\n")

    def argv(self, record_dir, mode):
        return [
            sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", self.hostfile,
            "--launcher", "pdsh", "--master_addr", self.cluster.address("node1"),
            "--master_port", str(29500 + int.from_bytes(os.urandom(1), "big")),
            os.path.abspath(__file__), "--worker", record_dir, mode,
        ]  # fmt: skip

    def env(self):
        env = dict(os.environ, DS_ACCELERATOR="cpu")
        env["PATH"] = f"{self.bindir}:{env.get('PATH', '')}"
        return env


def job_processes(cluster) -> dict[str, list]:
    return {h: p for h in cluster.hosts if (p := cluster.pids(h))}


def wait_records(record_dir: str, proc: subprocess.Popen, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    paths = [os.path.join(record_dir, f"rank-{r}.json") for r in range(WORLD)]
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"not every rank reached init (launcher exit {proc.poll()})")
        time.sleep(0.01)
    out = []
    for p in paths:
        with open(p) as f:
            out.append(json.load(f))
    return out


def run_trivial(launcher: Launcher, log) -> dict[str, float]:
    record_dir = tempfile.mkdtemp(dir=launcher.workdir)
    t0 = time.time()
    proc = subprocess.Popen(
        launcher.argv(record_dir, "exit"), env=launcher.env(), cwd=launcher.workdir,
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    code = proc.wait(timeout=180)
    total = time.time() - t0
    records = wait_records(record_dir, proc, 0)
    if code != 0:
        raise RuntimeError(f"{launcher.name}: trivial job exited {code}")
    last_done = max(float(open(os.path.join(record_dir, f"done-{r}")).read()) for r in range(WORLD))
    return {
        "python_started": max(r["t_start"] for r in records) - t0,
        "all_past_init": max(r["t_init"] for r in records) - t0,
        "trivial_job": total,
        "exit_to_launcher_exit": t0 + total - last_done,
    }


def run_death(launcher: Launcher, mode: str, limit: float, log) -> float:
    """Seconds from SIGKILL of a node2 rank to the last job process gone (inf past limit)."""
    cluster = launcher.cluster
    record_dir = tempfile.mkdtemp(dir=launcher.workdir)
    proc = subprocess.Popen(
        launcher.argv(record_dir, mode), env=launcher.env(), cwd=launcher.workdir,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        records = wait_records(record_dir, proc, 120)
        time.sleep(0.5)  # everyone past the barrier, in the steady state
        victim = next(r for r in records if r["host"] == "node2")
        killed = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        while job_processes(cluster):
            if time.monotonic() - killed > limit:
                return float("inf")
            time.sleep(0.02)
        return time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        cluster.kill_all()
        cluster.wait_idle(5)


def fmt(value: float, limit: float) -> str:
    return f">{limit:.0f}s" if value == float("inf") else f"{value:.2f}s"


def ratio(ours: float, theirs: float) -> str:
    if theirs == float("inf") and ours != float("inf"):
        return "finite vs never"
    if ours == float("inf"):
        return "-"
    return f"{ours / theirs:.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=float, default=15.0, help="give up waiting after S s")
    parser.add_argument("--launchers", default="zlaunch,deepspeed")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    sys.path.insert(0, ROOT)
    from tests.cluster import Cluster

    names = args.launchers.split(",")
    if "deepspeed" in names and not shutil.which("pdsh"):
        sys.exit("pdsh is missing: apt-get install -y pdsh (or --launchers zlaunch)")
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as workdir, Cluster.start(HOSTS) as cluster:
        log_path = os.path.join(workdir, "launchers.log")
        with open(log_path, "wb") as log:
            launchers = {
                "zlaunch": Zlaunch(cluster, workdir),
                "deepspeed": DeepSpeed(cluster, workdir) if "deepspeed" in names else None,
            }
            for _ in range(args.repeats):
                for name in names:
                    launcher = launchers[name]
                    row = results.setdefault(name, {})
                    try:
                        for key, value in run_trivial(launcher, log).items():
                            row.setdefault(key, []).append(value)
                        for mode in ("sleep", "collective"):
                            took = run_death(launcher, mode, args.limit, log)
                            row.setdefault(f"stop_after_death_{mode}", []).append(took)
                    except RuntimeError as err:
                        log.flush()
                        with open(log_path, errors="replace") as f:
                            tail = f.read()[-3000:]
                        sys.exit(f"{err}\n--- launcher output ---\n{tail}")
    metrics = [
        ("python_started", "last rank's Python started"),
        ("all_past_init", "all ranks past init_process_group"),
        ("trivial_job", "trivial job (init + barrier), total"),
        ("exit_to_launcher_exit", "last rank's exit -> launcher exit"),
        ("stop_after_death_sleep", "stop after a death, ranks idle"),
        ("stop_after_death_collective", "stop after a death, ranks in collectives"),
    ]
    medians = {n: {k: statistics.median(v) for k, v in results[n].items()} for n in names}
    print(f"\n3 hosts x 2 slots, median of {args.repeats} runs (lower is better)\n")
    header = f"{'metric':42s}" + "".join(f"{n:>12s}" for n in names)
    if len(names) == 2:
        header += f"{'ratio':>18s}"
    print(header)
    for key, label in metrics:
        line = f"{label:42s}" + "".join(f"{fmt(medians[n][key], args.limit):>12s}" for n in names)
        if len(names) == 2:
            line += f"{ratio(medians[names[0]][key], medians[names[1]][key]):>18s}"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"repeats": args.repeats, "limit": args.limit, "runs": results,
                       "median": medians}, f, indent=2, default=str)  # fmt: skip
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        # DeepSpeed puts --local_rank=N in front of the script's own arguments: skip it.
        at = sys.argv.index("--worker")
        sys.exit(worker(sys.argv[at + 1], sys.argv[at + 2]))
    sys.exit(main())
