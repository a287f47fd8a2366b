"""The one error for a part of DeepSpeed's API that the bundled runtime does not serve.

transformers, accelerate and TRL reach into DeepSpeed for features (tensor parallelism,
sequence parallelism, CPU Adagrad/Lion kernels, ...) this runtime does not implement. Asking for
one raises `NotInBundledRuntime` at the point of use, naming the DeepSpeed attribute and what to
do, instead of an AttributeError three frames deep. It is deliberately not an AttributeError:
``from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad`` would turn one into a bare "cannot
import name" and lose the message. Dunder probes (``__path__``, ``__wrapped__``) still get a
plain AttributeError, as import machinery and ``inspect`` expect.
"""

from __future__ import annotations

from runtime.errors import UnsupportedError

__all__ = ["NotInBundledRuntime", "missing", "module_getattr"]


class NotInBundledRuntime(UnsupportedError):
    """A DeepSpeed name the bundled runtime does not provide."""


def missing(name: str, why: str = "") -> NotInBundledRuntime:
    reason = f" ({why})" if why else ""
    return NotInBundledRuntime(
        f"{name} is not provided by zlaunch's bundled runtime{reason}; it serves the part of "
        "DeepSpeed's API that the Hugging Face Trainer, accelerate and TRL use for ZeRO 0-3 "
        "training. To use this feature, install DeepSpeed and run with zlaunch --runtime "
        "deepspeed"
    )


def module_getattr(module_name: str):
    """A module-level ``__getattr__`` that names the missing attribute of ``module_name``."""

    def __getattr__(name: str):
        if name.startswith("__"):  # import machinery probes (__path__, __wrapped__, ...)
            raise AttributeError(name)
        raise missing(f"{module_name}.{name}")

    return __getattr__
