"""`zlaunch agent --connect HOST:PORT --token-file FILE`: this node's agent, dialing in to a
controller started with ``--launcher dialin`` (or placed by a scheduler zlaunch drives). The
agent itself is ``python -m zlaunch.agent``; this is its name for people and schedulers."""

from __future__ import annotations

import click

__all__ = ["command"]


@click.command(name="agent", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--connect",
    "address",
    required=True,
    metavar="HOST:PORT",
    help="The controller's address, as `zlaunch run --launcher dialin` says it.",
)
@click.option(
    "--token-file",
    required=True,
    type=click.Path(dir_okay=False),
    help="A private copy of the controller's --token-file (never the token on a command line).",
)
def command(address: str, token_file: str) -> None:
    """Run this node's agent: dial in to the controller, prove the job's token, run this
    node's ranks, and exit when the job ends (2 if the controller cannot be reached)."""
    from zlaunch.agent import main

    main(["--connect", address, "--token-file", token_file])
