"""``deepspeed.launcher.runner``: the environment-file name DeepSpeed's launcher reads (zlaunch
reads the same ``.deepspeed_env``). Launching itself is zlaunch's: ``deepspeed train.py``
becomes ``zlaunch train.py``."""

from __future__ import annotations

from .._missing import module_getattr

__all__ = ["DEEPSPEED_ENVIRONMENT_NAME"]

DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"

__getattr__ = module_getattr(__name__)
