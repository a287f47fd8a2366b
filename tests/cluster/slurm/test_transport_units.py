"""The Slurm and MPI transports' pure parts: the allocation's hosts and slots, the srun and
mpirun command lines, and how a step that Slurm ended is recognised."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zlaunch.errors import UsageError
from zlaunch.job.hostfile import Host
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


# -- the command line (zlaunch/commands/run.py) ------------------------------------------------


def _options(tmp_path, environ, **values):
    from zlaunch.commands.run import build_options

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    base = {"PATH": os.environ.get("PATH", "")}
    return build_options(
        script=str(script), script_args=(), environ={**base, **environ}, home=str(tmp_path),
        **values,
    )  # fmt: skip


def test_inside_an_allocation_without_a_hostfile_the_launcher_is_slurm(tmp_path):
    options = _options(tmp_path, ALLOC)
    assert options.launcher == "slurm" and options.world_size == 7
    assert [h.name for h in options.hosts] == ["gpu-a001", "gpu-a002", "gpu-a003", "gpu-b12"]
    selected = _options(tmp_path, ALLOC, exclude="gpu-a002@gpu-a003:1")
    assert [(h.name, h.slots) for h in selected.hosts] == [
        ("gpu-a001", (0, 1)), ("gpu-a003", (0,)), ("gpu-b12", (0,))
    ]  # fmt: skip
    assert [len(h.slots) for h in _options(tmp_path, ALLOC, num_gpus=3).hosts] == [3] * 4
    assert len(_options(tmp_path, ALLOC, num_nodes=2).hosts) == 2
    assert _options(tmp_path, ALLOC, launcher="ssh").hosts[0].name == "localhost"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\n")
    assert _options(tmp_path, ALLOC, hostfile=str(hostfile)).launcher == "ssh"
    assert _options(tmp_path, {}).launcher == "ssh"


def test_launcher_choices_are_checked(tmp_path):
    with pytest.raises(UsageError, match="--launcher slurm needs a Slurm allocation"):
        _options(tmp_path, {}, launcher="slurm")
    with pytest.raises(UsageError, match="--launcher mpi needs --hostfile, or a Slurm alloc"):
        _options(tmp_path, {}, launcher="mpi")
    with pytest.raises(UsageError, match="--launcher 'pbs': expected auto, ssh, slurm, mpi"):
        _options(tmp_path, ALLOC, launcher="pbs")
    with pytest.raises(UsageError, match="--slurm-args has no effect with --launcher mpi"):
        _options(tmp_path, ALLOC, launcher="mpi", slurm_args="--gres=gpu:1")
    with pytest.raises(UsageError, match="--slurm-args '--x \"y': No closing quotation"):
        _options(tmp_path, ALLOC, slurm_args='--x "y')
    options = _options(tmp_path, ALLOC, launcher="mpi", mpirun_args="--mca btl self,tcp")
    assert options.launcher_args == ("--mca", "btl", "self,tcp")


def test_dry_run_shows_the_srun_command_of_each_node(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    out = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--dry-run", "--slurm-args", "--gres=gpu:2",
         str(script)],
        env={**os.environ, **ALLOC}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "agents start with (slurm, one per node):" in out.stdout
    for node in ("gpu-a001", "gpu-a002", "gpu-a003", "gpu-b12"):
        assert f"srun --jobid=12 --nodes=1 --ntasks=1 --nodelist={node} --overlap" in out.stdout
    assert "--gres=gpu:2 -- " in out.stdout
    assert 'runpy._run_module_as_main("zlaunch.agent")\'' in out.stdout  # -m, less the cwd


def test_from_a_login_node_nodes_asks_salloc(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    argv = [sys.executable, "-m", "zlaunch", "--nodes", "3", "--partition", "gpu", "--time",
            "1:00:00", "--account", "proj", "--num-gpus", "2", "--dry-run", str(script)]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (
        "salloc --nodes=3 --partition=gpu --time=1:00:00 --account=proj --ntasks-per-node=2 "
        in out.stdout
    )
    assert 'runpy._run_module_as_main("zlaunch")\' --nodes 3' in out.stdout, out.stdout
    assert "--dry-run" not in out.stdout
    inside = subprocess.run(argv, env={**env, **ALLOC}, capture_output=True, text=True, timeout=60)
    assert inside.returncode == 2
    assert "--nodes asks Slurm for an allocation, but zlaunch runs inside one already (job 12)" in (
        inside.stderr
    )
    alone = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--partition", "gpu", str(script)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert alone.returncode == 2 and "--partition needs --nodes N" in alone.stderr
