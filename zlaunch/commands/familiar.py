"""The options `run` and `check` share: host selection, in torchrun's and DeepSpeed's
spellings too, and SSH (`ssh_options`, one decorator so the two commands cannot drift;
``ssh_of`` makes the job's `SshOptions` of them, the files checked to exist).

`--num-gpus/--num_gpus/--nproc-per-node/--nproc_per_node` all mean "the first G slots of each
host". torchrun's `--nnodes N` is taken too, with zlaunch's meaning spelled out where it
differs: zlaunch starts every node itself from one command, so `--nnodes N` picks the first N
hosts of the hostfile (torchrun is run once per node instead), and an elastic `MIN:MAX` range or
a `--node-rank` has no meaning here and is refused with what to do instead.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from zlaunch.errors import UsageError
from zlaunch.text import clip

if TYPE_CHECKING:
    from zlaunch.job import SshOptions

__all__ = [
    "host_selection_options",
    "resolve_nodes",
    "node_range",
    "CONFIG_SUFFIXES",
    "refuse_config_as_script",
    "ssh_options",
    "ssh_of",
    "existing_file",
]

CONFIG_SUFFIXES = (".json", ".yaml", ".yml", ".hjson")

NNODES_HELP = (
    "torchrun's spelling of --num-nodes. zlaunch starts every node from this one command, so it "
    "means the first N hosts of --hostfile (not a count of separately launched nodes). zlaunch run: "
    "MIN:MAX is --min-nodes MIN --max-nodes MAX (the job starts on up to MAX hosts)."
)


def host_selection_options(verb: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """-H/-i/-e, --num-nodes (+ --num_nodes, --nnodes), --num-gpus (+ DeepSpeed/torchrun names).

    `verb` words the help ("Use", "Check"). The decorated command receives `num_nodes`,
    `nnodes` and `node_rank` as given; `resolve_nodes` turns them into one count.
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.option(
                "-H",
                "--hostfile",
                help="Hostfile: one 'HOST slots=N' per line. Default: localhost.",
            ),
            click.option("-i", "--include", help="Only these hosts/slots, e.g. node1:0-3@node2."),
            click.option("-e", "--exclude", help="Skip these hosts/slots, e.g. node2@node1:7."),
            click.option(
                "--num-nodes",
                "--num_nodes",
                "num_nodes",
                type=int,
                help=f"{verb} the first N hosts.",
            ),
            click.option("--nnodes", "nnodes", metavar="N", help=NNODES_HELP),
            click.option(
                "--node-rank",
                "--node_rank",
                "node_rank",
                metavar="N",
                hidden=True,  # refused with a hint: torchrun's per-node launch has no place here
            ),
            click.option(
                "--num-gpus",
                "--num_gpus",
                "--nproc-per-node",
                "--nproc_per_node",
                "num_gpus",
                type=int,
                help=f"{verb} the first G slots of each host (no hostfile: G local workers).",
            ),
        ]
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def resolve_nodes(
    *, num_nodes: int | None, nnodes: str | None, node_rank: str | None, hostfile: str | None
) -> int | None:
    """One node count from --num-nodes or torchrun's --nnodes; torchrun-only usage refused."""
    if node_rank is not None:
        raise UsageError(
            f"--node-rank {clip(node_rank)}: zlaunch starts every node from one command",
            hint="run zlaunch once, on one machine, with --hostfile listing every node "
            "(torchrun is started once per node; zlaunch is not)",
        )
    if nnodes is None:
        return num_nodes
    if num_nodes is not None:
        raise UsageError("--nnodes and --num-nodes mean the same here", hint="give one of them")
    text = nnodes.strip()
    if ":" in text:
        raise UsageError(
            f"--nnodes {clip(nnodes)}: a MIN:MAX range of hosts is for zlaunch run",
            hint="give a count (the first N hosts of --hostfile)",
        )
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or int(text) < 1:
        raise UsageError(f"--nnodes must be a number of hosts (1 or more), got {clip(nnodes)}")
    count = int(text)
    if hostfile is None and count > 1:
        raise UsageError(
            f"--nnodes {count} without --hostfile: zlaunch starts every node itself, "
            "so it needs the hosts listed",
            hint="write a hostfile ('node1 slots=8' per line) and pass --hostfile; unlike "
            "torchrun, zlaunch is run once, not once per node",
        )
    return count


def node_range(
    nnodes: str | None, min_nodes: int | None, max_nodes: int | None
) -> tuple[str | None, int | None, int | None]:
    """torchrun's ``--nnodes MIN:MAX`` as zlaunch's ``--min-nodes MIN --max-nodes MAX``:
    (what is left of --nnodes for `resolve_nodes`, min, max). A count stays a count."""
    if nnodes is None or ":" not in nnodes:
        return nnodes, min_nodes, max_nodes
    low, _, high = nnodes.strip().partition(":")
    bounds = []
    for part in (low, high):
        part = part.strip()
        if not (part.isascii() and part.isdigit() and len(part) <= 6) or int(part) < 1:
            raise UsageError(
                f"--nnodes {clip(nnodes)}: MIN and MAX must be numbers of hosts (1 or more)",
                hint="e.g. --nnodes 2:4",
            )
        bounds.append(int(part))
    low_n, high_n = bounds
    if low_n > high_n:
        raise UsageError(f"--nnodes {clip(nnodes)}: MIN is more than MAX", hint="e.g. --nnodes 2:4")
    for flag, given, meant in (
        ("--min-nodes", min_nodes, low_n),
        ("--max-nodes", max_nodes, high_n),
    ):
        if given is not None and given != meant:
            raise UsageError(
                f"--nnodes {clip(nnodes)} and {flag} {given} disagree",
                hint="give the range once: --nnodes MIN:MAX, or --min-nodes and --max-nodes",
            )
    return None, low_n, high_n


def refuse_config_as_script(script: str) -> None:
    """A config file passed where the script goes would run as Python: refuse it with a hint."""
    if script.lower().endswith(CONFIG_SUFFIXES):
        shell_word = (
            shlex.quote(script) if script.isprintable() and len(script) < 200 else "ds.json"
        )
        raise UsageError(
            f"{clip(script)} looks like a training config, not a Python script",
            hint=f"give the script first and the config with --config: "
            f"zlaunch train.py --config {shell_word} (--no-python runs a program as is)",
        )


def ssh_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--ssh-config, --ssh-port (--ssh_port), -I/--identity, --ssh-timeout, --accept-new-hosts;
    the command receives ``ssh_config``, ``ssh_port``, ``identity``, ``ssh_timeout`` and
    ``accept_new_hosts``."""
    options = [
        click.option("--ssh-config", help="ssh config file (ssh -F)."),
        click.option(
            "--ssh-port",
            "--ssh_port",
            "ssh_port",
            type=click.IntRange(1, 65535),
            help="ssh port of hosts whose hostfile line has no port=. Default: the ssh "
            "config's, else 22.",
        ),
        click.option("-I", "--identity", help="ssh private key file."),
        click.option(
            "--ssh-timeout",
            type=float,
            default=10.0,
            show_default=True,
            help="Seconds to wait for each host's ssh connection.",
        ),
        click.option(
            "--accept-new-hosts",
            is_flag=True,
            help="Trust hosts missing from known_hosts and record their keys (ssh's accept-new).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def ssh_of(
    ssh_config: str | None,
    ssh_port: int | None,
    identity: str | None,
    ssh_timeout: float,
    accept_new_hosts: bool,
) -> SshOptions:
    """The `SshOptions` the options say, with the config and key files made absolute."""
    from zlaunch.job import SshOptions

    return SshOptions(
        config_file=existing_file(ssh_config, "--ssh-config"),
        port=ssh_port,
        identity=existing_file(identity, "--identity"),
        timeout=ssh_timeout,
        accept_new_hosts=accept_new_hosts,
    )


def existing_file(path: str | None, flag: str) -> str | None:
    """``path`` made absolute; a usage error naming ``flag`` when there is no such file."""
    if path is None:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path}: no such file")
    return path
