"""Convert a checkpoint of any readable format (this runtime's, DeepSpeed's) to another.

`convert(src, dst, to=...)` needs no process group and no engine; ``to`` is one of `TARGETS`:

* ``zlaunch``: this runtime's sharded format, optimizer state and all (`native`);
* ``hf``: a Hugging Face model folder for ``from_pretrained`` (`hf`);
* ``dcp``: torch distributed checkpoint files (`dcp`);
* ``safetensors``: one safetensors state dict (what ``zlaunch consolidate`` writes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import CheckpointError
from ..formats import detect_format, locate, open_checkpoint
from .plan import export_plan, read_entry
from .safetensors_stream import SafetensorsStream, tensor_bytes

__all__ = ["convert", "ConvertResult", "TARGETS", "DTYPES"]

TARGETS = ("zlaunch", "hf", "dcp", "safetensors")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

Progress = Callable[[int], Callable[[int], None]]
"""Given the bytes to write, a function called with the bytes of each tensor written."""


@dataclass(frozen=True)
class ConvertResult:
    source: str
    source_format: str
    output: str
    files: list[str]
    tensors: int
    bytes: int
    excluded_frozen: list[str]


def _hf_config(reader, given: str | None) -> tuple[dict, dict | None]:
    from .hf import read_hf_config

    if given:
        return read_hf_config(given)
    saved = reader.state("hf_config")
    if saved:
        return dict(saved), reader.state("hf_generation_config")
    raise CheckpointError(
        f"{reader.path} does not record a Hugging Face config (the model was not a "
        "PreTrainedModel, or the checkpoint is DeepSpeed's); pass --hf-config with the "
        "model's config.json (or the folder holding it)"
    )


def _write_safetensors(reader, output: str, dtype, progress) -> list[str]:
    if os.path.isdir(output):
        raise CheckpointError(f"{output} is a directory; give a file name, e.g. model.safetensors")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise CheckpointError(f"cannot write {output}: {parent} is not a directory")
    plan = export_plan(reader, dtype, with_aliases=True)
    meta = {"format": "pt", "source": reader.path, "dtype": str(dtype).removeprefix("torch.")}
    with SafetensorsStream(output, [(e.name, e.shape, e.dtype) for e in plan], meta) as out:
        for e in plan:
            out.write(e.name, read_entry(reader, e))
            progress(tensor_bytes(e.shape, e.dtype))
    return [os.path.abspath(output)]


def convert(
    src: str,
    dst: str,
    to: str,
    *,
    tag: str | None = None,
    dtype: str = "fp32",
    hf_config: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
    progress: Progress = lambda total: lambda n: None,
) -> ConvertResult:
    if to not in TARGETS:
        raise CheckpointError(f"--to must be one of {', '.join(TARGETS)}, got {to!r}")
    path = locate(src, tag)
    with open_checkpoint(path) as reader:
        fmt = detect_format(path) or "unknown"
        torch_dtype = DTYPES[dtype]
        plan = export_plan(reader, torch_dtype, with_aliases=to != "hf")
        total = sum(tensor_bytes(e.shape, e.dtype) for e in plan)
        advance = progress(total)
        if to == "hf":
            from .hf import write_hf

            config, generation = _hf_config(reader, hf_config)
            files = write_hf(reader, dst, config, generation, torch_dtype, max_shard_bytes, advance)
        elif to == "dcp":
            from .dcp import write_dcp

            files = write_dcp(reader, dst, torch_dtype, advance)
        elif to == "safetensors":
            files = _write_safetensors(reader, dst, torch_dtype, advance)
        else:
            from .native import write_native

            if dtype != "fp32":
                raise CheckpointError(
                    "--to zlaunch keeps the fp32 master weights; leave --dtype out"
                )
            files = [write_native(reader, dst, os.path.basename(path), advance)]
        excluded = list(reader.state("excluded_frozen") or [])
    return ConvertResult(path, fmt, os.path.abspath(dst), files, len(plan), total, excluded)
