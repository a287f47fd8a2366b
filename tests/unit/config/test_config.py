"""runtime.config: DeepSpeed keys and defaults, error messages, batch rules, "auto"."""

import json
import pickle
import warnings
from pathlib import Path

import pytest

from runtime.config import (
    AUTO,
    Config,
    ConfigError,
    ConfigWarning,
    FP16Config,
    OffloadConfig,
    SchedulerConfig,
    ZeroConfig,
    load_config,
)

STAGE2_EXAMPLE = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 2,
    "fp16": {
        "enabled": True,
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "optimizer": {
        "type": "Adam",
        "params": {"lr": 1.5e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2},
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 200000000,
        "reduce_scatter": True,
        "reduce_bucket_size": 200000000,
        "overlap_comm": True,
        "contiguous_gradients": True,
    },
}

STAGE3_EXAMPLE_ZERO = {
    "stage": 3,
    "offload_optimizer": {"device": "cpu", "pin_memory": True},
    "offload_param": {"device": "cpu", "pin_memory": True},
    "overlap_comm": True,
    "contiguous_gradients": True,
    "sub_group_size": 1000000000,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1000000000,
    "stage3_max_reuse_distance": 1000000000,
    "stage3_gather_16bit_weights_on_model_save": True,
}


def error_of(source, origin="ds.json"):
    with pytest.raises(ConfigError) as info:
        load_config(source, origin=origin)
    return str(info.value)


def warnings_of(source, origin="ds.json"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(source, origin=origin)
    return config, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


# --- no torch -------------------------------------------------------------------------------


# --- defaults -------------------------------------------------------------------------------


def test_defaults_are_deepspeeds():
    config = load_config({})
    assert config.gradient_clipping == 1.0
    assert config.steps_per_print == 10
    assert config.precision == "fp32"
    assert config.optimizer is None and config.scheduler is None
    assert config.fp16 == FP16Config(
        enabled=False,
        loss_scale=0.0,
        initial_scale_power=16,
        loss_scale_window=1000,
        hysteresis=2,
        consecutive_hysteresis=False,
        min_loss_scale=1.0,
    )
    assert config.fp16.dynamic
    zero = config.zero_optimization
    assert (zero.stage, zero.allgather_partitions, zero.reduce_scatter) == (0, True, True)
    assert zero.allgather_bucket_size == 500_000_000
    assert zero.reduce_bucket_size == 500_000_000
    assert zero.overlap_comm is False
    assert zero.contiguous_gradients is True
    assert zero.round_robin_gradients is False
    assert zero.sub_group_size == 1_000_000_000
    assert zero.stage3_prefetch_bucket_size == 50_000_000
    assert zero.stage3_param_persistence_threshold == 100_000
    assert zero.stage3_max_live_parameters == 1_000_000_000
    assert zero.stage3_max_reuse_distance == 1_000_000_000
    assert zero.stage3_gather_16bit_weights_on_model_save is False
    assert zero.offload_optimizer == OffloadConfig(device="none", pin_memory=True, buffer_count=4)
    assert zero.offload_param.device == "none" and zero.offload_param.buffer_count == 5
    assert config.tensorboard.enabled is False
    assert config.source is None


def test_overlap_comm_default_depends_on_stage():
    for stage, expected in ((0, False), (1, False), (2, False), (3, True)):
        zero = load_config({"zero_optimization": {"stage": stage}}).zero_optimization
        assert zero.overlap_comm is expected
    zero = load_config({"zero_optimization": {"stage": 3, "overlap_comm": False}}).zero_optimization
    assert zero.overlap_comm is False


def test_the_stage2_example_file_is_the_issue_text_verbatim():
    path = Path(__file__).resolve().parents[3] / "examples" / "configs" / "zero2_fp16.json"
    assert json.loads(path.read_text()) == STAGE2_EXAMPLE


def test_user_stage2_example_loads_unchanged():
    config = load_config(STAGE2_EXAMPLE)
    assert config.precision == "fp16"
    assert config.optimizer.type == "Adam"
    assert config.optimizer.params["betas"] == [0.9, 0.999]
    zero = config.zero_optimization
    assert zero.stage == 2 and zero.offload_optimizer.device == "cpu"
    assert zero.reduce_bucket_size == 200_000_000 and zero.overlap_comm is True
    resolved = config.resolve(world_size=2)
    assert resolved.train_batch_size == 64
    assert config.raw == STAGE2_EXAMPLE


def test_user_stage3_example_loads_and_resolves_auto():
    source = {k: v for k, v in STAGE2_EXAMPLE.items() if k != "zero_optimization"}
    source["zero_optimization"] = STAGE3_EXAMPLE_ZERO
    config = load_config(source)
    zero = config.zero_optimization
    assert zero.reduce_bucket_size == AUTO
    assert zero.stage3_prefetch_bucket_size == AUTO
    assert zero.offload_param.device == "cpu"
    assert zero.stage3_gather_16bit_weights_on_model_save is True
    assert not config.is_resolved
    resolved = config.resolve(world_size=4, hidden_size=512)
    assert resolved.is_resolved
    zero = resolved.zero_optimization
    assert zero.reduce_bucket_size == 512 * 512
    assert zero.stage3_prefetch_bucket_size == int(0.9 * 512 * 512) == 235929
    assert zero.stage3_param_persistence_threshold == 5120
    defaults = config.resolve(world_size=4).zero_optimization
    assert defaults.reduce_bucket_size == 500_000_000
    assert defaults.stage3_prefetch_bucket_size == 50_000_000
    assert defaults.stage3_param_persistence_threshold == 100_000


def test_bf16_and_its_alias():
    assert load_config({"bf16": {"enabled": True}}).precision == "bf16"
    assert load_config({"bfloat16": {"enabled": True}}).precision == "bf16"
    message = error_of({"bf16": {"enabled": True}, "bfloat16": {"enabled": False}})
    assert message.startswith("ds.json: bf16 ") and "keep only" in message


def test_fp16_and_bf16_both_enabled_is_an_error():
    message = error_of({"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert message == (
        "ds.json: fp16.enabled and bf16.enabled are both true; enable at most one of them"
    )


# --- errors name file, key and fix ------------------------------------------------------------


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            {"zero_optimization": {"stage": 4}},
            "ds.json: zero_optimization.stage must be 0, 1, 2 or 3, got 4",
        ),
        (
            {"zero_optimization": {"stage": True}},
            "ds.json: zero_optimization.stage must be 0, 1, 2 or 3, got true",
        ),
        (
            {"zero_optimization": {"overlap_comm": "yes"}},
            "ds.json: zero_optimization.overlap_comm must be true or false, got 'yes'",
        ),
        (
            {"zero_optimization": {"reduce_bucket_size": 2.5}},
            'ds.json: zero_optimization.reduce_bucket_size must be an integer or "auto", got 2.5',
        ),
        (
            {"zero_optimization": {"allgather_bucket_size": 0}},
            "ds.json: zero_optimization.allgather_bucket_size must be >= 1, got 0",
        ),
        ({"fp16": {"hysteresis": 0}}, "ds.json: fp16.hysteresis must be >= 1, got 0"),
        ({"fp16": {"loss_scale": -1}}, "ds.json: fp16.loss_scale must be >= 0, got -1"),
        ({"fp16": {"min_loss_scale": 0}}, "ds.json: fp16.min_loss_scale must be > 0, got 0"),
        ({"gradient_clipping": -1}, "ds.json: gradient_clipping must be >= 0, got -1"),
        ({"train_batch_size": 0}, "ds.json: train_batch_size must be >= 1, got 0"),
        (
            {"train_micro_batch_size_per_gpu": "8"},
            "ds.json: train_micro_batch_size_per_gpu must be an integer or \"auto\", got '8'",
        ),
        (
            {"zero_optimization": []},
            "ds.json: zero_optimization must be a mapping of keys to values, got []",
        ),
        (
            {"zero_optimization": {"offload_optimizer": {"device": "gpu"}}},
            "ds.json: zero_optimization.offload_optimizer.device must be one of 'none', 'cpu', 'nvme', got 'gpu'",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            'ds.json: zero_optimization.offload_param.device is "nvme" without "nvme_path": set nvme_path to a directory on a local disk',
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}},
            'ds.json: zero_optimization.offload_optimizer.device is "nvme" without "nvme_path": set nvme_path to a directory on a local disk',
        ),
        ({"optimizer": {"params": {"lr": 1}}}, 'ds.json: optimizer needs a "type" key'),
        (
            {"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}},
            'ds.json: optimizer.params.max_grad_norm is not an optimizer parameter here; remove it and set the top-level "gradient_clipping" key instead',
        ),
        (
            {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}},
            "ds.json: scheduler.params.total_num_steps is required by WarmupDecayLR; add it to params",
        ),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}},
            "ds.json: scheduler.params.warmup_type must be one of 'log', 'linear', got 'cosine'",
        ),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}},
            "ds.json: scheduler.params.warmup_num_steps must be >= 1, got 0",
        ),
    ],
)
def test_error_messages(source, expected):
    assert error_of(source) == expected


def test_unknown_key_in_block_suggests_nearest():
    assert error_of({"zero_optimization": {"stge": 2}}) == (
        "ds.json: zero_optimization.stge is not a valid key; did you mean 'stage'?"
    )
    assert error_of({"fp16": {"loss_scale_windows": 10}}) == (
        "ds.json: fp16.loss_scale_windows is not a valid key; did you mean 'loss_scale_window'?"
    )
    assert error_of({"zero_optimization": {"offload_optimizer": {"devise": "cpu"}}}) == (
        "ds.json: zero_optimization.offload_optimizer.devise is not a valid key; did you mean 'device'?"
    )
    message = error_of({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_rl": 1}}})
    assert message == (
        "ds.json: scheduler.params.warmup_max_rl is not a parameter of WarmupLR; "
        "did you mean 'warmup_max_lr'?"
    )
    message = error_of({"scheduler": {"type": "warmupLR"}})
    assert message.startswith("ds.json: scheduler.type must be one of WarmupLR, ")
    assert "did you mean 'WarmupLR'?" in message
    # Nothing close: list the valid keys.
    message = error_of({"tensorboard": {"zzz": 1}})
    assert message == (
        "ds.json: tensorboard.zzz is not a valid key; valid keys: enabled, job_name, output_path"
    )


def test_error_without_origin_has_no_prefix_and_errors_pickle():
    with pytest.raises(ConfigError) as info:
        load_config({"zero_optimization": {"stage": 7}})
    assert str(info.value) == "zero_optimization.stage must be 0, 1, 2 or 3, got 7"
    assert info.value.key == "zero_optimization.stage"
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value) and isinstance(again, ValueError)


def test_dataclasses_validate_when_built_directly():
    with pytest.raises(ConfigError, match=r"^stage must be 0, 1, 2 or 3, got 5$"):
        ZeroConfig(stage=5)
    with pytest.raises(ConfigError, match="fp16.enabled and bf16.enabled"):
        Config(fp16=FP16Config(enabled=True), bf16=load_config({"bf16": {"enabled": True}}).bf16)
    with pytest.raises(ConfigError, match="^type must be one of"):
        SchedulerConfig(type="Cosine")


# --- numbers --------------------------------------------------------------------------------


def test_integral_floats_accepted_for_int_fields():
    zero = load_config(
        {"zero_optimization": {"reduce_bucket_size": 5e8, "stage": 2.0}}
    ).zero_optimization
    assert zero.reduce_bucket_size == 500_000_000 and type(zero.reduce_bucket_size) is int
    assert zero.stage == 2 and type(zero.stage) is int


# --- files ----------------------------------------------------------------------------------


def test_json_file_and_source(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(STAGE2_EXAMPLE))
    config = load_config(path)
    assert config.source == str(path)
    assert config.zero_optimization.stage == 2


def test_json_with_byte_order_mark(tmp_path):
    path = tmp_path / "ds.json"
    path.write_bytes(b'\xef\xbb\xbf{"train_batch_size": 4}')
    assert load_config(path).train_batch_size == 4


def test_json_duplicate_keys_are_errors(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 8,\n "zero_optimization": {"stage": 1, "stage": 2}}')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: zero_optimization.stage is given more than once; a later value would "
        "silently replace an earlier one, so keep exactly one"
    )
    path.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ConfigError, match=r"ds.json: train_batch_size is given more than once"):
        load_config(path)


def test_yaml_file_duplicates_and_exponent_numbers(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text(
        "train_micro_batch_size_per_gpu: 4\n"
        "optimizer:\n  type: AdamW\n  params:\n    lr: 1e-3\n"
        "zero_optimization:\n  stage: 2\n  reduce_bucket_size: 5e8\n"
    )
    config = load_config(path)
    assert config.optimizer.params["lr"] == 0.001
    assert config.zero_optimization.reduce_bucket_size == 500_000_000
    path.write_text("zero_optimization:\n  stage: 2\n  overlap_comm: true\n  stage: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(
        f"{path}: zero_optimization.stage is given more than once (line 4)"
    )
    yml = tmp_path / "ds.yml"
    yml.write_text("bf16:\n  enabled: true\n")
    assert load_config(yml).precision == "bf16"


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text("fp16: &base\n  enabled: false\ntensorboard:\n  <<: *base\n  enabled: true\n")
    config, notes = warnings_of(path)
    assert config.tensorboard.enabled is True and notes == []


def test_file_errors(tmp_path):
    missing = tmp_path / "nope.json"
    assert error_of(missing, origin=None) == f"{missing}: no such file; check the path"
    bad = tmp_path / "bad.json"
    bad.write_text('{"train_batch_size": 8,\n "fp16": {"enabled": true}} extra')
    message = error_of(bad, origin=None)
    assert message.startswith(f"{bad}: invalid JSON at line 2 column 29")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("a: [1, 2\n")
    assert error_of(bad_yaml, origin=None).startswith(f"{bad_yaml}: invalid YAML at line 2")
    listy = tmp_path / "list.json"
    listy.write_text("[1, 2]")
    assert error_of(listy, origin=None) == (
        f"{listy}: the config must be a mapping of keys to values, got list"
    )


# --- unknown keys and features this runtime does not implement --------------------------------


def test_unknown_top_level_key_is_an_error_with_suggestion():
    message = error_of({"train_micro_batch_size_per_gpu": 2, "gradient_clipings": 0.5})
    assert message == (
        "ds.json: gradient_clipings is not a DeepSpeed config key; "
        "did you mean 'gradient_clipping'?"
    )
    assert error_of({"my_own_key": 1}) == (
        "ds.json: my_own_key is not a DeepSpeed config key; remove it"
    )


def test_common_harmless_keys_are_silent():
    source = {
        "train_micro_batch_size_per_gpu": 2,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "prescale_gradients": False,
        "gradient_predivide_factor": 1.0,
        "communication_data_type": None,
        "activation_checkpointing": {"partition_activations": False, "number_checkpoints": None},
        "flops_profiler": {"enabled": False, "profile_step": 1},
        "comms_logger": {"enabled": False},
        "csv_monitor": {"enabled": False},
        "wandb": {"enabled": False, "project": "x"},
        "autotuning": {"enabled": False},
        "checkpoint": {"tag_validation": "Warn", "load_universal": False},
        "compile": {"deepcompile": False},
        "pipeline": {"stages": "auto"},
        "tensor_parallel": {"autotp_size": 0},
        "elasticity": {"enabled": False},
        "data_efficiency": {"enabled": False, "data_sampling": {"enabled": False}},
        "nebula": {"enabled": False},
        "data_types": {"grad_accum_dtype": "fp16"},
        "seq_parallel_size": 1,
        "steps_per_print": 100,
        "fp16": {"enabled": True, "auto_cast": False},
        "zero_optimization": {
            "stage": 2,
            "load_from_fp32_weights": True,
            "round_robin_gradients": True,
            "zero_quantized_gradients": False,
            "zero_hpz_partition_size": 1,
        },
    }
    config, notes = warnings_of(source)
    assert notes == []
    assert config.steps_per_print == 100


@pytest.mark.parametrize(
    "source, expected",
    [
        ({"seq_parallel_size": 2}, "seq_parallel_size = 2 is not supported"),
        ({"amp": {"enabled": True}}, "amp is enabled but not supported"),
        ({"fp16": {"auto_cast": True}}, "fp16.auto_cast = true is not supported"),
        ({"comet": {"enabled": True}}, "comet is enabled but not supported"),
        ({"autotuning": {"enabled": True}}, "autotuning is enabled but not supported"),
        ({"nebula": {"enabled": True}}, "nebula is enabled but not supported"),
        ({"elasticity": {"enabled": True}}, "elasticity is enabled but not supported"),
        (
            {"data_efficiency": {"data_routing": {"random_ltd": {"enabled": True}}}},
            "data_efficiency is enabled but not supported",
        ),
        (
            {
                "compression_training": {
                    "weight_quantization": {"shared_parameters": {"enabled": True}}
                }
            },
            "compression_training is enabled but not supported",
        ),
        (
            {"checkpoint": {"load_universal": True}},
            "checkpoint.load_universal = true is not supported",
        ),
        (
            {"checkpoint": {"use_node_local_storage": True}},
            "checkpoint.use_node_local_storage = true is not supported",
        ),
        ({"compile": {"deepcompile": True}}, "compile.deepcompile = true is not supported"),
        ({"pipeline": {"stages": 2}}, "pipeline stages = 2 is not supported"),
        ({"tensor_parallel": {"autotp_size": 4}}, "tensor_parallel sets a tensor-parallel size"),
        (
            {"zero_optimization": {"stage": 3, "zeropp_loco_param": {"err_beta": 0.8}}},
            'zero_optimization.zeropp_loco_param = {"err_beta": 0.8} is not supported',
        ),
        (
            {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
            "data_types.grad_accum_dtype = 'fp32' is not supported by this runtime: gradients "
            "accumulate in the training dtype (bf16)",
        ),
    ],
)
def test_enabled_features_that_are_not_implemented_are_refused(source, expected):
    message = error_of(source)
    assert message.startswith(f"ds.json: {expected}"), message
    assert "not supported by this runtime" in message and "\n" not in message


def test_checkpoint_block_async_save_is_checked_before_launch():
    assert load_config({"train_batch_size": 4}).checkpoint.async_save is False
    on = load_config({"train_batch_size": 4, "checkpoint": {"async_save": True}})
    assert on.checkpoint.async_save is True
    kept = load_config({"train_batch_size": 4, "checkpoint": {"tag_validation": "Warn"}})
    assert kept.checkpoint.async_save is False
    message = error_of({"train_batch_size": 4, "checkpoint": {"async_save": "yes"}})
    assert message == "ds.json: checkpoint.async_save must be true or false, got 'yes'", message
    assert "async_save" in error_of({"train_batch_size": 4, "checkpoint": {"async_saves": True}})


def test_offload_the_stage_cannot_use_is_dropped_with_a_warning():
    config, notes = warnings_of(
        {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    )
    assert config.zero_optimization.offload_param.device == "none"
    assert notes == [
        "ds.json: zero_optimization.offload_param only applies to stage 3; ignored at stage 2"
    ]
    config, notes = warnings_of({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    assert config.zero_optimization.offload_optimizer.device == "none"
    assert len(notes) == 1 and "needs stage 1, 2 or 3" in notes[0]


def test_collective_choices_warn_only_where_they_do_not_apply():
    off = {"reduce_scatter": False, "allgather_partitions": False}
    for stage in (1, 2):
        config, notes = warnings_of({"zero_optimization": {"stage": stage, **off}})
        zero = config.zero_optimization
        assert (zero.reduce_scatter, zero.allgather_partitions, notes) == (False, False, [])
    _, notes = warnings_of({"zero_optimization": {"stage": 3, **off}})
    assert notes == [
        "ds.json: zero_optimization.reduce_scatter=false applies to stages 1-2; stage 3 always "
        "reduce-scatters gradients",
        "ds.json: zero_optimization.allgather_partitions=false applies to stages 1-2; stage 3 "
        "always all-gathers parameters",
    ]


def test_deprecated_spellings():
    zero = load_config(
        {
            "zero_optimization": {
                "stage": 3,
                "cpu_offload": True,
                "cpu_offload_param": True,
                "prefetch_bucket_size": 1000,
                "stage3_gather_fp16_weights_on_model_save": True,
            }
        }
    ).zero_optimization
    assert zero.offload_optimizer.device == "cpu" and zero.offload_param.device == "cpu"
    assert zero.stage3_prefetch_bucket_size == 1000
    assert zero.stage3_gather_16bit_weights_on_model_save is True
    assert load_config({"zero_optimization": True}).zero_optimization.stage == 1
    message = error_of(
        {"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}}
    )
    assert message.startswith("ds.json: zero_optimization.prefetch_bucket_size and ")


def test_auto_in_blocks_takes_the_default_and_params_auto_is_dropped():
    source = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "fp16": {"enabled": "auto", "loss_scale": 0},
        "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_max_lr": "auto", "warmup_num_steps": 5},
        },
    }
    config, notes = warnings_of(source)
    assert config.train_batch_size == AUTO and config.gradient_accumulation_steps == AUTO
    assert config.gradient_clipping == 1.0
    assert config.precision == "fp32"
    assert config.optimizer.params == {"weight_decay": 0.1}
    assert config.scheduler.params == {"warmup_num_steps": 5}
    assert config.scheduler.full_params()["warmup_max_lr"] is None
    assert notes == [
        'ds.json: optimizer.params: "auto" for lr is dropped (no trainer fills it in); '
        "the defaults apply",
        'ds.json: scheduler.params: "auto" for warmup_max_lr is dropped (no trainer fills it '
        "in); the defaults apply",
        'ds.json: "auto" for gradient_clipping, fp16.enabled, bf16.enabled has nothing to '
        "resolve it here (no trainer fills it in); the defaults apply",
    ]


# --- batch triple ----------------------------------------------------------------------------


def resolved(world, **batch):
    config = load_config(batch).resolve(world)
    return (
        config.train_batch_size,
        config.train_micro_batch_size_per_gpu,
        config.gradient_accumulation_steps,
    )


def test_batch_all_three_consistent():
    assert resolved(
        2, train_batch_size=16, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2
    ) == (16, 4, 2)


def test_batch_two_derive_the_third_by_floor_division():
    assert resolved(2, train_batch_size=16, train_micro_batch_size_per_gpu=4) == (16, 4, 2)
    assert resolved(2, train_batch_size=16, gradient_accumulation_steps=4) == (16, 2, 4)
    assert resolved(3, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2) == (
        24,
        4,
        2,
    )
    # Floor division that does not come out even is caught by the product check.
    with pytest.raises(ConfigError) as info:
        resolved(3, train_batch_size=20, train_micro_batch_size_per_gpu=2)
    assert str(info.value) == (
        "train_batch_size 20 must equal train_micro_batch_size_per_gpu 2 * "
        "gradient_accumulation_steps 3 * world size 3 (= 18); change one of them, or leave one "
        "of the three keys out so that it is derived"
    )


def test_batch_only_one_given():
    assert resolved(4, train_batch_size=32) == (32, 8, 1)
    assert resolved(4, train_micro_batch_size_per_gpu=3) == (12, 3, 1)
    assert resolved(4, train_micro_batch_size_per_gpu=3, train_batch_size="auto") == (12, 3, 1)


def test_batch_none_or_only_accumulation_is_an_error():
    with pytest.raises(ConfigError, match="set train_micro_batch_size_per_gpu"):
        resolved(2)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps alone cannot derive"):
        resolved(2, gradient_accumulation_steps=4)


def test_batch_mismatch_shows_all_four_numbers_and_the_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps(
            {
                "train_batch_size": 32,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 2,
            }
        )
    )
    with pytest.raises(ConfigError) as info:
        load_config(path).resolve(world_size=2)
    message = str(info.value)
    assert message.startswith(f"{path}: train_batch_size 32 must equal ")
    for number in (
        "32",
        "micro_batch_size_per_gpu 4",
        "gradient_accumulation_steps 2",
        "world size 2",
        "(= 16)",
    ):
        assert number in message
    # A derived micro batch of 0 is reported the same way.
    with pytest.raises(ConfigError, match=r"train_batch_size 4 must equal .* 0 \* .* world size 8"):
        resolved(8, train_batch_size=4)


def test_resolve_rejects_bad_world_size():
    config = load_config({"train_micro_batch_size_per_gpu": 1})
    with pytest.raises(ConfigError, match="world_size must be a positive integer"):
        config.resolve(0)
    with pytest.raises(ConfigError, match="hidden_size must be a positive integer"):
        config.resolve(1, hidden_size=-3)
