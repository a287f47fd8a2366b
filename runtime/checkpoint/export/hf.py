"""A checkpoint as a Hugging Face model folder that ``from_pretrained(DST)`` loads alone.

Sharded safetensors (``model-0000i-of-0000n.safetensors``, each with ``format: pt`` metadata),
``model.safetensors.index.json`` (``weight_map``, ``total_size``), ``config.json`` and, when
there is one, ``generation_config.json``. Tied weights are written once, under the name the
model owns (its ``aliases`` are left out, as transformers expects). The config comes from the
checkpoint (the engine records a `PreTrainedModel`'s config at every save) or from the user
(``--hf-config``); its ``dtype`` is set to the dtype written. Tensors are streamed: memory
holds one tensor at a time. The folder is written privately and switched in whole
(`target.folder_output`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import torch

from ..errors import CheckpointError
from ..held_dir import HeldDir
from .plan import Entry, export_plan, read_entry
from .safetensors_stream import SafetensorsStream, tensor_bytes

__all__ = ["write_hf", "read_hf_config", "INDEX"]

INDEX = "model.safetensors.index.json"


def read_hf_config(path: str) -> tuple[dict, dict | None]:
    """(config, generation config or None) from a config.json or a folder holding one."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
        generation = None
        gen_file = os.path.join(folder, "generation_config.json")
        if os.path.isfile(gen_file):
            with open(gen_file, encoding="utf-8") as f:
                generation = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read the model config {file}: {err}") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise CheckpointError(f"{file} is not a Hugging Face config.json (no model_type)")
    return config, generation


def _shards(plan: list[Entry], max_bytes: int) -> list[list[Entry]]:
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in plan:
        n = tensor_bytes(e.shape, e.dtype)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    return shards


def _json(value: dict) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_hf(
    reader,
    folder: HeldDir,
    config: dict,
    generation: dict | None,
    dtype: torch.dtype,
    max_shard_bytes: int,
    progress: Callable[[int], None] = lambda n: None,
) -> list[str]:
    """Write the model into ``folder`` (the private folder `target.folder_output` switches
    in); returns the files written. ``progress(bytes)`` after each tensor."""
    plan = export_plan(reader, dtype, with_aliases=False)
    shards = _shards(plan, max_shard_bytes)
    names, weight_map = [], {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        spec = [(e.name, e.shape, e.dtype) for e in shard]
        with SafetensorsStream(folder, name, spec, {"format": "pt"}) as out:
            for e in shard:
                out.write(e.name, read_entry(reader, e))
                weight_map[e.name] = name
                progress(tensor_bytes(e.shape, e.dtype))
        names.append(name)
    total = sum(tensor_bytes(e.shape, e.dtype) for e in plan)
    folder.write(INDEX, _json({"metadata": {"total_size": total}, "weight_map": weight_map}))
    config = dict(config)
    dtype_name = str(dtype).removeprefix("torch.")
    config["dtype"] = dtype_name
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype_name
    folder.write("config.json", _json(config))
    names += [INDEX, "config.json"]
    if generation:
        folder.write("generation_config.json", _json(generation))
        names.append("generation_config.json")
    return names
