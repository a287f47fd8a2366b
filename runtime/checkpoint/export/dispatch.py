"""`convert`: any reader's checkpoint written as one of the `TARGETS`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from runtime.checkpoint.errors import CheckpointError
from runtime.checkpoint.formats import detect_format, locate, open_checkpoint

from .plan import export_plan, read_entry
from .safetensors_stream import SafetensorsStream, tensor_bytes
from .target import DCP_OWN, HF_OWN, file_output, folder_output

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
    notes: tuple[str, ...] = ()
    """What the user should know about the output (``latest`` left naming another tag)."""


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


def _write_safetensors(reader, output: str, dtype, progress, force: bool) -> list[str]:
    plan = export_plan(reader, dtype, with_aliases=True)
    meta = {"format": "pt", "source": reader.path, "dtype": str(dtype).removeprefix("torch.")}
    spec = [(e.name, e.shape, e.dtype) for e in plan]
    with (
        file_output(output, force) as (folder, name),
        SafetensorsStream(folder, name, spec, meta) as out,
    ):
        for e in plan:
            out.write(e.name, read_entry(reader, e))
            progress(tensor_bytes(e.shape, e.dtype))
    return [os.path.abspath(output)]


def refuse_overlap(sources: list[str], dst: str) -> None:
    """An output that is the checkpoint read, or a folder holding it, would replace or remove
    the source as it is written: refused. (An output inside the source folder is fine.)"""
    out = os.path.realpath(dst)
    for src in sources:
        src = os.path.realpath(src)
        if src == out or src.startswith(out.rstrip(os.sep) + os.sep):
            raise CheckpointError(
                f"-o {dst} is {'the checkpoint' if src == out else 'a folder holding the checkpoint'} "
                f"being converted ({src}); writing it would replace the source: give an output "
                "outside it"
            )


def convert(
    src: str,
    dst: str,
    to: str,
    *,
    tag: str | None = None,
    dtype: str = "fp32",
    hf_config: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
    force: bool = False,
    progress: Progress = lambda total: lambda n: None,
) -> ConvertResult:
    """Convert the checkpoint ``src`` (a save folder, or one checkpoint's) into ``dst``.
    ``force`` replaces an output that holds anything (see the module's text)."""
    if to not in TARGETS:
        raise CheckpointError(f"--to must be one of {', '.join(TARGETS)}, got {to!r}")
    path = locate(src, tag)
    refuse_overlap([src, path], dst)
    notes: list[str] = []
    with open_checkpoint(path) as reader:
        fmt = detect_format(path) or "unknown"
        torch_dtype = DTYPES[dtype]
        plan = export_plan(reader, torch_dtype, with_aliases=to != "hf")
        total = sum(tensor_bytes(e.shape, e.dtype) for e in plan)
        if to == "hf":
            from .hf import write_hf

            config, generation = _hf_config(reader, hf_config)
            with folder_output(dst, HF_OWN, force) as folder:
                args = (config, generation, torch_dtype, max_shard_bytes, progress(total))
                files = write_hf(reader, folder, *args)
        elif to == "dcp":
            from .dcp import write_dcp

            with folder_output(dst, DCP_OWN, force) as folder:
                files = write_dcp(
                    reader, folder, os.path.abspath(dst), torch_dtype, progress(total)
                )
        elif to == "safetensors":
            files = _write_safetensors(reader, dst, torch_dtype, progress(total), force)
        else:
            from .native import write_native

            if dtype != "fp32":
                raise CheckpointError(
                    "--to zlaunch keeps the fp32 master weights; leave --dtype out"
                )
            out, notes = write_native(reader, dst, os.path.basename(path), progress(total), force)
            files = [out]
        excluded = list(reader.state("excluded_frozen") or [])
    result = (path, fmt, os.path.abspath(dst), files, len(plan), total, excluded, tuple(notes))
    return ConvertResult(*result)
