"""A real Slurm cluster, and the runtime started by srun and mpirun alone (no zlaunch): it finds
its rank from Slurm's and Open MPI's variables, and stops with a clear error when it cannot."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.cluster.slurm.cluster import unavailable_reason

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or ""),
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LINE = re.compile(r"^step\s+(\d+)\s+loss ([0-9.]+)", re.MULTILINE)
TRAIN = [
    sys.executable, "examples/train_gpt.py", "--config", "examples/configs/zero2.json",
    "--steps", "10", "--print-every", "5", "--threads", "1", "--max-chars", "50000",
    "--n-layer", "1", "--d-model", "64", "--seq-len", "32",
]  # fmt: skip


def _env() -> dict[str, str]:
    return {"PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}


def test_srun_runs_one_task_on_each_of_three_nodes(idle_slurm):
    out = idle_slurm.run(["srun", "-N3", "hostname"])
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == ["node1", "node2", "node3"]


def test_srun_tasks_see_their_slurm_variables(idle_slurm):
    show = "echo $(hostname) $SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS $SLURM_JOB_NODELIST"
    out = idle_slurm.run(["srun", "-N3", "--ntasks-per-node=2", "sh", "-c", show])
    assert out.returncode == 0, out.stderr
    rows = sorted(tuple(line.split()) for line in out.stdout.splitlines())
    assert rows == [(f"node{r // 2 + 1}", str(r), str(r % 2), "6", "node[1-3]") for r in range(6)]


@pytest.mark.multirank
def test_srun_python_trains_with_the_right_world_size(idle_slurm):
    out = idle_slurm.run(
        ["srun", "-N2", "--ntasks-per-node=1", "--chdir", REPO, *TRAIN], env=_env(), timeout=240
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "world size 2" in out.stdout, out.stdout
    losses = LINE.findall(out.stdout)
    assert [s for s, _ in losses] == ["5", "10"], out.stdout
    # each task said where its rank came from (the runtime's log line, at INFO: not shown) and
    # nothing trained alone
    assert "no launcher found" not in out.stderr


def test_srun_without_the_rank_variable_fails_with_the_clear_error(idle_slurm):
    out = idle_slurm.run(
        ["srun", "-N2", "-n2", "--chdir", REPO, "env", "-u", "SLURM_PROCID", *TRAIN],
        env=_env(),
        timeout=240,
    )
    assert out.returncode != 0
    assert "SLURM_PROCID is not set" in out.stderr, out.stderr[-3000:]
    assert "SLURM_STEP_NUM_TASKS=2" in out.stderr
    assert "world size" not in out.stdout


def test_python_in_a_batch_script_of_several_tasks_fails_with_the_clear_error(idle_slurm):
    log = os.path.join(idle_slurm.dir, "batch-no-srun.out")
    script = " ".join(TRAIN)
    out = idle_slurm.run(
        ["sbatch", "-W", "-N2", "-n2", "--chdir", REPO, "-o", log, "--wrap", script],
        env=_env(),
        timeout=240,
    )
    assert out.returncode != 0
    with open(log) as f:
        text = f.read()
    assert "holds SLURM_NTASKS=2, but this process is not a task of srun" in text, text[-3000:]


@pytest.mark.multirank
@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs mpirun (apt-get install openmpi-bin)"
)
def test_mpirun_python_trains_with_the_right_world_size(tmp_path):
    out = subprocess.run(
        [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "4",
            "--mca",
            "btl",
            "self,tcp",
            "-x",
            "PYTHONPATH",
            "-x",
            "OMP_NUM_THREADS",
            *TRAIN,
        ],  # fmt: skip
        env={**os.environ, **_env(), "TMPDIR": str(tmp_path)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "world size 4" in out.stdout, out.stdout
    assert [s for s, _ in LINE.findall(out.stdout)] == ["5", "10"]


def _mpi_env(slurm) -> dict[str, str]:
    sub = str(slurm.net.subnet)
    return {
        **_env(),
        "OMPI_MCA_oob_tcp_if_include": sub,  # what an MPI site sets once
        "OMPI_MCA_btl_tcp_if_include": sub,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }


MPIRUN_2x2 = ["salloc", "-N2", "--ntasks-per-node=2", "--chdir", REPO, "mpirun", "-np", "4",
              "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]  # fmt: skip


@pytest.mark.multirank
@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs mpirun (apt-get install openmpi-bin)"
)
def test_mpirun_across_nodes_trains_with_master_addr(idle_slurm):
    out = idle_slurm.run(
        [*MPIRUN_2x2, "-x", "MASTER_ADDR", *TRAIN],
        env={**_mpi_env(idle_slurm), "MASTER_ADDR": "node1"},
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "world size 4" in out.stdout
    assert [s for s, _ in LINE.findall(out.stdout)] == ["5", "10"]


@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs mpirun (apt-get install openmpi-bin)"
)
def test_mpirun_across_nodes_without_master_addr_fails_with_the_clear_error(idle_slurm):
    out = idle_slurm.run([*MPIRUN_2x2, *TRAIN], env=_mpi_env(idle_slurm), timeout=300)
    assert out.returncode != 0
    assert "Open MPI (mpirun): the ranks run on several nodes" in out.stdout + out.stderr
    assert "MASTER_ADDR is not set" in out.stdout + out.stderr
