"""The runtime finds its rank under every launcher: torchrun/zlaunch variables, Open MPI, MPICH/PMI
and Slurm, from env dicts (pure), plus real two-process groups started with Slurm's and Open
MPI's variables only, and the no-launcher log line."""

from __future__ import annotations

import pytest

from runtime.distributed.launch_env import (
    PORT_BASE,
    PORT_SPAN,
    DistInitError,
    Launcher,
    World,
    cuda_index,
    discover_world,
    slurm_port,
)

# What `srun -N3 --ntasks-per-node=2` gives task 3 (measured on the test cluster).
SLURM_TASK = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOBID": "1234",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "6",
    "SLURM_NPROCS": "6",
    "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_STEP_NUM_NODES": "3",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURM_NNODES": "3",
    "SLURM_JOB_NODELIST": "gpu-a[001-004,007],gpu-b12",
    "SLURM_STEP_NODELIST": "gpu-a[002-004]",
    "SLURM_NODELIST": "gpu-a[001-004,007],gpu-b12",
}
OMPI_RANK = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_MCA_ess_base_jobid": "116195329",
}
PMI_RANK = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
TORCHRUN = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29400",
}


def where(world: World) -> tuple:
    return (
        world.launcher,
        world.rank,
        world.world_size,
        world.local_rank,
        world.master_addr,
        world.master_port,
    )


# -- which launcher -------------------------------------------------------------------------


def test_no_launcher_is_a_world_of_one_that_says_so():
    world = discover_world({"HOME": "/root", "LOCAL_RANK": "0"})
    assert where(world) == (Launcher.NONE, 0, 1, 0, None, None)
    assert "no launcher found" in world.note and "world of one" in world.note


def test_torchrun_variables_come_first():
    env = {**SLURM_TASK, **OMPI_RANK, **PMI_RANK, **TORCHRUN}
    assert where(discover_world(env)) == (Launcher.ENV, 1, 2, 1, "10.0.0.1", 29400)


def test_torchrun_variables_incomplete_name_what_is_missing():
    with pytest.raises(DistInitError, match="MASTER_ADDR, MASTER_PORT not set"):
        discover_world({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(DistInitError, match="RANK not set"):
        discover_world({"WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"})


def test_world_size_one_is_a_world_of_one_on_purpose():
    env = {**SLURM_TASK, "WORLD_SIZE": "1"}  # inside an allocation too
    assert where(discover_world(env)) == (Launcher.ENV, 0, 1, 0, None, None)


@pytest.mark.parametrize(("env", "message"), [
    ({**TORCHRUN, "RANK": "2"}, "RANK=2 is outside 0..1 (WORLD_SIZE=2)"),
    ({**TORCHRUN, "RANK": "x"}, "RANK must be an integer, got 'x'"),
    ({**SLURM_TASK, "SLURM_PROCID": "6"}, "SLURM_PROCID=6 is outside 0..5"),
    ({**SLURM_TASK, "SLURM_NTASKS": "six", "SLURM_STEP_NUM_TASKS": ""}, "SLURM_NTASKS must be"),
    ({**OMPI_RANK, "OMPI_COMM_WORLD_RANK": "-1"}, "OMPI_COMM_WORLD_RANK=-1 is outside 0..7"),
])  # fmt: skip
def test_inconsistent_numbers_are_named(env, message):
    with pytest.raises(DistInitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        discover_world(env)


# -- Slurm ----------------------------------------------------------------------------------


def test_slurm_task():
    world = discover_world(SLURM_TASK)
    assert where(world) == (Launcher.SLURM, 3, 6, 1, "gpu-a002", slurm_port(1234, 0))
    assert "first host of SLURM_STEP_NODELIST" in world.note


def test_slurm_master_from_the_job_list_without_a_step_list():
    env = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_STEP_NODELIST"}
    assert discover_world(env).master_addr == "gpu-a001"


def test_slurm_master_addr_and_port_can_be_given():
    env = {**SLURM_TASK, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "40000"}
    assert where(discover_world(env))[4:] == ("10.1.2.3", 40000)


def test_slurm_port_depends_on_job_and_step_and_stays_in_range():
    assert slurm_port(1234, 0) != slurm_port(1234, 1) != slurm_port(1235, 1)
    assert discover_world({**SLURM_TASK, "SLURM_STEP_ID": "1"}).master_port == slurm_port(1234, 1)
    ports = {slurm_port(job, step) for job in range(0, 5000, 7) for step in range(3)}
    assert min(ports) >= PORT_BASE and max(ports) < PORT_BASE + PORT_SPAN < 32768


def test_slurm_old_variable_names():
    env = {
        "SLURM_JOBID": "77",
        "SLURM_STEPID": "2",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NPROCS": "2",
        "SLURM_NODELIST": "n[1-2]",
    }
    assert where(discover_world(env)) == (Launcher.SLURM, 1, 2, 0, "n1", slurm_port(77, 2))


def test_slurm_one_task_is_a_world_of_one():
    env = {**SLURM_TASK, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    env.update(SLURM_NTASKS="1", SLURM_STEP_NUM_TASKS="1", SLURM_NPROCS="1")
    assert where(discover_world(env)) == (Launcher.SLURM, 0, 1, 0, None, None)


def test_slurm_rank_removed_is_a_clear_error():
    env = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_PROCID"}
    with pytest.raises(DistInitError) as info:
        discover_world(env)
    message = str(info.value)
    assert "Slurm job 1234" in message and "SLURM_STEP_NUM_TASKS=6" in message
    assert "SLURM_PROCID is not set" in message


def test_slurm_local_rank_removed_is_a_clear_error():
    env = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_LOCALID"}
    with pytest.raises(DistInitError, match="SLURM_LOCALID is not set"):
        discover_world(env)


@pytest.mark.parametrize("procid", [None, "0"])
def test_slurm_allocation_shell_with_many_tasks_is_a_clear_error(procid):
    # salloc -n 6 (no SLURM_PROCID) and an sbatch script (SLURM_PROCID=0), not a step
    env = {
        "SLURM_JOB_ID": "99",
        "SLURM_NTASKS": "6",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "n[1-3]",
    }
    if procid is not None:
        env["SLURM_PROCID"] = procid
    with pytest.raises(DistInitError) as info:
        discover_world(env)
    message = str(info.value)
    assert "Slurm job 99 holds SLURM_NTASKS=6" in message and "not a task of srun" in message
    assert "srun python" in message and "WORLD_SIZE=1" in message


def test_slurm_allocation_shell_with_many_nodes_is_a_clear_error():
    env = {"SLURM_JOB_ID": "99", "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "n[1-3]"}
    with pytest.raises(DistInitError, match="holds 3 nodes"):
        discover_world(env)


def test_slurm_allocation_shell_of_one_task_is_one_process():
    env = {"SLURM_JOB_ID": "99", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1"}
    world = discover_world(env)
    assert where(world) == (Launcher.SLURM, 0, 1, 0, None, None)
    assert "not a step" in world.note


def test_slurm_without_a_node_list_or_job_id():
    env = {k: v for k, v in SLURM_TASK.items() if "NODELIST" not in k}
    with pytest.raises(DistInitError, match="rank 0's host is unknown; set MASTER_ADDR"):
        discover_world(env)
    assert discover_world({**env, "MASTER_ADDR": "h"}).master_addr == "h"
    bad = {**SLURM_TASK, "SLURM_STEP_NODELIST": "n[1-"}
    with pytest.raises(DistInitError, match="SLURM_STEP_NODELIST: hostlist 'n\\[1-'"):
        discover_world(bad)


# -- MPI ------------------------------------------------------------------------------------


def test_openmpi_on_several_nodes_needs_master_addr():
    with pytest.raises(DistInitError) as info:
        discover_world(OMPI_RANK)
    assert "Open MPI" in str(info.value) and "MASTER_ADDR is not set" in str(info.value)
    assert "mpirun -x MASTER_ADDR" in str(info.value)
    world = discover_world({**OMPI_RANK, "MASTER_ADDR": "node1"})
    port = PORT_BASE + 116195329 % PORT_SPAN
    assert where(world) == (Launcher.OPENMPI, 5, 8, 1, "node1", port)


def test_openmpi_asks_mpi_for_rank_0s_host():
    assert discover_world(OMPI_RANK, lambda: "node7").master_addr == "node7"
    with pytest.raises(DistInitError, match="install mpi4py"):
        discover_world(OMPI_RANK, lambda: None)


def test_openmpi_on_one_node_uses_loopback():
    env = {**OMPI_RANK, "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "MASTER_PORT": "1234"}
    assert where(discover_world(env)) == (Launcher.OPENMPI, 5, 8, 1, "127.0.0.1", 1234)


def test_openmpi_wins_over_slurm_inside_an_allocation():
    # mpirun in an allocation starts its daemons with srun: SLURM_PROCID is the daemon's
    env = {**SLURM_TASK, **OMPI_RANK, "MASTER_ADDR": "n1"}
    assert discover_world(env).launcher is Launcher.OPENMPI


@pytest.mark.parametrize("missing", ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"])
def test_openmpi_rank_removed_is_a_clear_error(missing):
    env = {k: v for k, v in OMPI_RANK.items() if k != missing}
    with pytest.raises(DistInitError, match=f"OMPI_COMM_WORLD_SIZE=8 but {missing} is not set"):
        discover_world(env)


def test_openmpi_size_removed_is_a_clear_error():
    env = {k: v for k, v in OMPI_RANK.items() if k != "OMPI_COMM_WORLD_SIZE"}
    with pytest.raises(DistInitError, match="OMPI_COMM_WORLD_SIZE is not"):
        discover_world(env)


def test_pmi():
    env = {**PMI_RANK, "MASTER_ADDR": "h0"}
    assert where(discover_world(env)) == (Launcher.PMI, 2, 4, 0, "h0", 29500)
    with pytest.raises(DistInitError, match="MPICH/PMI .* MASTER_ADDR is not set"):
        discover_world(PMI_RANK)
    one_node = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "4"}
    assert where(discover_world(one_node)) == (Launcher.PMI, 3, 4, 3, "127.0.0.1", 29500)


def test_pmi_without_local_rank_on_several_nodes_is_a_clear_error():
    with pytest.raises(DistInitError, match="MPI_LOCALRANKID is not set"):
        discover_world({"PMI_RANK": "1", "PMI_SIZE": "4", "MASTER_ADDR": "h"})


def test_pmi_rank_removed_is_a_clear_error():
    with pytest.raises(DistInitError, match="PMI_SIZE=4 but PMI_RANK is not set"):
        discover_world({"PMI_SIZE": "4", "MPI_LOCALNRANKS": "4"})


def test_srun_with_pmi2_is_read_as_slurm():
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE equal to Slurm's: Slurm's variables say more
    env = {**SLURM_TASK, "PMI_RANK": "3", "PMI_SIZE": "6"}
    assert discover_world(env).launcher is Launcher.SLURM


def test_mpiexec_inside_an_allocation_is_read_as_pmi():
    # hydra's proxies are one srun task per node: the step counts 3 tasks, PMI 12 ranks
    env = {**SLURM_TASK, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "3", "SLURM_NTASKS": "3"}
    env.update(PMI_RANK="7", PMI_SIZE="12", MPI_LOCALRANKID="3", MASTER_ADDR="h")
    assert where(discover_world(env))[:4] == (Launcher.PMI, 7, 12, 3)


def test_cuda_index():
    assert cuda_index(3, 8) == 3
    assert cuda_index(3, 1) == 0  # srun --gpus-per-task: each task sees its own GPU
    with pytest.raises(DistInitError, match="local rank 4 has no GPU: this process sees 2"):
        cuda_index(4, 2)


# -- real process groups from launcher variables only -----------------------------------------


def test_mpi_launchers_read_one_shape_of_variables():
    """Open MPI and MPICH/PMI differ only in their variable names, and in PMI's local rank
    being optional on one node; the derived port needs Open MPI's job id."""
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "OMPI_MCA_ess_base_jobid": "7"}  # fmt: skip
    pmi = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4"}
    assert where(discover_world(ompi)) == (Launcher.OPENMPI, 3, 4, 3, "127.0.0.1", PORT_BASE + 7)
    assert where(discover_world(pmi)) == (Launcher.PMI, 3, 4, 3, "127.0.0.1", 29500)
    ompi.pop("OMPI_COMM_WORLD_LOCAL_RANK")
    with pytest.raises(DistInitError, match="OMPI_COMM_WORLD_LOCAL_RANK is not set"):
        discover_world(ompi)
    pmi.pop("MPI_LOCALRANKID")
    assert discover_world(pmi).local_rank == 3


def test_launch_errors_are_user_errors_that_callers_catch_as_runtime_errors():
    from runtime.errors import UsageError

    with pytest.raises(UsageError):
        discover_world({"PMI_SIZE": "4", "MPI_LOCALNRANKS": "4"})
    assert issubclass(DistInitError, RuntimeError)
