"""The one error for a part of DeepSpeed's API that the bundled runtime does not serve.

Clients reach into DeepSpeed for features (tensor parallelism, sequence parallelism, CPU
Adagrad/Lion kernels, pipeline parallelism, ...) this runtime does not implement. Asking for one
raises `NotInBundledRuntime` at the point of use, naming the DeepSpeed attribute or module and
what to do, instead of an AttributeError three frames deep. It is deliberately not an
AttributeError: ``from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad`` would turn one into a
bare "cannot import name" and lose the message. Dunder probes (``__path__``, ``__wrapped__``)
still get a plain AttributeError, as import machinery and ``inspect`` expect.

A submodule DeepSpeed has and this package lacks (``import deepspeed.runtime.pipe``) raises
`NotInBundledRuntimeModule`, which is also an ImportError, so a client's ``try: import ...
except ImportError`` fallback still falls back.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys

from runtime.errors import UnsupportedError

__all__ = [
    "NotInBundledRuntime",
    "NotInBundledRuntimeModule",
    "install_submodule_finder",
    "missing",
    "module_getattr",
]


class NotInBundledRuntime(UnsupportedError):
    """A DeepSpeed name the bundled runtime does not provide."""


class NotInBundledRuntimeModule(NotInBundledRuntime, ImportError):
    """A DeepSpeed module the bundled runtime does not provide."""


def _message(name: str, why: str) -> str:
    reason = f" ({why})" if why else ""
    return (
        f"{name} is not provided by zlaunch's bundled runtime{reason}; it serves the part of "
        "DeepSpeed's API that the Hugging Face Trainer, accelerate, TRL, Lightning and "
        "DeepSpeed's example scripts use for ZeRO 0-3 training. To use this feature, install "
        "DeepSpeed and run with zlaunch --runtime deepspeed"
    )


def missing(name: str, why: str = "") -> NotInBundledRuntime:
    return NotInBundledRuntime(_message(name, why))


def _public(name: str) -> str:
    """``deepspeed.x`` for the package imported under any name (the tests import it as
    ``runtime.deepspeed_api.deepspeed``)."""
    head, sep, rest = name.partition("deepspeed_api.")
    return rest if sep else name


def _submodule_on_disk(module_name: str, name: str) -> bool:
    paths = getattr(sys.modules.get(module_name), "__path__", None) or []
    return any(
        os.path.isfile(os.path.join(p, f"{name}.py"))
        or os.path.isfile(os.path.join(p, name, "__init__.py"))
        for p in paths
    )


def module_getattr(module_name: str):
    """A module-level ``__getattr__`` that names the missing attribute of ``module_name``; a
    submodule that exists here but was not imported yet is imported (``from deepspeed.runtime
    import zero`` as Python's own lookup would)."""

    def __getattr__(name: str):
        if name.startswith("__"):  # import machinery probes (__path__, __wrapped__, ...)
            raise AttributeError(name)
        if _submodule_on_disk(module_name, name):
            return importlib.import_module(f"{module_name}.{name}")
        raise missing(f"{_public(module_name)}.{name}")

    return __getattr__


class _MissingLoader(importlib.abc.Loader):
    def create_module(self, spec):
        err = NotInBundledRuntimeModule(_message(_public(spec.name), "no such module here"))
        err.name = spec.name
        raise err

    def exec_module(self, module) -> None:  # never reached: create_module raises
        raise AssertionError(module)


class _MissingSubmodules(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: a ``<package>.x`` no other finder found is DeepSpeed's, not
    ours."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002
        if fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, _MissingLoader())
        return None


def install_submodule_finder(package: str) -> None:
    if not any(isinstance(f, _MissingSubmodules) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_MissingSubmodules(package))
