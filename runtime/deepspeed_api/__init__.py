"""The compatibility directory that serves DeepSpeed's API from this runtime.

`PATH` holds a ``deepspeed/`` package (thin modules over the runtime's own) and a
``deepspeed-<VERSION>.dist-info`` whose metadata transformers' and accelerate's availability and
version checks read. It is never installed into site-packages: zlaunch prepends `PATH` to the
workers' ``PYTHONPATH`` when the job's Python has no real DeepSpeed (or with ``--runtime
bundled``), so ``import deepspeed`` in those workers resolves here and nowhere else.

Standard library only: the launcher reads `PATH` and `VERSION` before any worker starts.
"""

from __future__ import annotations

from runtime.deepspeed_api.location import PATH, VERSION, is_bundled_deepspeed

__all__ = [
    "PATH",
    "VERSION",
    "is_bundled_deepspeed",
]
