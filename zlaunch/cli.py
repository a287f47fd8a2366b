"""Command line entry point.

`zlaunch [OPTIONS] SCRIPT [ARGS]...` launches a job; `zlaunch <command>` runs one of the
subcommands below. Subcommands live in `zlaunch/commands/<name>.py` and are imported only
when invoked, so `zlaunch --help` stays fast (no torch, fabric or rich at import time).
"""

from __future__ import annotations

import importlib
import sys

import click

from zlaunch import __version__
from zlaunch.errors import ZlaunchError

__all__ = ["main", "cli"]

# name -> (module under zlaunch.commands, one-line help shown by `zlaunch --help`)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "Launch SCRIPT on every slot of every host (the default command)."),
    "agent": ("agent", "A node's agent that dials in to a controller (--launcher dialin)."),
    "check": ("check", "Preflight every host: ssh, python, zlaunch, torch, GPUs, cwd, port."),
    "estimate": ("estimate", "Model-state memory per GPU and per node for each ZeRO stage."),
    "ls": ("ls", "List runs: id, start, hosts, ranks, status, last step."),
    "logs": ("logs", "Print or follow the output of any rank of a run, tagged [host:rank]."),
    "status": ("status", "A run's state, last metrics, and every rank: alive or how it ended."),
    "stop": ("stop", "Stop a running job (every rank, as on Ctrl-C)."),
    "stacks": ("stacks", "Every rank's Python stacks, grouped: where a running job is stuck."),
    "plot": ("plot", "Plot loss, lr, throughput and loss scale of a run to a PNG."),
    "k8s": ("k8s", "Kubernetes: print the objects of a job whose agents dial in from pods."),
    "consolidate": ("consolidate", "One full state dict (safetensors) from a sharded checkpoint."),
    "convert": (
        "convert",
        "A checkpoint (ours or DeepSpeed's) as zlaunch, hf, dcp or safetensors.",
    ),
}
DEFAULT_COMMAND = "run"


class LazyGroup(click.Group):
    """A group whose subcommands are imported on use, with `run` as the default command.

    `zlaunch train.py ...` and `zlaunch --hostfile h train.py` both mean `zlaunch run ...`:
    anything that is not a known subcommand name (or a group-level flag) goes to `run`.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module_name, _ = SUBCOMMANDS[name]
        module = importlib.import_module(f"zlaunch.commands.{module_name}")
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        group_flags = {"--help", "-h", "--version"}
        if args and args[0] not in SUBCOMMANDS and args[0] not in group_flags:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=False,
)
@click.version_option(__version__, prog_name="zlaunch")
def cli() -> None:
    """zlaunch: launch, watch and stop distributed PyTorch training.

    \b
    zlaunch --hostfile hosts train.py --config ds.json
    zlaunch train.py --config ds.json        (localhost, one rank per GPU or 1 on CPU)
    """


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; render any ZlaunchError once, without a traceback, and exit with its code."""
    try:
        if argv is None:  # under salloc, run by zlaunch --nodes: the arguments it handed over
            import os

            from zlaunch.commands import take_back

            argv = take_back(sys.argv[1:], os.environ)
        # Without standalone mode click returns ctx.exit()'s code instead of exiting.
        result = cli.main(args=argv, prog_name="zlaunch", standalone_mode=False)
    except ZlaunchError as err:
        click.echo(err.render(), err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    sys.exit(result if isinstance(result, int) else 0)
