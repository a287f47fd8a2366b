"""`assert_never` for every Python zlaunch supports (``typing`` has it from 3.11).

A ``match`` over a closed union ends with ``case _: assert_never(value)``: a type checker then
proves every member is handled, and at run time an unhandled one fails loudly instead of
falling through."""

from __future__ import annotations

from typing import NoReturn

__all__ = ["assert_never"]

try:
    from typing import assert_never
except ImportError:  # Python 3.10

    def assert_never(value: NoReturn, /) -> NoReturn:
        raise AssertionError(f"unhandled value: {value!r}")
