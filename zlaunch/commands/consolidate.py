"""`zlaunch consolidate CKPT_DIR [--tag T] -o model.safetensors [--dtype fp32|bf16|fp16]`.

The name `zlaunch convert CKPT_DIR --to safetensors` had first (the same code, plus --verify).

Turns a sharded checkpoint (any world size, any ZeRO stage) into one safetensors state dict
that ``model.load_state_dict`` takes, on one machine, without torch.distributed or the engine.
CKPT_DIR is the save directory (its ``latest``, or ``--tag``) or one checkpoint's directory.
A bad checkpoint is one line naming the file (exit 1), never a traceback.
"""

from __future__ import annotations

import os

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
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
def command(
    checkpoint_dir: str, tag: str | None, output: str, dtype: str, verify: bool, force: bool
) -> None:
    """Write the full model state dict of a sharded checkpoint to one file."""
    if not os.path.exists(checkpoint_dir):
        raise UsageError(f"{checkpoint_dir}: no such directory")
    if os.path.isdir(output):
        raise UsageError(
            f"-o {output} is a directory", hint="give a file name, e.g. model.safetensors"
        )
    if verify:
        from runtime.checkpoint import CheckpointError, CheckpointReader
        from runtime.checkpoint.formats import NATIVE, detect_format, locate

        try:
            path = locate(checkpoint_dir, tag)
            if detect_format(path) == NATIVE:
                with CheckpointReader(path) as reader:
                    reader.verify_checksums()
        except CheckpointError as err:
            raise ZlaunchError(str(err), exit_code=EXIT_BAD_CHECKPOINT) from None
    from zlaunch.commands.convert import run_convert

    run_convert(checkpoint_dir, output, "safetensors", tag, dtype, force=force)
