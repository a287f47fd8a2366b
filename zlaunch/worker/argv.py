"""A worker's script arguments kept off its command line where they look secret (stdlib only).

A worker's command line is read by every user of its node (``ps``, /proc/PID/cmdline), its
environment only by the job's user and root. So when a Python worker that the agent starts
behind the boot (zlaunch/worker/boot.py) has arguments that look secret (``--hf_token=...``,
``--password X``, a URL's password: zlaunch/text/redact.py), the agent starts it with those shown
redacted and the whole arguments in ``ZLAUNCH_WORKER_ARGS`` (a JSON list); the boot takes
them out of its environment before the script runs (nothing the script starts inherits them)
and gives the script the ``sys.argv`` it was launched with. Arguments that look like nothing
are left where they are, and so is every argument of a program started as is (``--no-python``,
a shell wrapper): nothing but the program reads those.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping, Sequence

from zlaunch.text import REDACTED, redact_argv
from zlaunch.wire import protocol

__all__ = ["ARGS_ENV", "MAX_ENV_BYTES", "ArgsMismatch", "hide", "restore"]

ARGS_ENV = protocol.WORKER_ARGS_ENV
MAX_ENV_BYTES = 100_000
"""Linux takes one environment string of up to 128 KiB: arguments longer than this stay on the
command line (the worker must start)."""


class ArgsMismatch(Exception):
    """The arguments in the environment are not the ones this command line shows."""


def hide(argv: Sequence[str], count: int, env: MutableMapping[str, str]) -> list[str]:
    """``argv`` whose last ``count`` elements are the script's arguments, with those that look
    secret shown redacted; the whole arguments then go to ``env``. Unchanged when none does."""
    head = list(argv[: len(argv) - count])
    args = list(argv[len(argv) - count :]) if count else []
    shown = redact_argv(args)
    if shown == args:
        return list(argv)
    whole = json.dumps(args)
    if len(whole.encode()) > MAX_ENV_BYTES:
        return list(argv)
    env[ARGS_ENV] = whole
    return head + shown


def restore(args: Sequence[str], environ: MutableMapping[str, str] | None = None) -> list[str]:
    """The boot's ``args`` (``SCRIPT ARGS...`` or ``-m MODULE ARGS...``) with the script's
    arguments the agent kept in the environment put back, taken out of ``environ``.
    ArgsMismatch when they do not fit: each shown argument must be its whole one, or it
    redacted."""
    environ = os.environ if environ is None else environ
    raw = environ.pop(ARGS_ENV, None)
    if raw is None:
        return list(args)
    try:
        whole = json.loads(raw)
    except ValueError:
        whole = None
    if not isinstance(whole, list) or not all(isinstance(arg, str) for arg in whole):
        raise ArgsMismatch(f"{ARGS_ENV} is not a JSON list of arguments")
    count = len(whole)
    if count > len(args):
        raise ArgsMismatch(f"{ARGS_ENV} holds more arguments than this command line")
    tail = list(args[len(args) - count :]) if count else []
    if any(
        shown != real and REDACTED not in shown for shown, real in zip(tail, whole, strict=True)
    ):
        raise ArgsMismatch(f"{ARGS_ENV} holds the arguments of another command line")
    return [*args[: len(args) - count], *whole]
