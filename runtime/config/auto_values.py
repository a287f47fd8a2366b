"""Values written "auto" in a DeepSpeed config: the ones the Hugging Face Trainer and
accelerate fill in from their own arguments before DeepSpeed reads the config.

The launcher validates a config before any rank starts (`zlaunch run`); a value written "auto"
that an integration fills in cannot be checked yet, so ``load_leaving_autos`` checks
everything else and names what it left to the script. Any other "auto" (an optimizer's type,
say) is nobody's to fill and is checked like any value. No torch: the launcher imports it.
"""

from __future__ import annotations

from collections.abc import Mapping

from runtime.config.files import read_file
from runtime.config.load import load_config
from runtime.config.schema import Config
from runtime.config.values import ConfigError

__all__ = ["FILLED_KEYS", "auto_keys", "filled_by_integrations", "load_leaving_autos"]


def load_leaving_autos(path: str) -> tuple[Config, list[str], list[str]]:
    """The config in ``path``, the dotted keys written "auto" that an integration fills in,
    and the blocks left unchecked. A block whose check fails on a key written "auto"
    (WarmupDecayLR's total_num_steps, which the Trainer fills in) cannot be checked before
    the script fills it: it is checked without that block instead. Any other error is raised
    (ConfigError, naming the file and the key)."""
    data = read_file(path, path)
    autos = [key for key in auto_keys(data) if filled_by_integrations(key)]
    unchecked: list[str] = []
    while True:
        try:
            return load_config(data, origin=path), autos, unchecked
        except ConfigError as err:
            block = (err.key or "").split(".")[0]
            # Only an error about a key written "auto" (or a required key missing beside
            # "auto" siblings in its block) is the script's to fix; anything else is reported.
            missing = err.key is not None and not _has_key(data, err.key)
            left_to_script = err.key in autos or (
                missing and any(a.startswith(f"{block}.") for a in autos)
            )
            if not block or block in unchecked or not left_to_script or block not in data:
                raise
            unchecked.append(block)
            data = {k: v for k, v in data.items() if k != block}


def _has_key(data: object, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


# The "auto" values the Hugging Face integration (transformers' Trainer) and accelerate's
# DeepSpeed plugin fill in from their own arguments before DeepSpeed reads the config. Any other
# "auto" (an optimizer's type, say) is nobody's to fill and is checked like any value.
FILLED_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "fp16.enabled",
        "bf16.enabled",
        "amp.enabled",
        "amp.opt_level",
        "zero_optimization.stage",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "zero_optimization.offload_optimizer.device",
        "zero_optimization.offload_optimizer.nvme_path",
        "zero_optimization.offload_param.device",
        "zero_optimization.offload_param.nvme_path",
    }
)
_FILLED_PREFIXES = ("optimizer.params.", "scheduler.params.")


def filled_by_integrations(key: str) -> bool:
    """Whether a key written "auto" is one the Trainer or accelerate fills in."""
    return key in FILLED_KEYS or key.startswith(_FILLED_PREFIXES)


def auto_keys(raw: object, prefix: str = "") -> list[str]:
    """The dotted key paths whose value is "auto", in file order."""
    found: list[str] = []
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            path = f"{prefix}{key}"
            if value == "auto":
                found.append(path)
            else:
                found.extend(auto_keys(value, path + "."))
    return found
