"""zlaunch's arguments carried into the allocation it asks Slurm for (``--nodes N`` on a login
node, zlaunch/commands/run.py).

zlaunch re-runs itself under ``salloc``. salloc's command line is seen by every user of the
login node (``ps``) and kept by Slurm's accounting (``sacct -o SubmitLine``), so it carries
the arguments redacted (:func:`shown`: every ``--env`` value hidden, and whatever else looks
secret, zlaunch/text/redact.py). The whole arguments travel in salloc's environment (``ZLAUNCH_SALLOC_ARGS``, a JSON list), which only the user and root can
read; the zlaunch inside takes them out of its environment before anything starts (srun
would pass it on to every node) and runs with them, once it has checked that they are the
ones its own command line shows.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping, Sequence

from zlaunch.errors import UsageError
from zlaunch.text import REDACTED, redact_argv
from zlaunch.wire import protocol

__all__ = ["ARGS_ENV", "hand_over", "shown", "take_back"]

ARGS_ENV = protocol.SALLOC_ARGS_ENV
ENV_FLAGS = ("--env",)
"""zlaunch's options whose ``NAME=VALUE`` is a worker variable: its value is never shown."""


def shown(args: Sequence[str]) -> list[str]:
    """``args`` as a command line may show them."""
    return redact_argv(args, env_flags=ENV_FLAGS)


def hand_over(args: Sequence[str], environ: MutableMapping[str, str]) -> list[str]:
    """The arguments for salloc's command line; ``environ`` (salloc's) gets the whole ones."""
    environ[ARGS_ENV] = json.dumps(list(args))
    return shown(args)


def take_back(args: Sequence[str], environ: MutableMapping[str, str]) -> list[str]:
    """This zlaunch's real arguments: ``args`` (its command line), or the whole ones the
    zlaunch that ran it under salloc handed over, taken out of ``environ``."""
    raw = environ.pop(ARGS_ENV, None)
    if raw is None:
        if environ.get(protocol.SALLOC_ENV) and any(REDACTED in arg for arg in args):
            # salloc ran us with the redacted line but without the environment that holds the
            # values: running with "<redacted>" in their place would be silently wrong
            raise UsageError(
                f"zlaunch's arguments did not reach the allocation: {ARGS_ENV} is missing "
                "from the environment salloc gave it",
                hint="run salloc yourself (salloc -N 2 zlaunch ...), or keep salloc from "
                "dropping the environment",
            )
        return list(args)
    try:
        real = json.loads(raw)
    except ValueError:
        real = None
    if not isinstance(real, list) or not all(isinstance(arg, str) for arg in real):
        raise UsageError(f"{ARGS_ENV} is not a JSON list of arguments", hint=f"unset {ARGS_ENV}")
    if shown(real) != list(args):
        raise UsageError(
            f"{ARGS_ENV} holds the arguments of another command line than this one",
            hint=f"unset {ARGS_ENV}: zlaunch sets it only for the zlaunch it runs under salloc",
        )
    return real
