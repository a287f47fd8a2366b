"""A rank's discovery of itself from the launcher's environment refuses impossible values by
name (`runtime/distributed/launch_env.py`)."""

from __future__ import annotations

import re

import pytest

ENV_WORLD = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}  # fmt: skip
SLURM = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
         "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_NUM_TASKS": "2"}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({**ENV_WORLD, "MASTER_PORT": "0"}, "MASTER_PORT must be a TCP port (1-65535), got 0"),
        ({**ENV_WORLD, "MASTER_PORT": "-1"}, "MASTER_PORT must be a TCP port"),
        ({**ENV_WORLD, "MASTER_PORT": "99999"}, "MASTER_PORT must be a TCP port"),
        ({**ENV_WORLD, "LOCAL_RANK": "-1"}, "LOCAL_RANK must be 0 or more, got -1"),
        ({**ENV_WORLD, "RANK": "²"}, "RANK must be an integer"),
        ({**ENV_WORLD, "RANK": "9" * 5000}, "RANK must be an integer"),
        ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "-3"}, "must be 0 or more"),
        ({**SLURM, "SLURM_STEP_ID": "0", "SLURM_LOCALID": "-1"}, "SLURM_LOCALID must be 0 or more"),
    ],
)
def test_rank_discovery_refuses_impossible_values_by_name(env, words):
    from runtime.distributed.launch_env import DistInitError, discover_world

    with pytest.raises(DistInitError, match=re.escape(words)):
        discover_world(env)


def test_a_blank_master_port_with_open_mpi_is_unset_and_a_named_step_is_step_0():
    from runtime.distributed.launch_env import DEFAULT_PORT, discover_world, slurm_port

    assert discover_world({**OPENMPI, "MASTER_PORT": " "}).master_port == DEFAULT_PORT
    world = discover_world({**SLURM, "SLURM_STEP_ID": "²", "MASTER_ADDR": "n1"})
    assert world.master_port == slurm_port(5, 0)
