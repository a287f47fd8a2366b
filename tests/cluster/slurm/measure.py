"""Time from a launcher's start to the last rank's Python, on the Slurm test cluster (3 nodes x 2
slots by default), for zlaunch over SSH, Slurm (both --slurm-mode) and mpirun, plain srun, and
DeepSpeed's launcher where it runs; for zlaunch also what it holds on the controller's host at
its peak (the zlaunch process and its children, the srun processes: resident memory, threads).

    python -m tests.cluster.slurm.measure [--repeat 5]      (root; from the repository root)
    python -m tests.cluster.slurm.measure --nodes 16 --slots 1 --only slurm

Each rank runs a probe that prints ``time.time()`` as its first line and then waits ``--hold``
seconds (so the controller's processes are sampled with every rank up); the cases take turns
(round-robin), so the machine's load falls on all alike; the time reported is
the latest stamp minus the moment just before the launcher was started. Launchers inside an
allocation run in one held by a batch job (``sleep``), so allocation time is not counted;
``salloc + zlaunch`` shows it included.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from tests.cluster.slurm.cluster import SlurmCluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROBE = (
    "import time, sys\nprint('PROBE', repr(time.time()), flush=True)\n"
    # the hold is the last number among the arguments (DeepSpeed adds --local_rank=N first)
    "time.sleep(next((float(a) for a in reversed(sys.argv[1:])"
    " if a.replace('.', '', 1).isdigit()), 0.0))\n"
)
STAMP = re.compile(r"(1\d{9}\.\d+)")  # mpirun may interleave lines: find the stamps alone


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc (the controller's host only: processes on the
    nodes are children of slurmstepd or sshd, never of the launcher)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _footprint(root: int) -> tuple[int, int, int]:
    """(resident KiB, threads, processes) of ``root`` and its descendants now."""
    rss = threads = procs = 0
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        rss += int(fields.get("VmRSS", "0 kB").split()[0])
        threads += int(fields.get("Threads", "0").strip())
        procs += 1
    return rss, threads, procs


def _run(argv, env, ranks, timeout=180) -> tuple[float | None, tuple[int, int, int], str]:
    """(seconds to the last rank's stamp, peak footprint of the launcher's process tree, error)."""
    start = time.time()
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    peak = (0, 0, 0)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.communicate()), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while reader.is_alive():
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and all it started here
            reader.join(30)
            return None, peak, f"timed out after {timeout} s"
        now = _footprint(proc.pid) if proc.poll() is None else (0, 0, 0)
        peak = tuple(max(a, b) for a, b in zip(peak, now, strict=True))
        time.sleep(0.02)
    text = "".join(out)
    stamps = [float(s) for s in STAMP.findall(text)]
    if proc.returncode != 0 or len(stamps) != ranks:
        return None, peak, text[-1500:]
    return max(stamps) - start, peak, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2, help="ranks per node")
    parser.add_argument("--hold", type=float, default=1.0, help="seconds each rank stays up")
    parser.add_argument(
        "--only", choices=("all", "slurm"), default="all",
        help="slurm: zlaunch's two Slurm modes and plain srun only",
    )  # fmt: skip
    args = parser.parse_args()
    n, slots, ranks = args.nodes, args.slots, args.nodes * args.slots
    nodelist = f"node[1-{n}]"
    alloc = [f"-N{n}", f"--ntasks-per-node={slots}"]
    with SlurmCluster.start(n=n) as c, tempfile.TemporaryDirectory(prefix="zl-measure-") as tmp:
        probe = os.path.join(tmp, "probe.py")
        with open(probe, "w") as f:
            f.write(PROBE)
        sub = str(c.net.subnet)
        env = {
            **c.env,
            "PYTHONPATH": REPO,
            "OMPI_MCA_oob_tcp_if_include": sub,
            "OMPI_MCA_btl_tcp_if_include": sub,
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }
        hold = c.run(["sbatch", "--parsable", *alloc, "-o", os.devnull, "--wrap", "sleep 3600"])
        job = hold.stdout.strip().split(";")[0]
        while "R" not in c.run(["squeue", "-h", "-j", job, "-o", "%t"]).stdout:
            time.sleep(0.1)
        inside = {
            **env,
            "SLURM_JOB_ID": job,
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_NODELIST": nodelist,  # Open MPI reads the old name
            "SLURM_TASKS_PER_NODE": f"{slots}(x{n})",
        }
        # mpirun (outside salloc) and DeepSpeed reach the nodes with `ssh HOST`: an `ssh`
        # earlier on PATH adds the cluster's ssh config.
        bin_dir = os.path.join(tmp, "bin")
        os.mkdir(bin_dir)
        with open(os.path.join(bin_dir, "ssh"), "w") as f:
            f.write(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {c.net.ssh_config} "$@"\n')
        os.chmod(os.path.join(bin_dir, "ssh"), 0o755)
        over_ssh = {**inside, "PATH": bin_dir + os.pathsep + inside.get("PATH", "")}
        zl = [sys.executable, "-m", "zlaunch", "--log-dir", os.path.join(tmp, "runs")]
        hostfile = c.net.hostfile(slots)
        ds_hostfile = os.path.join(tmp, "ds_hostfile")
        with open(ds_hostfile, "w") as f:
            f.write("".join(f"{h} slots={slots}\n" for h in c.hosts))
        run = [probe, str(args.hold)]
        slurm_cases = [
            ("zlaunch --slurm-mode step-per-node", inside,
             [*zl, "--launcher", "slurm", "--slurm-mode", "step-per-node", *run]),
            ("zlaunch --slurm-mode one-step", inside,
             [*zl, "--launcher", "slurm", "--slurm-mode", "one-step", *run]),
            ("srun python (no zlaunch)", inside, ["srun", f"--jobid={job}", "--overlap", f"-N{n}",
                                                   f"--ntasks-per-node={slots}", sys.executable,
                                                   *run]),
        ]  # fmt: skip
        cases = [
            ("zlaunch over SSH", env, [*zl, "--hostfile", hostfile, "--ssh-config",
                                       c.net.ssh_config, *run]),
            *slurm_cases,
            ("zlaunch --launcher mpi (mpirun over ssh)", over_ssh,
             [*zl, "--launcher", "mpi", *run]),
            ("salloc + zlaunch (allocation included)", env, ["salloc", *alloc, *zl, *run]),
            ("salloc + zlaunch --launcher mpi", env,
             ["salloc", *alloc, *zl, "--launcher", "mpi", *run]),
        ]  # fmt: skip
        if shutil.which("deepspeed"):
            cases.append((
                "deepspeed --launcher slurm", over_ssh,
                ["deepspeed", "--launcher", "slurm", "--hostfile", ds_hostfile,
                 "--launcher_args", f"--jobid={job} --overlap", *run],
            ))  # fmt: skip
            cases.append((
                "deepspeed --launcher openmpi", over_ssh,
                ["deepspeed", "--launcher", "openmpi", "--hostfile", ds_hostfile,
                 "--launcher_args", "--bind-to none", *run],
            ))  # fmt: skip
        if args.only == "slurm":
            cases = slurm_cases
        print(f"{n} nodes x {slots} slots, median of {args.repeat}; controller's host at peak: "
              "the launcher's process tree", flush=True)  # fmt: skip
        # Round-robin, so a change in the machine's load hits every case alike.
        results = {name: ([], [], "") for name, _, _ in cases}
        for _ in range(args.repeat):
            for name, case_env, argv in cases:
                times, peaks, error = results[name]
                if error or len(times) >= args.repeat:
                    continue  # a case that failed once is reported as such
                took, peak, error = _run(argv, case_env, ranks)
                if took is None:
                    results[name] = (times, peaks, error or "failed")
                    continue
                times.append(took)
                peaks.append(peak)
        for name, (times, peaks, error) in results.items():
            if error:
                print(f"{name:42s} did not run here: {error.strip()[-600:]}")
                continue
            rss = statistics.median(p[0] for p in peaks) / 1024
            threads = statistics.median(p[1] for p in peaks)
            procs = statistics.median(p[2] for p in peaks)
            print(
                f"{name:42s} median {statistics.median(times):6.2f} s  "
                f"(min {min(times):.2f}, max {max(times):.2f}, n={len(times)})  "
                f"host: {rss:6.1f} MiB, {threads:4.0f} threads, {procs:3.0f} processes",
                flush=True,
            )
        c.run(["scancel", job])
    return 0


if __name__ == "__main__":
    sys.exit(main())
