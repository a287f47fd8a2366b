"""The vocabulary of config validation: the error, the warning, and the checks of one value.

Every schema block (blocks, scheduler, monitors, schema)
checks its fields with these, so that every message reads the same way: the key path, what
is wrong with the value, and the fix. No torch, no loading: the schema and the loader both
import this module, and it imports neither.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable
from typing import Any, Literal, Union

from ..errors import InvalidValueError

__all__ = [
    "AUTO",
    "MAX_KEY_CHARS",
    "Auto",
    "ConfigError",
    "ConfigWarning",
    "IntOrAuto",
    "as_bool",
    "as_choice",
    "as_float",
    "as_int",
    "as_str",
    "check_field",
    "describe",
    "did_you_mean",
]

AUTO = "auto"
"""The value that asks for a setting to be derived (batch sizes, bucket sizes)."""

Auto = Literal["auto"]
IntOrAuto = Union[int, Auto]


MAX_KEY_CHARS = 120
"""Longer keys are cut in messages and get no suggestion (nothing valid is that long)."""


class ConfigError(InvalidValueError):
    """An invalid config; the message names the file (if any), the key path and the fix.

    `key` is the dotted key path ("zero_optimization.stage"), `problem` what is wrong with it,
    `origin` the file it came from.
    """

    def __init__(self, problem: str, key: str | None = None, origin: str | None = None):
        self.problem = problem
        if key is not None and len(key) > MAX_KEY_CHARS:  # a hostile key is not echoed whole
            key = key[:MAX_KEY_CHARS] + "..."
        self.key = key
        self.origin = origin
        text = f"{key} {problem}" if key else problem
        super().__init__(f"{origin}: {text}" if origin else text)

    def __reduce__(self):
        return (type(self), (self.problem, self.key, self.origin))

    def within(self, block: str) -> ConfigError:
        """The same error, with its key path nested under `block`."""
        key = f"{block}.{self.key}" if self.key else block
        return ConfigError(self.problem, key, self.origin)

    def from_file(self, origin: str | None) -> ConfigError:
        """The same error, naming the file it came from (kept if already named)."""
        return ConfigError(self.problem, self.key, self.origin or origin)


class ConfigWarning(UserWarning):
    """A config setting that has no effect here ("auto" with nothing to resolve it, offload at
    a stage that cannot use it)."""


# Value checks. Each takes the key (for the message) and the value, returns the normalised value.


def describe(value: Any) -> str:
    """A value as the config spells it, short enough for one line of an error message."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int) and value.bit_length() > 128:
        # str() of a huge int is slow, and refused beyond 4300 digits.
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, default=describe)[:60]
        except (ValueError, TypeError, RecursionError):  # circular, or a huge int inside
            return f"a {type(value).__name__}"
    return str(value)


def as_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {describe(value)}", key)
    return value


def as_int(key: str, value: Any, minimum: int | None = 0, *, auto: bool = False) -> int | str:
    """An integer; integral floats such as 5e8 (JSON has no integer exponent form) are accepted."""
    if auto and value == AUTO:
        return AUTO
    extra = ' or "auto"' if auto else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"must be an integer{extra}, got {describe(value)}", key)
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ConfigError(f"must be an integer{extra}, got {describe(value)}", key)
        value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"must be >= {minimum}, got {describe(value)}", key)
    return value


def as_float(key: str, value: Any, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"must be a number, got {describe(value)}", key)
    try:
        value = float(value)
    except OverflowError:  # an int beyond float range
        raise ConfigError(f"must be a finite number, got {describe(value)}", key) from None
    if not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {value}", key)
    if minimum is not None and value < minimum:
        raise ConfigError(f"must be >= {minimum:g}, got {value:g}", key)
    return value


def as_str(key: str, value: Any, *, optional: bool = False) -> str | None:
    """A string; None too when `optional`."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"must be a string, got {describe(value)}", key)
    return value


def as_choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"must be one of {listed}, got {describe(value)}", key)
    return value


def did_you_mean(key: str, valid: Any) -> str:
    """ "did you mean 'x'?" for the entry of `valid` nearest to `key`, or "" when none is close."""
    if len(key) > MAX_KEY_CHARS:  # nothing valid is that long; difflib would take seconds
        return ""
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


def check_field(obj: Any, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Validate and normalise one field of a frozen dataclass in `__post_init__`."""
    object.__setattr__(obj, name, fn(name, getattr(obj, name), *args, **kwargs))
