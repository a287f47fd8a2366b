"""Config files DeepSpeed reads are read here (hjson: comments, trailing commas), hostile files
end in one ConfigError (exit 2 from zlaunch, no traceback), and what DeepSpeed would silently
ignore (unknown keys, enabled features this runtime lacks, optimizers it cannot build) is
refused before launch.

Where DeepSpeed is installed, its own config reader (DeepSpeedConfig) reads the same files.
"""

from __future__ import annotations

import copy
import os
import tracemalloc

import pytest

from runtime.config import ConfigError, load_config

HJSON_TEXT = """{
  // DeepSpeed's reader is hjson: comments and trailing commas are fine
  "train_batch_size": 24,   # another comment
  /* a block comment */
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": 2,},
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95,],},},
}
"""


def deepspeed_config_class():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        return None
    return DeepSpeedConfig


def deepspeed_or_skip():
    DeepSpeedConfig = deepspeed_config_class()
    if DeepSpeedConfig is None:
        pytest.skip("deepspeed is not installed (pip install '.[test]' brings it)")
    return DeepSpeedConfig


def error_of(source) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source)
    return str(info.value)


# --- hjson ---------------------------------------------------------------------------------------


def test_comments_and_trailing_commas_load_as_in_deepspeed(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(HJSON_TEXT)
    ours = load_config(path).resolve(world_size=1)
    assert (ours.train_batch_size, ours.gradient_clipping) == (24, 0.5)
    assert ours.zero_optimization.stage == 2
    assert ours.optimizer.params == {"lr": 1e-3, "betas": [0.9, 0.95]}


def test_deepspeed_reads_the_same_hjson_file(tmp_path):
    DeepSpeedConfig = deepspeed_or_skip()
    path = tmp_path / "ds.json"
    path.write_text(HJSON_TEXT)
    ours = load_config(path).resolve(world_size=1)
    theirs = DeepSpeedConfig(str(path))
    assert (theirs.train_batch_size, theirs.gradient_clipping) == (24, 0.5)
    assert theirs.zero_optimization_stage == 2 and theirs.optimizer_params == ours.optimizer.params


def test_duplicates_and_suggestions_survive_hjson(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(
        '{"train_batch_size": 8, // c\n "zero_optimization": {"stage": 1, "stage": 2,}}'
    )
    assert error_of(path) == (
        f"{path}: zero_optimization.stage is given more than once; a later value would silently "
        "replace an earlier one, so keep exactly one"
    )
    path.write_text('{"train_batch_size": 8, "zero_optimization": {"stge": 1,},}')
    assert error_of(path).endswith(
        "zero_optimization.stge is not a valid key; did you mean 'stage'?"
    )


def test_deepspeed_refuses_duplicate_keys_too(tmp_path):
    DeepSpeedConfig = deepspeed_or_skip()
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ValueError, match="Duplicate"):
        DeepSpeedConfig(str(path))  # DeepSpeed refuses duplicates too


def test_yaml_still_loads(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text("train_batch_size: 8\nbf16:\n  enabled: true\n  check_grad_overflow: false\n")
    config = load_config(path)
    assert config.precision == "bf16" and config.bf16.check_grad_overflow is False


# --- hostile files: one ConfigError, bounded ------------------------------------------------------


def _alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def _merge_bomb(levels: int = 9) -> str:
    lines = ["m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9}"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*m{i - 1}"] * 9)
        lines.append(f"m{i}: &m{i} {{<<: [{refs}], k{i}: 0}}")
    return "\n".join(lines) + "\n"


HOSTILE = [
    ("bomb.yaml", _alias_bomb(), "holds more than 100000 values once aliases are expanded"),
    ("merge.yaml", _merge_bomb(), "holds more than 100000 values once aliases are expanded"),
    ("listkey.yaml", "? [a, b]\n: 1\n", "a mapping key must be a name, not a list (line 1)"),
    ("dictkey.yaml", "? {a: 1}\n: 1\n", "a mapping key must be a name, not a mapping (line 1)"),
    ("recursive.yaml", "a: &a [1, *a]\n", "an alias refers to a node that contains it"),
    ("recmap.yaml", "a: &a {b: *a}\n", "an alias refers to a node that contains it"),
    ("deep.json", '{"a": ' + "[" * 5000 + "]" * 5000 + "}", "is nested too deeply to read"),
    ("deep2.json", '{"a": ' + "[" * 100 + "]" * 100 + "}", "is nested more than 64 levels deep"),
    # refused while scanning, at the 65th bracket, not by Python's recursion limit
    ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n", "line 1: nested more than 64 levels"),
    ("bigint.json", '{"train_batch_size": ' + "7" * 5000 + "}", "4300 digits"),
    ("bigint.yaml", "train_batch_size: " + "7" * 5000 + "\n", "4300 digits"),
    ("hexint.yaml", "train_batch_size: 0x" + "f" * 5000 + "\n", "an integer of 20000 bits"),
    (
        "optauto.json",
        '{"train_batch_size": 2, "optimizer": {"type": "auto"}}',
        'optimizer.type is "auto", which nothing resolves here',
    ),
    (
        "schedlist.json",
        '{"train_batch_size": 2, "scheduler": {"type": ["WarmupLR"]}}',
        "scheduler.type must be one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, "
        'LRRangeTest, got ["WarmupLR"]',
    ),
    (
        "schedauto.json",
        '{"train_batch_size": 2, "scheduler": {"type": "auto"}}',
        'scheduler.type is "auto"',
    ),
]


@pytest.mark.parametrize(("name", "text", "words"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_files_end_in_one_config_error_in_bounded_memory(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_text(text)
    tracemalloc.start()
    try:
        message = error_of(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message.startswith(f"{path}: ") and words in message, message
    assert len(message) < 400 and "\n" not in message
    # The 414-byte alias bomb of the issue took 633 MiB; parsing is linear in the file now.
    assert peak < 64 * 2**20 + 200 * len(text), peak


def _block(levels: int, leaf: str = "1") -> str:
    """Mappings nested ``levels`` deep under the top one, by indentation."""
    return "".join("  " * i + f"k{i}:\n" for i in range(levels)) + "  " * levels + f"x: {leaf}\n"


def _flow(levels: int) -> str:
    return "a: " + "[" * levels + "]" * levels + "\n"


def _mixed(levels: int) -> str:
    """Half the levels block mappings, the rest flow brackets inside them."""
    flow = levels - levels // 2
    return _block(levels // 2, "[" * flow + "]" * flow)


@pytest.mark.parametrize("shape", [_block, _flow, _mixed], ids=["block", "flow", "mixed"])
def test_yaml_nesting_is_refused_just_past_the_bound_and_read_at_it(tmp_path, shape):
    """The bound is applied while scanning (a file of 5,000 brackets stops at the 65th) and
    lands on the same depth as the check of the composed document: 64 reads, 65 does not."""
    from runtime.config.files import MAX_DEPTH, read_file

    path = tmp_path / "deep.yaml"
    path.write_text(shape(MAX_DEPTH))
    assert read_file(path, str(path))
    path.write_text(shape(MAX_DEPTH + 1))
    with pytest.raises(ConfigError, match=f"nested more than {MAX_DEPTH} levels deep"):
        read_file(path, str(path))


def test_huge_integers_are_refused_not_printed():
    message = error_of({"zero_optimization": {"stage": 2, "reduce_bucket_size": 10**6000}})
    assert message == (
        "zero_optimization.reduce_bucket_size is an integer of 19932 bits; config values fit "
        "in 64 bits"
    )


def test_a_mapping_that_contains_itself_is_refused():
    loop: dict = {"train_batch_size": 2}
    loop["tensorboard"] = loop
    assert "contains itself" in error_of(loop)


# --- refused before launch --------------------------------------------------------------------------


REFUSED = [
    ({"gradient_clipings": 1.0}, "gradient_clipings is not a DeepSpeed config key; did you mean"),
    ({"comet": {"enabled": True}}, "comet is enabled but not supported"),
    ({"flops_profiler": {"enabled": True, "top_module": 3}}, "did you mean 'top_modules'?"),
    ({"optimizer": {"type": "Lamb"}}, "optimizer.type 'Lamb' is not supported by this runtime"),
    ({"optimizer": {"type": "OneBitAdam"}}, "'OneBitAdam' is not supported by this runtime"),
    ({"optimizer": {"type": "AdamW8bit"}}, "'AdamW8bit' is not supported by this runtime"),
    (
        {"optimizer": {"type": "AdamW", "params": {"betas": 0.9}}},
        "optimizer.params.betas must be a list of two numbers such as [0.9, 0.999], got 0.9",
    ),
    (
        {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "momentum": 0.9}}},
        "optimizer.params.momentum is not a parameter of AdamW",
    ),
    ({"optimizer": {"type": "Adamw2"}}, "'Adamw2' is not an optimizer this runtime can build"),
]


@pytest.mark.parametrize(("extra", "words"), REFUSED)
def test_refused_in_the_config_reader(extra, words):
    assert words in error_of({"train_batch_size": 2, **extra})


DISABLED_BLOCKS = {
    "train_batch_size": 2,
    "flops_profiler": {"enabled": False},
    "wandb": {"enabled": False},
    "csv_monitor": {"enabled": False},
    "comms_logger": {"enabled": False},
    "activation_checkpointing": {"partition_activations": False},
    "wall_clock_breakdown": False,
    "checkpoint": {"load_universal": False, "tag_validation": "Warn"},
    "compile": {"deepcompile": False},
    "timers": {"throughput": {"enabled": True}},
    "disable_allgather": False,
    "dump_state": False,
    "memory_breakdown": False,
    "prescale_gradients": False,
    "gradient_predivide_factor": 1.0,
    "communication_data_type": None,
    "tensorboard": {"enabled": False},
    "comet": {"enabled": False},
    "autotuning": {"enabled": False},
    "data_efficiency": {"enabled": False},
    "hybrid_engine": {"enabled": False},
    "torch_autocast": {"enabled": False},
    "zero_allow_untested_optimizer": True,
    "managed_gradient_accumulation": True,
    "gradient_allreduce_op": "mean",
    "disable_python_gc": False,
    "tensor_parallel": {"autotp_size": 0},
    "pipeline": {"stages": "auto"},
    "aio": {"block_size": 1048576},
    "seq_parallel_communication_data_type": "fp32",
    "data_types": {"grad_accum_dtype": None},
    "zero_force_ds_cpu_optimizer": True,
    "expert_parallel": {"enabled": False},
}


def test_disabled_blocks_deepspeed_accepts_are_accepted():
    load_config(copy.deepcopy(DISABLED_BLOCKS))


def test_deepspeed_accepts_the_same_disabled_blocks():
    DeepSpeedConfig = deepspeed_or_skip()
    DeepSpeedConfig(copy.deepcopy(DISABLED_BLOCKS))


REMOVED_IN_DEEPSPEED = {
    "amp": {"enabled": False},
    "nebula": {"enabled": False},
    "curriculum_learning": {"enabled": False},
    "progressive_layer_drop": {"enabled": False},
    "eigenvalue": {"enabled": False},
    "compression_training": {},
    "sparse_gradients": False,
    "elasticity": {"enabled": False},
}


@pytest.mark.parametrize("key", sorted(REMOVED_IN_DEEPSPEED))
def test_blocks_deepspeed_removed_are_accepted_here_while_disabled(key):
    """DeepSpeed 0.19.8 refuses these blocks even disabled (the features were removed); here a
    disabled one is accepted, an enabled one refused (docs/deepspeed.md: differences)."""
    load_config({"train_batch_size": 2, key: REMOVED_IN_DEEPSPEED[key]})


@pytest.mark.parametrize("key", sorted(REMOVED_IN_DEEPSPEED))
def test_deepspeed_refuses_the_removed_blocks_even_disabled(key):
    DeepSpeedConfig = deepspeed_or_skip()
    with pytest.raises(Exception, match="removed|no longer supported"):
        DeepSpeedConfig({"train_batch_size": 2, key: REMOVED_IN_DEEPSPEED[key]})


def test_deepspeed_ignores_what_is_refused_here():
    """The other reading: DeepSpeed accepts an unknown key silently (a misspelt
    gradient_clipping trains unclipped) - the reason this runtime refuses it."""
    DeepSpeedConfig = deepspeed_or_skip()
    theirs = DeepSpeedConfig({"train_batch_size": 2, "gradient_clipings": 0.5})
    assert theirs.gradient_clipping != 0.5


# --- through the real zlaunch command -----------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        {"x" * 10_000_000: 1},
        {"zero_optimization": {"y" * 10_000_000: 1}},
        {"zero_optimization": {"stage": "s" * 10_000_000}},
        {"optimizer": {"type": "A" * 10_000_000}},
        {"optimizer": {"type": "AdamW", "params": {"z" * 10_000_000: 1}}},
        {"scheduler": {"type": "W" * 10_000_000}},
    ],
)
def test_a_huge_key_or_value_is_not_repeated_in_the_message(source):
    # The clipped key or value and, for an unknown key, the list of valid keys (about 520
    # characters for zero_optimization's): far below the 10 MB given.
    assert len(error_of(source)) < 800


def _deepspeed_models():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.runtime import precision_config
        from deepspeed.runtime.zero import config, offload_config
    except ImportError:
        pytest.skip("deepspeed is not installed (pip install '.[bench]' to compare with it)")
    return [
        ("zero_optimization", config.DeepSpeedZeroConfig, {"stage": 3}),
        ("offload_optimizer", offload_config.DeepSpeedZeroOffloadOptimizerConfig, None),
        ("offload_param", offload_config.DeepSpeedZeroOffloadParamConfig, None),
        ("fp16", precision_config.DeepSpeedFP16Config, {}),
        ("bf16", precision_config.DeepSpeedBF16Config, {}),
    ]


def test_every_key_of_deepspeeds_blocks_is_known_at_its_default():
    """Each field (and alias) of DeepSpeed's own config models, at DeepSpeed's default value, is
    read here without error: a config DeepSpeed accepts is never refused for a key name."""
    checked = 0
    for block, model, base in _deepspeed_models():
        for name, field in model.model_fields.items():
            default = field.default
            default = getattr(default, "value", default)  # enums
            if not isinstance(default, (bool, int, float, str, type(None))):
                default = None
            for key in {name, field.alias} - {None}:
                if base is None:  # an offload block, inside zero_optimization
                    source = {"zero_optimization": {"stage": 3, block: {key: default}}}
                else:
                    source = {block: {**base, key: default}}
                try:
                    load_config({"train_batch_size": 1, **source})
                except ConfigError as err:
                    pytest.fail(f"{block}.{key} = {default!r}: {err}")
                checked += 1
    assert checked > 60
