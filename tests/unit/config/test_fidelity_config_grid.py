"""A grid of configs read by DeepSpeed's own reader (DeepSpeedConfig) and by this one.

Whenever both accept a config they must agree on what it means (batch triple, clipping, stage,
precision); whenever DeepSpeed accepts one that is refused here, the refusal must be one of the
deliberate ones docs/deepspeed.md lists. Skipped without DeepSpeed (there is nothing to compare).
"""

from __future__ import annotations

import json
import logging
import os
import random
import warnings

import pytest

from runtime.config import ConfigError, load_config

VALUES = {
    "train_batch_size": [None, 8, 16, 24, 7, 0, "auto"],
    "train_micro_batch_size_per_gpu": [None, 1, 2, 4, 8, 3],
    "gradient_accumulation_steps": [None, 1, 2, 3, 4],
    "gradient_clipping": [None, 0.0, 1.0, 0.5, -1],
    "steps_per_print": [None, 1, 10, 100],
    "fp16": [
        None,
        {"enabled": True},
        {"enabled": False},
        {"enabled": True, "loss_scale": 128},
        {"enabled": True, "hysteresis": 1, "min_loss_scale": 2},
    ],
    "bf16": [
        None,
        {"enabled": True},
        {"enabled": False},
        {"enabled": True, "check_grad_overflow": False},
    ],
    "zero_optimization": [
        None,
        {"stage": 0},
        {"stage": 1},
        {"stage": 2, "overlap_comm": True},
        {"stage": 3},
        {"stage": 2, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8},
        {"stage": 3, "stage3_prefetch_bucket_size": 1e7, "stage3_param_persistence_threshold": 1e4},
        {"stage": 1, "offload_optimizer": {"device": "cpu"}},
        {"stage": 3, "allgather_sequential": False, "zero_quantized_weights": False},
    ],
    "optimizer": [
        None,
        {"type": "Adam", "params": {"lr": 1e-3}},
        {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},
    ],
    "scheduler": [
        None,
        {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}},
        {
            "type": "OneCycle",
            "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_second_step_size": 0},
        },
    ],
    "flops_profiler": [None, {"enabled": False}],
    "activation_checkpointing": [None, {"partition_activations": False}],
}
# Measured at seed 0: 467 configs both accept and read alike, 2221 both refuse, 128 refused
# here on purpose, 184 accepted here only ("auto" batch sizes).
# Values DeepSpeed accepts that are refused here on purpose (docs/deepspeed.md: differences).
DELIBERATE = ("gradient_clipping must be >= 0",)


def _deepspeed_config():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        pytest.skip("deepspeed is not installed (pip install '.[bench]' to compare with it)")
    logging.getLogger("DeepSpeed").setLevel(logging.CRITICAL)
    return DeepSpeedConfig


def _meaning_ours(config) -> tuple:
    return (
        config.train_batch_size,
        config.train_micro_batch_size_per_gpu,
        config.gradient_accumulation_steps,
        config.gradient_clipping,
        config.zero_optimization.stage,
        config.fp16.enabled,
        config.bf16.enabled,
    )


def _meaning_theirs(config) -> tuple:
    return (
        config.train_batch_size,
        config.train_micro_batch_size_per_gpu,
        config.gradient_accumulation_steps,
        config.gradient_clipping,
        config.zero_optimization_stage,
        config.float16_config.enabled,
        config.bfloat16_config.enabled,
    )


@pytest.mark.slow
def test_configs_both_readers_accept_mean_the_same(monkeypatch):
    DeepSpeedConfig = _deepspeed_config()
    monkeypatch.setenv("WORLD_SIZE", "1")  # DeepSpeedConfig resolves batch sizes at world 1
    rng = random.Random(0)
    counts = {"same": 0, "both refuse": 0, "deliberate": 0, "ours only": 0}
    for _ in range(3000):
        source = {k: rng.choice(v) for k, v in VALUES.items()}
        source = {k: v for k, v in source.items() if v is not None}
        try:
            theirs = DeepSpeedConfig(json.loads(json.dumps(source)))
        except Exception:  # noqa: BLE001 - any refusal of theirs counts as a refusal
            theirs = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ours = load_config(source).resolve(world_size=1)
        except ConfigError as err:
            ours, refusal = None, str(err)
        if theirs is not None and ours is not None:
            assert _meaning_ours(ours) == _meaning_theirs(theirs), source
            counts["same"] += 1
        elif theirs is not None:
            assert any(d in refusal for d in DELIBERATE), (source, refusal)
            counts["deliberate"] += 1
        elif ours is not None:
            # only "auto" batch sizes, which DeepSpeed alone cannot resolve (docs/deepspeed.md)
            assert source.get("train_batch_size") == "auto", source
            counts["ours only"] += 1
        else:
            counts["both refuse"] += 1
    assert counts["same"] > 300, counts
