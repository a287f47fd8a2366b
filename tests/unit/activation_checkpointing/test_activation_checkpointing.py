"""runtime.activation_checkpointing in one process: recomputation replays RNG (bitwise-equal gradients with
dropout), both variants, and each option observed through what autograd holds between forward
and backward (saved-tensor hooks), not through the module's own counters.

``partition_activations`` needs a model-parallel group: tests/integration/engine/test_model_parallel.py
measures it on 4 ranks (and trains through it at stages 0-2).
"""

from __future__ import annotations

import pytest
import torch

import runtime
import runtime.activation_checkpointing as ck
from runtime.activation_checkpointing import checkpointing
from runtime.config import ConfigError, load_config

D, T, B, BLOCKS = 16, 8, 4, 3


@pytest.fixture(autouse=True)
def fresh_configuration():
    checkpointing._unconfigure()
    ck.get_cuda_rng_tracker().reset()
    yield
    checkpointing._unconfigure()
    ck.get_cuda_rng_tracker().reset()


class Block(torch.nn.Module):
    """Dropout in the default stream and in the tracker's model-parallel stream (as Megatron's
    attention dropout inside a tensor-parallel region)."""

    def __init__(self, tracked: bool = True):
        super().__init__()
        self.fc1 = torch.nn.Linear(D, 4 * D)
        self.fc2 = torch.nn.Linear(4 * D, D)
        self.drop = torch.nn.Dropout(0.3)
        self.tracked = tracked

    def forward(self, x, scale=1.0):
        h = torch.nn.functional.gelu(self.fc1(x))
        if self.tracked:
            with ck.get_cuda_rng_tracker().fork():
                h = self.drop(h)
        return x + scale * self.drop(self.fc2(h))


def blocks(tracked: bool = True) -> torch.nn.ModuleList:
    torch.manual_seed(0)
    return torch.nn.ModuleList(Block(tracked) for _ in range(BLOCKS))


def inputs() -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))


def grads(model, wrap, x=None, input_grad=True, seed_tracker=True):
    """Gradients of parameters (and input) after one forward/backward through ``wrap``."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)
    if seed_tracker:
        ck.model_parallel_cuda_manual_seed(123)
    h = (inputs() if x is None else x).requires_grad_(input_grad)
    y = h
    for block in model:
        y = wrap(block, y)
    y.square().sum().backward()
    out = [p.grad.clone() for p in model.parameters()]
    return out + ([h.grad.clone()] if input_grad else [])


def plain(block, y):
    return block(y)


def held(model, wrap) -> list[torch.Tensor]:
    """Every tensor autograd holds for backward after one forward (then runs the backward)."""
    seen: list[torch.Tensor] = []

    def pack(t):
        seen.append(t)
        return t

    y = inputs().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for block in model:
            y = wrap(block, y)
        loss = y.sum()  # saves nothing itself
    loss.backward()
    return seen


def storage_bytes(tensors) -> int:
    return sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()
    )


# --------------------------------------------------------------------------- recomputation
@pytest.mark.parametrize("variant", [ck.checkpoint, ck.non_reentrant_checkpoint])
def test_dropout_gradients_bitwise_equal_without_checkpointing(variant):
    model = blocks()
    want = grads(model, plain)
    got = grads(model, variant)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_dropout_is_random_so_the_equality_means_something():
    model = blocks()
    a = grads(model, plain)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    ck.model_parallel_cuda_manual_seed(7)
    y = inputs().requires_grad_()
    for block in model:
        y = block(y)
    y.square().sum().backward()
    assert not torch.equal(a[0], next(iter(model.parameters())).grad)


def test_recomputation_leaves_the_generators_where_backward_found_them():
    model = blocks()
    ck.model_parallel_cuda_manual_seed(5)
    y = inputs().requires_grad_()
    for block in model:
        y = ck.checkpoint(block, y)
    cpu_before = torch.get_rng_state()
    tracker_before = ck.get_cuda_rng_tracker().get_states()
    y.sum().backward()
    assert torch.equal(torch.get_rng_state(), cpu_before)
    after = ck.get_cuda_rng_tracker().get_states()
    assert all(torch.equal(after[k], v) for k, v in tracker_before.items())


def test_keyword_arguments_tuple_outputs_and_non_tensor_arguments():
    torch.manual_seed(0)
    lin = torch.nn.Linear(D, D)

    def two(x, mask, factor, scale=1.0):
        z = lin(x) * factor * scale
        return z.masked_fill(mask, 0.0), mask

    x = inputs().requires_grad_()
    mask = torch.zeros(B, T, D, dtype=torch.bool)
    mask[0] = True
    for variant in (ck.checkpoint, ck.non_reentrant_checkpoint):
        lin.zero_grad(set_to_none=True)
        out, m = variant(two, x, mask, 2, scale=0.5)
        assert m.dtype == torch.bool and not m.requires_grad
        out.sum().backward()
        got = lin.weight.grad.clone()
        lin.zero_grad(set_to_none=True)
        two(x, mask, 2, scale=0.5)[0].sum().backward()
        assert torch.equal(got, lin.weight.grad)


def test_non_reentrant_trains_parameters_when_no_input_requires_grad():
    model = blocks()
    want = grads(model, plain, input_grad=False)
    got = grads(model, ck.non_reentrant_checkpoint, input_grad=False)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_autograd_grad_works_non_reentrant_and_is_refused_clearly_reentrant():
    model = blocks(tracked=False)
    x = inputs().requires_grad_()
    torch.manual_seed(3)
    (g,) = torch.autograd.grad(ck.non_reentrant_checkpoint(model[0], x).square().sum(), x)
    torch.manual_seed(3)
    (want,) = torch.autograd.grad(model[0](x).square().sum(), x)
    assert torch.equal(g, want)
    with pytest.raises(RuntimeError, match="cannot serve torch.autograd.grad"):
        torch.autograd.grad(ck.checkpoint(model[0], x).sum(), x)


def test_without_grad_the_function_just_runs():
    model = blocks(tracked=False)
    with torch.no_grad():
        out = ck.checkpoint(model[0], inputs())
    assert out.grad_fn is None


# --------------------------------------------------------------------------- what is held
def test_checkpointing_holds_only_the_block_inputs():
    model = blocks()
    ck.model_parallel_cuda_manual_seed(1)
    everything = storage_bytes(held(model, plain))
    only_inputs = held(model, ck.checkpoint)
    block_input = B * T * D * 4
    assert storage_bytes(only_inputs) == BLOCKS * block_input
    assert everything > 4 * storage_bytes(only_inputs)


def test_cpu_checkpointing_keeps_inputs_in_host_memory():
    ck.configure(None, checkpoint_in_cpu=True)
    model = blocks()
    ck.model_parallel_cuda_manual_seed(1)
    kept = held(model, ck.checkpoint)
    assert len(kept) == BLOCKS
    assert all(t.device.type == "cpu" for t in kept)
    want = grads(model, plain)
    assert all(torch.equal(a, b) for a, b in zip(want, grads(model, ck.checkpoint), strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_checkpointing_moves_device_inputs_to_pinned_host_memory():
    ck.configure(None, checkpoint_in_cpu=True)
    lin = torch.nn.Linear(D, D).cuda()
    x = inputs().cuda().requires_grad_()
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        y = ck.checkpoint(lin, x)
    assert [(t.device.type, t.is_pinned()) for t in seen] == [("cpu", True)]
    y.sum().backward()
    want = x.grad.clone()
    x.grad = None
    lin(x).sum().backward()
    assert torch.equal(want, x.grad)


def test_contiguous_buffer_holds_every_checkpoint_in_one_storage_reused_each_step():
    ck.configure(None, contiguous_checkpointing=True, num_checkpoints=BLOCKS)
    model = blocks()
    ck.model_parallel_cuda_manual_seed(1)
    first = held(model, ck.checkpoint)
    second = held(model, ck.checkpoint)
    storages = {t.untyped_storage().data_ptr() for t in first + second}
    assert len(storages) == 1  # one allocation, the same on the next step
    assert first[0].untyped_storage().nbytes() == BLOCKS * B * T * D * 4
    # the slots are distinct rows of it
    assert len({t.data_ptr() for t in first}) == BLOCKS
    want = grads(model, plain)
    assert all(torch.equal(a, b) for a, b in zip(want, grads(model, ck.checkpoint), strict=True))


def test_contiguous_buffer_too_small_says_what_to_do_and_reset_frees_it():
    ck.configure(None, contiguous_checkpointing=True, num_checkpoints=BLOCKS - 1)
    model = blocks(tracked=False)
    with pytest.raises(ck.ArenaFull, match="raise number_checkpoints"):
        y = inputs().requires_grad_()
        for block in model:
            y = ck.checkpoint(block, y)
    ck.reset()
    y = ck.checkpoint(model[0], inputs().requires_grad_())  # a slot is free again
    y.sum().backward()


def test_contiguous_needs_number_checkpoints():
    with pytest.raises(ValueError, match="needs number_checkpoints"):
        ck.configure(None, contiguous_checkpointing=True)


def test_synchronize_marks_every_boundary(monkeypatch):
    calls = []
    monkeypatch.setattr(checkpointing, "_synchronize", lambda tensors: calls.append(len(tensors)))
    ck.configure(None, synchronize=True)
    model = blocks(tracked=False)
    y = ck.checkpoint(model[0], inputs().requires_grad_())
    assert len(calls) == 2  # forward start and end
    y.sum().backward()
    assert len(calls) == 4  # backward start and end
    calls.clear()
    ck.configure(None)  # back to the default: off
    ck.checkpoint(model[0], inputs().requires_grad_()).sum().backward()
    assert calls == []


def test_profile_counts_and_times_forward_and_recompute():
    assert ck.take_profile() is None  # off by default
    ck.configure(None, profile=True)
    model = blocks(tracked=False)
    y = inputs().requires_grad_()
    for block in model:
        y = ck.checkpoint(block, y)
    y.sum().backward()
    timings = ck.take_profile()
    assert timings["checkpoint_calls"] == BLOCKS
    assert timings["checkpoint_recomputes"] == BLOCKS
    assert timings["checkpoint_forward_s"] > 0 and timings["checkpoint_recompute_s"] > 0
    assert ck.take_profile()["checkpoint_calls"] == 0  # taken


# --------------------------------------------------------------------------- config and engine


def engine_config(**block):
    return {
        "train_micro_batch_size_per_gpu": B,
        "steps_per_print": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "activation_checkpointing": block,
    }


def test_reachable_as_deepspeed_checkpointing_is():
    assert (
        runtime.activation_checkpointing is ck
    )  # import runtime as deepspeed; deepspeed.checkpointing


def test_config_block_is_validated():
    cfg = load_config(
        engine_config(partition_activations=True, synchronize_checkpoint_boundary=True)
    )
    assert cfg.activation_checkpointing.partition_activations
    with pytest.raises(ConfigError, match="did you mean 'cpu_checkpointing'"):
        load_config(engine_config(cpu_checkpoint=True))
    with pytest.raises(ConfigError, match="contiguous_memory_optimization = true needs"):
        load_config(engine_config(contiguous_memory_optimization=True))
    with pytest.raises(ConfigError, match="number_checkpoints must be >= 1"):
        load_config(engine_config(number_checkpoints=0))
