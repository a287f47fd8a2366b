"""runtime.activation_checkpointing in one process: recomputation replays RNG (bitwise-equal gradients with
dropout), both variants, and each option observed through what autograd holds between forward
and backward (saved-tensor hooks), not through the module's own counters.

``partition_activations`` needs a model-parallel group: tests/integration/engine/test_model_parallel.py
measures it on 4 ranks (and trains through it at stages 0-2).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import runtime
import runtime.activation_checkpointing as ck
from tests.integration.config.cli_utils import dry_run
from tests.unit.activation_checkpointing.test_activation_checkpointing import (  # shared with the unit half
    blocks,
    engine_config,
    fresh_configuration,  # noqa: F401 - fixtures, shared with the unit half
    inputs,
)
from zlaunch.wire import events as wire_events

D, T, B, BLOCKS = 16, 8, 4, 3


@pytest.fixture(scope="module")
def single_process_group():
    was = dist.is_initialized()
    yield
    if not was and dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------- recomputation


# --------------------------------------------------------------------------- what is held


# --------------------------------------------------------------------------- config and engine
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = blocks(tracked=False)
        self.inp = torch.nn.Linear(D, D)

    def forward(self, x):
        x = self.inp(x)  # a block input that requires grad (reentrant checkpoints need one)
        for block in self.blocks:
            x = ck.checkpoint(block, x)
        return x


def test_initialize_configures_from_the_block_and_reports_profile(single_process_group):
    engine, *_ = runtime.initialize(
        model=Net(),
        config=engine_config(profile=True, cpu_checkpointing=True, number_checkpoints=3),
    )
    assert ck.is_configured()
    assert ck.options() == ck.CheckpointOptions(
        cpu_checkpointing=True, number_checkpoints=3, profile=True
    )
    events = []
    engine.step_metrics.sink = type(
        "Sink", (), {"emit": lambda self, e: events.append(wire_events.encode(e))}
    )()
    for _ in range(2):
        engine.backward(engine(inputs()).square().mean())
        engine.step()
    profiles = [e for e in events if "checkpoint_recompute_s" in e]
    assert [e["step"] for e in profiles] == [1, 2]
    assert all(e["checkpoint_recomputes"] == BLOCKS for e in profiles)


def test_unknown_key_exits_2_before_launch_naming_the_nearest(tmp_path):
    done = dry_run(
        tmp_path,
        '{"train_batch_size": 2, "activation_checkpointing": {"partition_activation": true}}',
    )
    assert done.returncode == 2, done.stderr
    assert "activation_checkpointing.partition_activation" in done.stderr
    assert "did you mean 'partition_activations'" in done.stderr
