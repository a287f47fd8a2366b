"""How long a collective may wait before torch.distributed gives up on it.

zlaunch's ``--collective-timeout SECONDS`` reaches the workers as ``ZLAUNCH_COLLECTIVE_TIMEOUT``;
DeepSpeed users set ``DEEPSPEED_TIMEOUT`` (minutes), which DeepSpeed passes to
``init_process_group``; without either, torch's own default of 30 minutes applies. A value
that is not a positive number is an error naming the variable, never silently the default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from runtime.errors import InvalidValueError
from zlaunch.wire import COLLECTIVE_TIMEOUT_ENV

__all__ = ["DEFAULT_SECONDS", "CollectiveTimeoutError", "collective_timeout_seconds"]

DEFAULT_SECONDS = 1800.0


class CollectiveTimeoutError(InvalidValueError):
    """A timeout variable that is not a positive number."""


def _positive(name: str, raw: str, scale: float, unit: str) -> float:
    try:
        value = float(raw) * scale
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise CollectiveTimeoutError(f"{name}={raw[:40]!r}: expected a positive number of {unit}")
    return value


def collective_timeout_seconds(env: Mapping[str, str]) -> float:
    """The collective timeout for this process, in seconds."""
    if env.get(COLLECTIVE_TIMEOUT_ENV):
        return _positive(COLLECTIVE_TIMEOUT_ENV, env[COLLECTIVE_TIMEOUT_ENV], 1.0, "seconds")
    if env.get("DEEPSPEED_TIMEOUT"):
        return _positive("DEEPSPEED_TIMEOUT", env["DEEPSPEED_TIMEOUT"], 60.0, "minutes")
    return DEFAULT_SECONDS
