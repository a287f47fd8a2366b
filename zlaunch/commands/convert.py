"""`zlaunch convert SRC -o DST --to {zlaunch,hf,dcp,safetensors}`: checkpoints in other formats.

SRC is a save folder (its ``latest``, or ``--tag``) or one checkpoint's folder, of this
runtime or of DeepSpeed (ZeRO 1-3, any data-parallel size): the format is detected. No
process group, no engine: tensors are read one at a time from the shards that hold them.
A bad checkpoint is one line naming the file (exit 1), never a traceback. An output that
holds anything is replaced only with ``--force``, and never by a half-written one (see
docs/checkpoint-files.md).
"""

from __future__ import annotations

import os
import time

import click

from zlaunch.errors import UsageError, ZlaunchError

__all__ = ["command", "run_convert"]

EXIT_BAD_CHECKPOINT = 1
TARGETS = ("zlaunch", "hf", "dcp", "safetensors")


def _size(text: str) -> int:
    units = {"": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper()
    number = t.rstrip("KMGIB")
    unit = t[len(number) :]
    try:
        value = int(float(number) * units[unit])
    except (KeyError, ValueError):
        raise UsageError(
            f"--max-shard-size {text!r}: expected a size like 5GB, 500MB or 2GiB"
        ) from None
    if value <= 0:
        raise UsageError(f"--max-shard-size {text!r} must be positive")
    return value


def run_convert(src: str, output: str, to: str, tag: str | None, dtype: str, **options) -> None:
    """Convert and print one summary line; shared with `zlaunch consolidate`."""
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such directory")
    from runtime.checkpoint import CheckpointError
    from runtime.checkpoint.export import convert
    from zlaunch.console import byte_progress

    start = time.perf_counter()
    try:
        with byte_progress(f"convert -> {to}") as progress:
            result = convert(src, output, to, tag=tag, dtype=dtype, progress=progress, **options)
    except CheckpointError as err:
        raise ZlaunchError(str(err), exit_code=EXIT_BAD_CHECKPOINT) from None
    click.echo(
        f"wrote {output} ({to}): {result.tensors} tensors, {result.bytes:,} bytes ({dtype}) from "
        f"{result.source} ({result.source_format} checkpoint) in "
        f"{time.perf_counter() - start:.2f}s"
    )
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    if result.excluded_frozen:
        click.echo(
            f"note: {len(result.excluded_frozen)} frozen parameter(s) are not in it (saved with "
            f"exclude_frozen_parameters, e.g. {result.excluded_frozen[0]}); take them from the "
            "base model",
            err=True,
        )


@click.command(name="convert", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src")
@click.option("-o", "--output", required=True, help="Output folder (a file for safetensors).")
@click.option("--to", "to", type=click.Choice(TARGETS), required=True, help="Output format.")
@click.option("--tag", help="Checkpoint tag. Default: the one SRC/latest names.")
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "bf16", "fp16"]),
    default="fp32",
    show_default=True,
    help="dtype of the floating-point tensors written (hf, dcp, safetensors).",
)
@click.option(
    "--hf-config",
    help="config.json (or its folder) for --to hf when the checkpoint does not record one "
    "(DeepSpeed checkpoints, models that are not a PreTrainedModel).",
)
@click.option("--max-shard-size", default="5GB", show_default=True, help="--to hf shard size.")
@click.option(
    "--force",
    is_flag=True,
    help="Replace an output that holds anything (hf, dcp: files not the export's own are kept).",
)
def command(src, output, to, tag, dtype, hf_config, max_shard_size, force) -> None:
    """Convert a checkpoint (this runtime's or DeepSpeed's) to another format."""
    options = {"force": force}
    if to == "hf":
        options.update(hf_config=hf_config, max_shard_bytes=_size(max_shard_size))
    elif hf_config:
        raise UsageError("--hf-config is for --to hf")
    if to == "safetensors" and os.path.isdir(output):
        raise UsageError(
            f"-o {output} is a directory", hint="give a file name, e.g. model.safetensors"
        )
    run_convert(src, output, to, tag, dtype, **options)
