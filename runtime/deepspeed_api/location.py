"""Where the compatibility directory is (`PATH`) and which DeepSpeed release it serves."""

from __future__ import annotations

import os

__all__ = ["PATH", "VERSION", "is_bundled_deepspeed"]

VERSION = "0.19.8"
"""The DeepSpeed release whose API (and config semantics) the runtime follows."""

PATH = os.path.dirname(os.path.abspath(__file__))
"""The directory to put on ``sys.path`` / ``PYTHONPATH`` ahead of site-packages."""


def is_bundled_deepspeed(module_file: str | None) -> bool:
    """Whether a ``deepspeed`` module loaded from ``module_file`` is this compatibility package."""
    if not module_file:
        return False
    return os.path.dirname(os.path.dirname(os.path.abspath(module_file))) == PATH
