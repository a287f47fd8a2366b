"""Reading DeepSpeed's pickled ``.pt`` files without running their pickles.

Every file goes through ``torch.load(weights_only=True)``, which builds only tensors, plain
containers and the globals on an allow-list. DeepSpeed's files hold four more types; each is
allowed under its DeepSpeed name but built as a small stand-in here, so nothing of DeepSpeed
is imported or run (DeepSpeed need not even be installed):

* ``LossScaler`` / ``DynamicLossScaler`` (the fp16 loss scaler, its attributes as a dict),
* ``ZeroStageEnum`` (an int),
* ``fragment_address`` (``numel``, ``start``: where a parameter sits in a flat partition).

Anything else is refused with a `CheckpointError` that names the type and the file.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

import torch

from ..errors import CheckpointError

__all__ = ["DSObject", "ZeroStage", "load_ds_file", "ALLOWED_TYPES"]


class DSObject:
    """An allowed DeepSpeed object: its pickled attributes, nothing else."""

    ds_type = "object"

    def __init__(self, *args: Any) -> None:
        self.args = args
        self.attrs: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        # A dataclass or plain object pickles its __dict__; a slotted one a (None, slots) pair.
        if isinstance(state, tuple) and len(state) == 2:
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise CheckpointError(f"a pickled {self.ds_type} holds {type(state).__name__}")
        self.attrs = dict(state)

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def __repr__(self) -> str:
        return f"{self.ds_type}({self.attrs})"


class _LossScaler(DSObject):
    ds_type = "LossScaler"


class _DynamicLossScaler(DSObject):
    ds_type = "DynamicLossScaler"


class _FragmentAddress(DSObject):
    ds_type = "fragment_address"


class ZeroStage(int):
    """DeepSpeed's ``ZeroStageEnum`` member, as its stage number."""


ALLOWED_TYPES: dict[str, type] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": _LossScaler,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": _DynamicLossScaler,
    "deepspeed.runtime.zero.config.ZeroStageEnum": ZeroStage,
    "deepspeed.utils.tensor_fragment.fragment_address": _FragmentAddress,
}

_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def load_ds_file(path: str) -> Any:
    """The content of one DeepSpeed ``.pt`` file, memory-mapped (tensors are paged in when
    read), or a CheckpointError naming the file and, for a refused type, the type."""
    allowed = [(cls, name) for name, cls in ALLOWED_TYPES.items()]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing; the DeepSpeed checkpoint is incomplete"
        ) from None
    except pickle.UnpicklingError as err:
        found = _UNSUPPORTED_GLOBAL.search(str(err))
        if found:
            raise CheckpointError(
                f"{path} holds a pickled {found.group(1)}, which is not one of the types a "
                f"DeepSpeed checkpoint stores ({', '.join(sorted(ALLOWED_TYPES))}, tensors and "
                "plain containers); it is not loaded, since loading it would run its code"
            ) from None
        raise CheckpointError(f"{path} cannot be read ({err}); the file is corrupt") from None
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - a corrupt zip or pickle: name the file
        raise CheckpointError(
            f"{path} is not a readable torch file ({type(err).__name__}: {err}); the file is "
            "corrupt or not part of a DeepSpeed checkpoint"
        ) from None
