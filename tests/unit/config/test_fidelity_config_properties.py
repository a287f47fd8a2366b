"""Property tests of the config reader: whatever the input, it returns a Config or raises the
project's ConfigError (one line, naming the file), never another exception.

Inputs are drawn near the real schema (DeepSpeed's keys with values of every JSON type), as
arbitrary text in a .json or .yaml file, and as YAML built from anchors and aliases.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.config import Config, ConfigError, load_config

KEYS = [
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "fp16",
    "bf16",
    "optimizer",
    "scheduler",
    "zero_optimization",
    "tensorboard",
    "flops_profiler",
    "data_types",
    "checkpoint",
    "enabled",
    "stage",
    "type",
    "params",
    "lr",
    "betas",
    "offload_optimizer",
    "device",
    "cycle_min_lr",
    "cycle_max_lr",
    "cycle_min_mom",
    "warmup_num_steps",
    "check_grad_overflow",
    "auto",
    "Adam",
    "OneCycle",
    "unknown_key",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(KEYS + ["cpu", "none", "nvme", "log", "linear", ""]),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
    ),
    max_leaves=30,
)
configs = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)

SETTINGS = settings(
    # 300 keeps CI to seconds; FIDELITY_EXAMPLES=3000 for a deeper local run (90 s here).
    max_examples=int(os.environ.get("FIDELITY_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _only_config_errors(source, origin="ds.json") -> None:
    try:
        result = load_config(source, origin=origin)
    except ConfigError as err:
        message = str(err)
        assert message.startswith(f"{origin}: ") or origin is None
        assert "\n" not in message and len(message) < 2000
    else:
        assert isinstance(result, Config)


@SETTINGS
@given(configs)
def test_mappings_near_the_schema(source):
    _only_config_errors(source)


@SETTINGS
@given(st.text(max_size=300), st.sampled_from([".json", ".yaml"]))
def test_arbitrary_text_files(text, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"ds{suffix}"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        _only_config_errors(path, origin=str(path))


@SETTINGS
@given(configs)
def test_json_text_of_mappings(source):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ds.json"
        path.write_text(json.dumps(source, allow_nan=True))
        _only_config_errors(path, origin=str(path))


@st.composite
def yaml_with_aliases(draw) -> str:
    """Anchored lists and mappings, each referring to earlier anchors (or itself)."""
    lines = []
    count = draw(st.integers(min_value=1, max_value=8))
    for i in range(count):
        refs = draw(st.lists(st.integers(min_value=0, max_value=i), min_size=1, max_size=9))
        items = ", ".join(f"*a{r}" if r < i or draw(st.booleans()) else "1" for r in refs)
        if draw(st.booleans()):
            lines.append(f"k{i}: &a{i} [{items}]")
        else:
            lines.append(
                f"k{i}: &a{i} {{<<: [{items}], x{i}: 1}}" if i else f"k{i}: &a{i} {{x: 1}}"
            )
    return "\n".join(lines) + "\n"


@SETTINGS
@given(yaml_with_aliases())
def test_yaml_aliases(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ds.yaml"
        path.write_text(text)
        _only_config_errors(path, origin=str(path))
