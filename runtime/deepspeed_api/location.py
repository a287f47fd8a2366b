"""The compatibility directory that serves DeepSpeed's API from this runtime.

`PATH` holds a ``deepspeed/`` package (thin modules over the runtime's own) and a
``deepspeed-<VERSION>.dist-info`` whose metadata transformers' and accelerate's availability and
version checks read. It is never installed into site-packages: zlaunch prepends `PATH` to the
workers' ``PYTHONPATH`` when the job's Python has no real DeepSpeed (or with ``--runtime
bundled``), so ``import deepspeed`` in those workers resolves here and nowhere else.

Standard library only: the launcher reads `PATH` and `VERSION` before any worker starts.
"""

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
