"""A Hugging Face model's config, kept in the manifest of every checkpoint of it.

``zlaunch convert --to hf`` then writes a folder ``from_pretrained`` loads with nothing else:
the ``config.json`` (and ``generation_config.json``) come from the checkpoint itself, as
``save_pretrained`` would have written them.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["hf_configs"]


def _as_json(config: Any) -> dict | None:
    to_json = getattr(config, "to_json_string", None)
    if to_json is None:
        return None
    try:
        return json.loads(to_json(use_diff=True))
    except (TypeError, ValueError):
        return None  # a config that cannot say itself as JSON: convert asks for --hf-config


def hf_configs(module: Any) -> dict[str, dict]:
    """``{"hf_config": ..., "hf_generation_config": ...}`` of a PreTrainedModel, or ``{}``."""
    if not hasattr(module, "save_pretrained") or not hasattr(module, "config"):
        return {}
    config = _as_json(module.config)
    if config is None or "model_type" not in config:
        return {}
    out = {"hf_config": config}
    generation = _as_json(getattr(module, "generation_config", None))
    if generation:
        out["hf_generation_config"] = generation
    return out
