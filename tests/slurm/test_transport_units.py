"""The Slurm and MPI transports' pure parts: the allocation's hosts and slots, the srun and
mpirun command lines, and how a step that Slurm ended is recognised."""

from __future__ import annotations

import pytest

from zlaunch.errors import UsageError
from zlaunch.hostfile import Host
from zlaunch.transport.mpi import mpirun_argv
from zlaunch.transport.slurm import (
    allocation_hosts,
    ended_by_slurm,
    in_allocation,
    parse_tasks_per_node,
    srun_argv,
)

ALLOC = {
    "SLURM_JOB_ID": "12",
    "SLURM_JOB_NODELIST": "gpu-a[001-003],gpu-b12",
    "SLURM_TASKS_PER_NODE": "2(x3),1",
}


def test_in_allocation():
    assert in_allocation({"SLURM_JOB_ID": "3"}) and in_allocation({"SLURM_JOBID": "3"})
    assert not in_allocation({}) and not in_allocation({"SLURM_JOB_ID": ""})


def test_hosts_and_slots_from_tasks_per_node():
    assert allocation_hosts(ALLOC) == [
        Host("gpu-a001", (0, 1)),
        Host("gpu-a002", (0, 1)),
        Host("gpu-a003", (0, 1)),
        Host("gpu-b12", (0,)),
    ]


def test_gpus_per_node_come_before_tasks_and_num_gpus_before_both():
    env = {**ALLOC, "SLURM_GPUS_PER_NODE": "a100:4"}
    assert [len(h.slots) for h in allocation_hosts(env)] == [4, 4, 4, 4]
    assert [len(h.slots) for h in allocation_hosts({**env, "SLURM_GPUS_PER_NODE": "8"})] == [8] * 4
    assert [len(h.slots) for h in allocation_hosts(env, num_gpus=3)] == [3, 3, 3, 3]


def test_one_slot_per_node_when_slurm_says_nothing():
    env = {"SLURM_JOB_ID": "1", "SLURM_NODELIST": "n[1-2]"}
    assert allocation_hosts(env) == [Host("n1", (0,)), Host("n2", (0,))]


@pytest.mark.parametrize(("env", "message"), [
    ({}, "needs a Slurm allocation: SLURM_JOB_ID is not set"),
    ({"SLURM_JOB_ID": "1"}, "SLURM_JOB_NODELIST is not set"),
    ({**ALLOC, "SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST: hostlist 'n[1-'"),
    ({**ALLOC, "SLURM_TASKS_PER_NODE": "2(x3)"}, "counts 3 nodes but SLURM_JOB_NODELIST names 4"),
    ({**ALLOC, "SLURM_TASKS_PER_NODE": "2(y3)"}, "'2(y3)' is not a count or COUNT(xREPEAT)"),
    ({**ALLOC, "SLURM_TASKS_PER_NODE": "0(x4)"}, "node gpu-a001 of the allocation has 0 slots"),
    ({**ALLOC, "SLURM_GPUS_PER_NODE": "a100"}, "SLURM_GPUS_PER_NODE='a100': no GPU count"),
])  # fmt: skip
def test_bad_allocations_name_the_variable(env, message):
    with pytest.raises(UsageError) as info:
        allocation_hosts(env)
    assert message in info.value.message
    assert info.value.exit_code == 2


def test_num_gpus_is_checked():
    with pytest.raises(UsageError, match="--num-gpus must be"):
        allocation_hosts(ALLOC, num_gpus=0)


def test_parse_tasks_per_node():
    assert parse_tasks_per_node("4") == [4]
    assert parse_tasks_per_node("2(x3),1,3(x2)") == [2, 2, 2, 1, 3, 3]


def test_srun_command_line():
    argv = srun_argv("node2", "12", ["/usr/bin/python3", "-u", "-m", "zlaunch.agent"])
    assert argv[0] == "srun" and argv[-5:] == [
        "--",
        "/usr/bin/python3",
        "-u",
        "-m",
        "zlaunch.agent",
    ]
    for flag in ("--jobid=12", "--nodes=1", "--ntasks=1", "--nodelist=node2", "--overlap"):
        assert flag in argv
    assert srun_argv("n", "1", ["p"], extra=["--gres=gpu:8"])[-3:] == ["--gres=gpu:8", "--", "p"]


def test_mpirun_command_line():
    argv = mpirun_argv("node3", ["/usr/bin/python3", "-u", "-m", "zlaunch.agent"])
    assert argv[:5] == ["mpirun", "-np", "1", "--host", "node3"]
    assert "--bind-to" in argv and argv[-4:] == ["/usr/bin/python3", "-u", "-m", "zlaunch.agent"]


@pytest.mark.parametrize(("lines", "reason"), [
    (["slurmstepd-node1: error: *** STEP 1.2 ON node1 CANCELLED AT 2026-11-30T16:37:50 ***"],
     "Slurm cancelled step 1.2 on node1 (scancel)"),
    (["srun: x", "slurmstepd: error: *** JOB 7 ON gpu-a001 CANCELLED AT 2026-11-30T16:37:50 "
      "DUE TO TIME LIMIT ***", "srun: error: gpu-a001: task 0: Killed"],
     "Slurm cancelled job 7 on gpu-a001 due to time limit"),
    (["slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO "
      "PREEMPTION ***"], "Slurm cancelled step 9.0 on n1 due to preemption"),
    (["srun: error: node1: task 0: Exited with exit code 1"], None),
    ([], None),
])  # fmt: skip
def test_a_step_that_slurm_ended_is_recognised(lines, reason):
    assert ended_by_slurm(lines) == reason
