"""The bundled ``deepspeed`` API that Lightning and DeepSpeed's own examples reach first: the
logger and `log_dist`, ``get_accelerator()``'s device calls (answered as the installed DeepSpeed
answers them on this machine), ``deepspeed.moe`` importable, ``add_config_arguments``. The
engine's queries are in tests/integration/deepspeed_api/test_engine_queries.py (an engine
needs a process group).

No process group; the compatibility package is imported as
``runtime.deepspeed_api.deepspeed`` next to the real DeepSpeed, which is the reference.
"""

from __future__ import annotations

import argparse
import importlib
import io
import logging

import pytest
import torch
import torch.distributed as dist

COMPAT = "runtime.deepspeed_api.deepspeed"
ds = importlib.import_module(COMPAT)
NotInBundledRuntime = importlib.import_module(f"{COMPAT}._missing").NotInBundledRuntime


@pytest.fixture(scope="module")
def real_accelerator():
    real = pytest.importorskip("deepspeed.accelerator")
    return real.get_accelerator()


# ---------------------------------------------------------------- logging
def test_lightning_sets_the_level_of_deepspeeds_logger():
    logger = ds.utils.logging.logger
    assert logger is ds.utils.logger is ds.logger and logger.name == "DeepSpeed"
    assert logger.level == logging.WARNING and not logger.propagate
    # One handler of ours (a real DeepSpeed imported in this process adds its own to the same
    # logger; in a worker only one of the two packages is importable as ``deepspeed``).
    (handler,) = [h for h in logger.handlers if getattr(h, "_deepspeed_handler", False)]
    out = io.StringIO()
    stream = handler.setStream(out)
    try:
        # What DeepSpeedStrategy.__init__ does. As in DeepSpeed, the handler keeps its own
        # WARNING level, so INFO lines still need set_log_level_from_string.
        logger.setLevel(logging.INFO)
        ds.utils.log_dist("quiet", ranks=[0])
        logger.warning_once("once")
        logger.warning_once("once")
        ds.utils.set_log_level_from_string("info")
        ds.utils.log_dist("hello", ranks=[0])
        lines = out.getvalue().splitlines()
        assert len(lines) == 2 and lines[0].endswith("once") and "[WARNING]" in lines[0]
        assert "[INFO]" in lines[1] and lines[1].endswith("[Rank -1] hello")
    finally:
        handler.setStream(stream)
        ds.utils.set_log_level_from_string("warning")


def test_log_dist_picks_the_ranks_deepspeed_picks(monkeypatch):
    real = pytest.importorskip("deepspeed.utils.logging")
    ours = ds.utils.logging
    assert ours.get_dist_msg("m", [0]) == real.get_dist_msg("m", [0]) == "[Rank -1] m"
    # With a process group: rank 1 of 2 logs for [-1] and [1], not for [0] or None.
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    for ranks in (None, [0], [1], [-1], [0, 1]):
        expected = "[Rank 1] m" if ranks in ([1], [-1], [0, 1]) else None
        assert ours.get_dist_msg("m", ranks) == expected, ranks
    assert ours.should_log_le("warning") and not ours.should_log_le("info")


# ---------------------------------------------------------------- the accelerator
DEVICE_CALLS = [
    ("device_name", ()),
    ("device_name", (1,)),
    ("current_device_name", ()),
    ("communication_backend_name", ()),
    ("is_bf16_supported", ()),
    ("is_available", ()),
    ("is_synchronized_device", ()),
    ("use_host_timers", ()),
    ("resolves_data_dependency", ()),
    ("handles_memory_backpressure", ()),
    ("get_compile_backend", ()),
    ("visible_devices_envs", ()),
]


@pytest.mark.parametrize("name, args", DEVICE_CALLS)
def test_device_calls_answer_as_deepspeeds_accelerator(real_accelerator, name, args):
    ours = ds.accelerator.get_accelerator()
    assert getattr(ours, name)(*args) == getattr(real_accelerator, name)(*args)


def test_device_calls_have_their_meaning_on_this_device(real_accelerator):
    acc = ds.accelerator.get_accelerator()
    assert acc is ds.accelerator.get_accelerator()
    acc.set_device(0)  # every example calls it after init_distributed()
    assert acc.current_device_name() == real_accelerator.current_device_name()
    assert torch.device(acc.device_name(0)).type == acc._name
    t = torch.zeros(2, device=acc.current_device_name())
    assert acc.on_accelerator(t) and acc.on_accelerator(t) == real_accelerator.on_accelerator(t)
    # manual_seed seeds what torch draws from on this device, as DeepSpeed's does.
    for seeder in (acc, real_accelerator):
        seeder.manual_seed(1234)
        draw = torch.rand(3, device=acc.current_device_name())
        if seeder is acc:
            first = draw
    assert torch.equal(first, draw)
    state = acc.get_rng_state()
    a = torch.rand(2, device=acc.current_device_name())
    acc.set_rng_state(state)
    assert torch.equal(a, torch.rand(2, device=acc.current_device_name()))
    assert acc.random() is torch.random
    assert acc.memory_allocated() > 0 and acc.max_memory_allocated() >= acc.memory_allocated()
    assert acc.total_memory() >= acc.available_memory() > 0
    with acc.stream(acc.current_stream()):
        acc.synchronize()
    assert acc.lazy_call(lambda: 7) in (7, None)
    if acc._name == "cpu":
        # fp16 training needs a GPU here (the runtime's fp16 does not run on the CPU), where
        # DeepSpeed's CPU accelerator says yes when oneDNN has fp16 kernels.
        assert not acc.is_fp16_supported() and acc.device() is None and acc.Stream is None
        assert acc.supported_dtypes() == [torch.float, torch.bfloat16]


def test_an_accelerator_call_the_runtime_lacks_is_named():
    with pytest.raises(NotInBundledRuntime, match=r"get_accelerator\(\)\.create_op_builder"):
        ds.accelerator.get_accelerator().create_op_builder("CPUAdamBuilder")


# ---------------------------------------------------------------- moe, arguments
def test_moe_imports_and_refuses_layers():
    utils = importlib.import_module(f"{COMPAT}.moe.utils")
    model = torch.nn.Linear(2, 2)
    assert utils.has_moe_layers(model) == (False, 0)
    group = {"params": list(model.parameters()), "name": "g", "lr": 0.1}
    assert utils.split_params_into_different_moe_groups_for_optimizer(group) == [group]
    assert utils.configure_moe_param_groups(list(model.parameters()))[0]["name"] == "dense-params"
    with pytest.raises(NotInBundledRuntime, match=r"deepspeed\.moe\.layer\.MoE"):
        ds.moe.layer.MoE(hidden_size=2, expert=model, num_experts=2)
    model.weight.allreduce = False  # an expert parameter, from somewhere else
    with pytest.raises(NotInBundledRuntime, match="expert parameters"):
        utils.split_params_into_different_moe_groups_for_optimizer(group)


def test_add_config_arguments_as_the_examples_call_it():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    assert ds.add_config_arguments(parser) is parser
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json", "--local_rank", "0"])
    assert (args.deepspeed, args.deepspeed_config, args.local_rank) == (True, "ds.json", 0)


def test_repeating_loader_and_real_accelerator_paths():
    real = pytest.importorskip("deepspeed.runtime.dataloader")
    ours = importlib.import_module(f"{COMPAT}.runtime.dataloader").RepeatingLoader
    assert ds.utils.RepeatingLoader is ours
    loader = [1, 2, 3]
    a, b = ours(loader), real.RepeatingLoader(loader)
    assert [next(a) for _ in range(7)] == [next(b) for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    path = importlib.import_module(f"{COMPAT}.accelerator.real_accelerator")
    assert path.get_accelerator() is ds.accelerator.get_accelerator() is ds.get_accelerator()
