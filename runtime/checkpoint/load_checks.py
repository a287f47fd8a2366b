"""What a load will put into the engine, checked before anything is put there.

A load stages tensors first and commits after every rank agreed (engine_io); the JSON state
is applied at commit time, so it must be known good by then: a learning rate of ``"fast"``
or a random state that is not one failed (or, worse, loaded and failed at the next step)
after the weights were already overwritten. Each check here takes
the decoded value and what the engine holds now, and raises CheckpointError naming the entry
and the manifest.

The rule for state whose layout the engine defines (scheduler, loss scaler, optimizer
hyperparameters): every entry the engine has must come back as the same kind of value
(a number for a number, a list of numbers for a list of numbers, ...). Entries the engine
does not have are left to the component that loads them.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from ..errors import InvalidTypeError
from .errors import CheckpointError

__all__ = ["check_rng_state", "check_like", "check_optimizer_values"]


def check_rng_state(state: Any, where: str) -> None:
    """A saved random state that `rng.set_rng_state` can apply: tried on throwaway
    generators, so nothing of this process's randomness changes here."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: the random state must be an object, not {_kind(state)}")
    try:
        if "python" in state:
            random.Random().setstate(state["python"])
        if "torch" in state:
            value = state["torch"]
            if not (torch.is_tensor(value) and value.dtype == torch.uint8):
                raise InvalidTypeError("the torch state is not a uint8 tensor")
            torch.Generator().set_state(value)
        if "numpy" in state:
            try:
                import numpy as np
            except ImportError:
                pass
            else:
                np.random.RandomState().set_state(state["numpy"])
        if "cuda" in state:
            cuda = state["cuda"]
            if not isinstance(cuda, list) or not all(
                torch.is_tensor(t) and t.dtype == torch.uint8 for t in cuda
            ):
                raise InvalidTypeError("the cuda state is not a list of uint8 tensors")
    except (TypeError, ValueError, RuntimeError, OverflowError, KeyError, IndexError) as err:
        raise CheckpointError(f"{where}: the random state is malformed ({err})") from None


def check_like(saved: Any, current: Any, where: str, required: bool = False) -> None:
    """``saved`` holds, for every entry ``current`` has, the same kind of value; with
    ``required``, every top-level entry of ``current`` must be there too."""
    if required and isinstance(current, dict) and isinstance(saved, dict):
        missing = sorted(set(current) - set(saved))
        if missing:
            raise CheckpointError(f"{where} lacks {', '.join(map(str, missing[:8]))}")
    problem = _unlike(saved, current, "")
    if problem is not None:
        raise CheckpointError(f"{where}{problem}; the checkpoint was altered or is not this run's")


def check_optimizer_values(saved_groups: list, scalar_state: list, optimizer, where: str) -> list:
    """The optimizer's saved hyperparameters match its groups' kinds of values; the scalar
    state decodes to names of numbers or small tensors. Returns the scalar states decoded."""
    from . import jsonable
    from .optimizer_state import IMPLEMENTATION_KEYS

    for index, (saved, group) in enumerate(zip(saved_groups, optimizer.param_groups, strict=True)):
        if not isinstance(saved, dict):
            raise CheckpointError(f"{where}: optimizer param group {index} is not an object")
        # how the optimizer runs (fused, foreach, ...) is this run's, never loaded: not checked
        current = {k: v for k, v in group.items() if k != "params" and k not in IMPLEMENTATION_KEYS}
        check_like(saved, current, f"{where}: optimizer param group {index}")
    decoded = []
    for index, entry in enumerate(scalar_state):
        what = f"{where}: optimizer scalar state {index}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{what} is not an object")
        try:
            values = jsonable.decode(entry.get("values", {}))
        except CheckpointError:
            raise
        except (Exception, RecursionError) as err:
            raise CheckpointError(f"{what} is malformed ({type(err).__name__}: {err})") from None
        on_device = entry.get("on_device", [])
        if not isinstance(values, dict) or not all(
            isinstance(k, str) and (_is_number(v) or torch.is_tensor(v)) for k, v in values.items()
        ):
            raise CheckpointError(f"{what}: values must map names to numbers or tensors")
        if not isinstance(on_device, list) or not all(isinstance(k, str) for k in on_device):
            raise CheckpointError(f"{what}: on_device must be a list of names")
        decoded.append(values)
    return decoded


def _unlike(saved: Any, current: Any, path: str) -> str | None:
    """Where ``saved`` is not the same kind of value as ``current`` (None: it is)."""
    if current is None:
        return None  # the engine has nothing there to compare with
    if _is_number(current):
        if _is_number(saved) and (_is_int(saved) or math.isfinite(saved) or not _finite(current)):
            return None
        return f"{path or ' value'} must be a finite number like {current!r:.20}, not {saved!r:.40}"
    if isinstance(current, bool) or isinstance(current, str):
        if type(saved) is type(current):
            return None
        return f"{path or ' value'} must be {_kind(current)}, not {saved!r:.40}"
    if isinstance(current, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(current):
            return f"{path or ' value'} must be a list of {len(current)}, not {saved!r:.40}"
        for i, (s, c) in enumerate(zip(saved, current, strict=True)):
            problem = _unlike(s, c, f"{path}[{i}]")
            if problem is not None:
                return problem
        return None
    if isinstance(current, dict):
        if not isinstance(saved, dict):
            return f"{path or ' value'} must be an object, not {saved!r:.40}"
        for key, value in current.items():
            if key in saved:
                problem = _unlike(saved[key], value, f"{path}.{key}")
                if problem is not None:
                    return problem
        return None
    if torch.is_tensor(current):
        return None if torch.is_tensor(saved) or _is_number(saved) else f"{path} must be a tensor"
    return None


def _finite(value: Any) -> bool:
    return _is_int(value) or math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            list: "a list", tuple: "a list", dict: "an object"}.get(type(value), type(value).__name__)  # fmt: skip
