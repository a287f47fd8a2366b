"""`UserError`, the base of every error the runtime raises at the user (`tree`).

`InvalidValueError`, `InvalidTypeError`, `UsageError` and `UnsupportedError` are also the
builtin types callers catch (ValueError, TypeError, RuntimeError, NotImplementedError)."""

from __future__ import annotations

from runtime.errors.tree import (
    InvalidTypeError,
    InvalidValueError,
    UnsupportedError,
    UsageError,
    UserError,
)

__all__ = [
    "InvalidTypeError",
    "InvalidValueError",
    "UnsupportedError",
    "UsageError",
    "UserError",
]
