"""The runtime finds its rank under every launcher: torchrun/zlaunch variables, Open MPI, MPICH/PMI
and Slurm, from env dicts (pure), plus real two-process groups started with Slurm's and Open
MPI's variables only, and the no-launcher log line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.engine.mp_utils import REPO, free_port
from tests.unit.distributed.test_launch_env import SLURM_TASK  # shared with the unit half

# What `srun -N3 --ntasks-per-node=2` gives task 3 (measured on the test cluster).


# -- which launcher -------------------------------------------------------------------------


# -- Slurm ----------------------------------------------------------------------------------


# -- MPI ------------------------------------------------------------------------------------


# -- real process groups from launcher variables only -----------------------------------------

WORKER = """
import logging, os, sys
import torch.distributed as dist
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from runtime.distributed.launch_env import init_distributed, DistInitError
try:
    env = init_distributed()
except DistInitError as exc:
    print("ERROR", exc, flush=True)
    sys.exit(2)
t = __import__("torch").tensor([float(env.rank + 1)])
dist.all_reduce(t)
print("WORLD", env.rank, env.world_size, env.local_rank, int(t.item()),
      os.environ.get("RANK"), os.environ.get("LOCAL_RANK"), flush=True)
"""


def _clean_env() -> dict[str, str]:
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ZLAUNCH_CONFIG")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in names and not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return env


def _run(envs: list[dict[str, str]]) -> list[subprocess.CompletedProcess]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env={**_clean_env(), **extra},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for extra in envs
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


@pytest.mark.multirank
def test_two_slurm_tasks_form_one_world():
    port = str(free_port())
    base = {
        "SLURM_JOB_ID": "4321",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NODELIST": "localhost",
        "MASTER_PORT": port,
    }
    runs = _run([{**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in (0, 1)])
    for r, run in enumerate(runs):
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"WORLD {r} 2 {r} 3 {r} {r}" in run.stdout
        assert "Slurm job 4321: task" in run.stderr and "first host of SLURM_STEP_NODELIST" in (
            run.stderr
        )


@pytest.mark.multirank
def test_two_openmpi_ranks_on_one_node_form_one_world():
    port = str(free_port())
    base = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_PORT": port}
    envs = [
        {**base, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_RANK": str(r)}
        for r in (0, 1)
    ]
    for r, run in enumerate(_run(envs)):
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"WORLD {r} 2 {r} 3 {r} {r}" in run.stdout


def test_no_launcher_logs_one_line_and_trains_alone():
    run = subprocess.run(
        [sys.executable, "-c", WORKER], env=_clean_env(), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "WORLD 0 1 0 1 None None" in run.stdout
    lines = [line for line in run.stderr.splitlines() if "runtime.distributed.launch_env" in line]
    assert lines == [
        "runtime.distributed.launch_env: no launcher found (no RANK/WORLD_SIZE, SLURM_*, OMPI_COMM_WORLD_* or "
        "PMI_* variables): running as a world of one process"
    ]


def test_slurm_task_without_its_rank_stops_with_the_error():
    env = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_PROCID"}
    run = subprocess.run(
        [sys.executable, "-c", WORKER], env={**_clean_env(), **env}, capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "SLURM_PROCID is not set" in run.stdout
