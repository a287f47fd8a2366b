"""The runtime's user-facing errors: what the user wrote or did that the runtime refuses.

Every such error derives from `UserError`, so a training script (or zlaunch) can tell "fix
your input" from a bug in the runtime with one `except`. Each subclass also derives from the
builtin type that this kind of error has always been raised as, so code written against the
builtin (`except ValueError`, DeepSpeed-style scripts) keeps working.

The message is the whole report: it names the setting or call, the value, and the fix.
Internal invariants ("cannot happen") are not user errors and stay plain assertions or
builtin exceptions. Stdlib only: zlaunch imports config errors without torch.
"""

from __future__ import annotations

__all__ = [
    "InvalidTypeError",
    "InvalidValueError",
    "UnsupportedError",
    "UsageError",
    "UserError",
]


class UserError(Exception):
    """Something the user wrote or did that the runtime refuses; the message says how to fix it."""


class InvalidValueError(UserError, ValueError):
    """A value the user gave (config key, argument, environment variable, file) is refused."""


class InvalidTypeError(UserError, TypeError):
    """An argument of the wrong kind: not a model, not an optimizer, not a bool."""


class UsageError(UserError, RuntimeError):
    """A call the runtime cannot serve: out of order, before initialisation, on files it cannot
    use, or after the run has reached a state it cannot continue from (fp16 overflow at the
    minimum loss scale)."""


class UnsupportedError(UserError, NotImplementedError):
    """A model, feature or combination of settings this runtime does not implement."""
