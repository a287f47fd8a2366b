"""The bundled ``DeepSpeedEngine``'s DeepSpeed-only queries (precision, ZeRO, batch, the
accumulation boundary, the gradient norm) with DeepSpeed's meaning, and `NotInBundledRuntime`,
never AttributeError, for every other attribute DeepSpeed's engine has. One process, world
size 1; the compatibility package is imported as ``runtime.deepspeed_api.deepspeed``.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.distributed as dist

COMPAT = "runtime.deepspeed_api.deepspeed"
ds = importlib.import_module(COMPAT)
NotInBundledRuntime = importlib.import_module(f"{COMPAT}._missing").NotInBundledRuntime


@pytest.fixture(autouse=True, scope="module")
def single_process_group():
    was = dist.is_initialized()
    yield
    if not was and dist.is_initialized():
        dist.destroy_process_group()


def engine(**extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        **extra,
    }
    eng, *_ = ds.initialize(model=model, config=config)
    return eng


def test_engine_queries_read_the_config_with_deepspeeds_meaning():
    eng = engine(
        bf16={"enabled": True},
        zero_optimization={"stage": 2, "reduce_bucket_size": 1000, "allgather_bucket_size": 2000},
        scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
    )
    assert (eng.bfloat16_enabled(), eng.fp16_enabled()) == (True, False)
    assert eng.zero_optimization() and eng.zero_optimization_stage() == 2
    assert eng.zero_optimization_partition_gradients()
    assert not eng.zero_optimization_partition_weights()
    assert (eng.zero_reduce_bucket_size(), eng.zero_allgather_bucket_size()) == (1000, 2000)
    assert eng.zero_offload_optimizer() is None and eng.zero_offload_param() is None
    assert not eng.zero_cpu_offload()
    assert (eng.gradient_accumulation_steps(), eng.train_micro_batch_size_per_gpu()) == (2, 2)
    assert eng.get_batch_info() == (4, 2, 2) and eng.gradient_clipping() == 0.5
    assert (eng.optimizer_name(), eng.optimizer_params()) == ("adamw", {"lr": 0.01})
    assert (eng.scheduler_name(), eng.scheduler_params()) == ("WarmupLR", {"warmup_num_steps": 3})
    assert eng.get_data_parallel_rank() == 0 and eng.postscale_gradients()
    assert eng.get_global_grad_norm() is None  # no step yet
    x = torch.randn(2, 8)
    boundaries = []
    for _ in range(4):
        boundaries.append(eng.is_gradient_accumulation_boundary())
        eng.backward(eng(x).square().mean())
        eng.step()
    assert boundaries == [False, True, False, True]
    norm = eng.get_global_grad_norm()
    assert isinstance(norm, float) and norm > 0


def test_stage_three_and_offload_queries():
    eng = engine(
        zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}},
    )
    assert eng.zero_optimization_partition_weights() and eng.zero_cpu_offload()
    assert eng.zero_offload_optimizer().device == "cpu" and not eng.bfloat16_enabled()
    assert engine().zero_optimization() is False


def test_deepspeeds_other_engine_attributes_are_named_not_attribute_errors():
    eng = engine()
    for name in ("flops_profiler_enabled", "curriculum_learning_enabled", "monitor", "timers"):
        with pytest.raises(NotInBundledRuntime, match=rf"DeepSpeedEngine\.{name} is not provided"):
            getattr(eng, name)
    # Names DeepSpeed's engine does not have either stay AttributeErrors (hasattr probes).
    assert not hasattr(eng, "_orig_mod") and not hasattr(eng, "no_such_method")
    assert eng.module[0] is eng.module[0] and isinstance(eng.module, torch.nn.Sequential)


def test_every_name_of_deepspeeds_engine_is_served_or_named():
    """The generated list matches the installed DeepSpeed's engine, and each of its names is
    either an attribute of ours or NotInBundledRuntime."""
    real = pytest.importorskip("deepspeed.runtime.engine")
    from tools.deepspeed_census.engine_names import engine_names

    names = importlib.import_module(f"{COMPAT}.runtime.engine_names").DEEPSPEED_ENGINE_NAMES
    version, found = engine_names()
    assert version == "0.19.8" and frozenset(found) == names
    assert {"bfloat16_enabled", "fp16_enabled", "save_16bit_model"} <= names
    assert real.DeepSpeedEngine  # the reference is the installed one
    eng = engine()
    for name in sorted(names):
        try:
            getattr(eng, name)
        except NotInBundledRuntime as err:
            assert f"DeepSpeedEngine.{name} " in str(err)
