"""Time from a launcher's start to the last rank's Python, on the Slurm test cluster's 3 nodes x 2
slots, for zlaunch over SSH, Slurm and mpirun, plain srun, and DeepSpeed's launcher where it runs.

    python -m tests.cluster.slurm.measure [--repeat 5]      (root; from the repository root)

Each rank runs a probe that prints ``time.time()`` as its first line; the time reported is the
latest of the six minus the moment just before the launcher was started. Launchers inside an
allocation run in one held by a batch job (``sleep``), so allocation time is not counted;
``salloc + zlaunch`` shows it included.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from tests.cluster.slurm.cluster import SlurmCluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROBE = "import time, sys\nprint('PROBE', repr(time.time()), flush=True)\n"
STAMP = re.compile(r"(1\d{9}\.\d+)")  # mpirun may interleave lines: find the stamps alone


def _run(argv, env, timeout=120) -> tuple[float | None, str]:
    start = time.time()
    out = subprocess.run(
        argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    stamps = [float(s) for s in STAMP.findall(out.stdout + out.stderr)]
    if out.returncode != 0 or len(stamps) != 6:
        return None, (out.stdout + out.stderr)[-1500:]
    return max(stamps) - start, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with SlurmCluster.start(n=3) as c, tempfile.TemporaryDirectory(prefix="zl-measure-") as tmp:
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
        hold = c.run(
            ["sbatch", "--parsable", "-N3", "--ntasks-per-node=2", "-o", os.devnull, "--wrap",
             "sleep 3600"]
        )  # fmt: skip
        job = hold.stdout.strip().split(";")[0]
        while "R" not in c.run(["squeue", "-h", "-j", job, "-o", "%t"]).stdout:
            time.sleep(0.1)
        inside = {
            **env,
            "SLURM_JOB_ID": job,
            "SLURM_JOB_NODELIST": "node[1-3]",
            "SLURM_NODELIST": "node[1-3]",  # Open MPI reads the old name
            "SLURM_TASKS_PER_NODE": "2(x3)",
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
        hostfile = c.net.hostfile(2)
        ds_hostfile = os.path.join(tmp, "ds_hostfile")
        with open(ds_hostfile, "w") as f:
            f.write("".join(f"{h} slots=2\n" for h in c.hosts))
        cases = [
            ("zlaunch over SSH", env, [*zl, "--hostfile", hostfile, "--ssh-config",
                                       c.net.ssh_config, probe]),
            ("zlaunch --launcher slurm", inside, [*zl, "--launcher", "slurm", probe]),
            ("zlaunch --launcher mpi (mpirun over ssh)", over_ssh,
             [*zl, "--launcher", "mpi", probe]),
            ("srun python (no zlaunch)", inside, ["srun", f"--jobid={job}", "--overlap", "-N3",
                                                   "--ntasks-per-node=2", sys.executable, probe]),
            ("salloc + zlaunch (allocation included)", env,
             ["salloc", "-N3", "--ntasks-per-node=2", *zl, probe]),
            ("salloc + zlaunch --launcher mpi", env,
             ["salloc", "-N3", "--ntasks-per-node=2", *zl, "--launcher", "mpi", probe]),
        ]  # fmt: skip
        if shutil.which("deepspeed"):
            cases.append((
                "deepspeed --launcher slurm", over_ssh,
                ["deepspeed", "--launcher", "slurm", "--hostfile", ds_hostfile,
                 "--launcher_args", f"--jobid={job} --overlap", probe],
            ))  # fmt: skip
            cases.append((
                "deepspeed --launcher openmpi", over_ssh,
                ["deepspeed", "--launcher", "openmpi", "--hostfile", ds_hostfile,
                 "--launcher_args", "--bind-to none", probe],
            ))  # fmt: skip
        for name, case_env, argv in cases:
            times, error = [], ""
            for _ in range(args.repeat):
                took, error = _run(argv, case_env)
                if took is None:
                    break
                times.append(took)
            if len(times) < args.repeat:
                print(f"{name:42s} did not run here: {error.strip()[-600:]}")
                continue
            print(
                f"{name:42s} median {statistics.median(times):6.2f} s  "
                f"(min {min(times):.2f}, max {max(times):.2f}, n={len(times)})",
                flush=True,
            )
        c.run(["scancel", job])
    return 0


if __name__ == "__main__":
    sys.exit(main())
