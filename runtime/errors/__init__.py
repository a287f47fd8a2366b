"""`UserError`, the base of every error the runtime raises at the user (`tree`).

`InvalidValueError`, `InvalidTypeError`, `UsageError` and `UnsupportedError` are also the
builtin types callers catch (ValueError, TypeError, RuntimeError, NotImplementedError)."""

from __future__ import annotations

# The face is the tree's own list: one list of names, in tree.py.
from runtime.errors import tree
from runtime.errors.tree import *  # noqa: F403

__all__ = [*tree.__all__]
