"""`zlaunch consolidate CKPT_DIR [--tag T] -o model.safetensors [--dtype fp32|bf16|fp16]`.

Turns a sharded checkpoint (any world size, any ZeRO stage) into one safetensors state dict
that ``model.load_state_dict`` takes, on one machine, without torch.distributed or the engine.
CKPT_DIR is the save directory (its ``latest``, or ``--tag``) or one checkpoint's directory.
A bad checkpoint is one line naming the file (exit 1), never a traceback.
"""

from __future__ import annotations

import os
import time

import click

from zlaunch.errors import UsageError, ZlaunchError

__all__ = ["command"]

EXIT_BAD_CHECKPOINT = 1


@click.command(name="consolidate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint_dir")
@click.option("--tag", help="Checkpoint tag. Default: the one CKPT_DIR/latest names.")
@click.option("-o", "--output", required=True, help="Output file (.safetensors).")
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "bf16", "fp16"]),
    default="fp32",
    show_default=True,
    help="dtype of the floating-point tensors written.",
)
@click.option("--verify", is_flag=True, help="Check every shard's crc32 first (reads all).")
def command(checkpoint_dir: str, tag: str | None, output: str, dtype: str, verify: bool) -> None:
    """Write the full model state dict of a sharded checkpoint to one file."""
    if not os.path.exists(checkpoint_dir):
        raise UsageError(f"{checkpoint_dir}: no such directory")
    if os.path.isdir(output):
        raise UsageError(
            f"-o {output} is a directory", hint="give a file name, e.g. model.safetensors"
        )
    from runtime.checkpoint import CheckpointError
    from runtime.checkpoint.consolidate import (
        DTYPES,
        consolidate_state_dict,
        locate,
        write_state_dict,
    )
    from runtime.checkpoint.reader import CheckpointReader

    start = time.perf_counter()
    try:
        if verify:
            with CheckpointReader(locate(checkpoint_dir, tag)) as reader:
                reader.verify_checksums()
        state, path = consolidate_state_dict(checkpoint_dir, tag, DTYPES[dtype])
        write_state_dict(state, output, {"format": "pt", "source": path, "dtype": dtype})
        with CheckpointReader(path) as reader:
            excluded = reader.state("excluded_frozen") or []
    except CheckpointError as err:
        raise ZlaunchError(str(err), exit_code=EXIT_BAD_CHECKPOINT) from None
    numel = sum(t.numel() for t in state.values())
    click.echo(
        f"wrote {output}: {len(state)} tensors, {numel:,} elements ({dtype}) from {path} "
        f"in {time.perf_counter() - start:.2f}s"
    )
    if excluded:
        click.echo(
            f"note: {len(excluded)} frozen parameter(s) are not in it (saved with "
            f"exclude_frozen_parameters, e.g. {excluded[0]}); take them from the base model",
            err=True,
        )
