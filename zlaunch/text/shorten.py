"""How user input is quoted back in an error message: ``repr``, cut to a readable length.

A hostfile or env file line can be megabytes long (a pasted blob, a binary file passed by
mistake); an error must still be one short line that names the place, not a copy of the input.
"""

from __future__ import annotations

__all__ = ["clip", "brief", "CLIP_CHARS"]

CLIP_CHARS = 60


def brief(value: str, limit: int = CLIP_CHARS) -> str:
    """``value`` as it is when short and printable, else :func:`clip`."""
    if len(value) <= limit and value.isprintable():
        return value
    return clip(value, limit)


def clip(value: str, limit: int = CLIP_CHARS) -> str:
    """``repr(value)``, or its first ``limit`` characters' repr and the full length."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"
