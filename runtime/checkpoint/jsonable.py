"""Exact JSON round trips for the small Python state a checkpoint keeps (no pickle, ever).

Plain JSON loses tuples, non-string dict keys and tensors. The few that optimizer, scheduler,
RNG and client state use are encoded as one-key tagged objects, so that ``decode(encode(x))``
gives back an equal value of the same types:

* ``{"__tuple__": [...]}`` for tuples (``random.getstate()``, Adam's ``betas``);
* ``{"__dict__": [[key, value], ...]}`` for dicts whose keys are not all strings;
* ``{"__tensor__": [...], "dtype": "uint8", "shape": [...]}`` for small tensors and numpy
  arrays (RNG states, a tensor-valued learning rate); large tensors belong in shard files.

Floats keep full precision (``repr`` round trip) and inf/nan survive (JSON's Infinity/NaN).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import CheckpointError

__all__ = ["encode", "decode", "dumps", "loads"]

_TAGS = ("__tuple__", "__dict__", "__tensor__", "__ndarray__")
# Tensors above this many elements do not belong in JSON.
_MAX_JSON_TENSOR = 1 << 20


def _where(path: str) -> str:
    return path or "the value"


def encode(value: Any, path: str = "") -> Any:
    """A JSON-ready copy of ``value``; CheckpointError naming the path of anything else."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            if any(k in _TAGS for k in value):
                return {"__dict__": [[k, encode(v, f"{path}[{k!r}]")] for k, v in value.items()]}
            return {k: encode(v, f"{path}[{k!r}]") for k, v in value.items()}
        items = []
        for k, v in value.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise CheckpointError(
                    f"{_where(path)} has a key of type {type(k).__name__} ({k!r}), which cannot "
                    "be stored as JSON; use str, int or float keys"
                )
            items.append([k, encode(v, f"{path}[{k!r}]")])
        return {"__dict__": items}
    kind = type(value).__module__.split(".")[0]
    if kind == "torch":
        import torch

        if isinstance(value, torch.Tensor):
            if value.numel() > _MAX_JSON_TENSOR:
                raise CheckpointError(
                    f"{_where(path)} is a tensor of {value.numel():,} elements; keep large "
                    "tensors in the model or optimizer, not in JSON state"
                )
            t = value.detach().cpu()
            return {
                "__tensor__": t.reshape(-1).tolist(),
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
            }
    if kind == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray):
            return {
                "__ndarray__": value.reshape(-1).tolist(),
                "dtype": str(value.dtype),
                "shape": list(value.shape),
            }
        if isinstance(value, np.generic):
            return encode(value.item(), path)
    raise CheckpointError(
        f"{_where(path)} is a {type(value).__module__}.{type(value).__qualname__}, which cannot "
        "be stored as JSON (checkpoints never pickle); convert it to numbers, strings, lists "
        "or dicts"
    )


def decode(value: Any) -> Any:
    """Inverse of `encode`."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and "__tuple__" in value:
        return tuple(decode(v) for v in value["__tuple__"])
    if len(value) == 1 and "__dict__" in value:
        return {k: decode(v) for k, v in value["__dict__"]}
    if "__tensor__" in value:
        import torch

        data, dtype, shape = _array_parts(value, "__tensor__")
        return torch.tensor(data, dtype=getattr(torch, dtype)).reshape(shape)
    if "__ndarray__" in value:
        import numpy as np

        data, dtype, shape = _array_parts(value, "__ndarray__")
        return np.array(data, dtype=dtype).reshape(shape)
    return {k: decode(v) for k, v in value.items()}


# What `encode` writes for a tensor or array: numbers of these types only. Anything else
# (``"U200000000"``: 800 MB per element; ``"load"``: any attribute of torch) is refused.
_ARRAY_DTYPES = frozenset(
    {"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
     "float16", "bfloat16", "float32", "float64"}
)  # fmt: skip


def _array_parts(value: dict, tag: str) -> tuple[list, str, list[int]]:
    """The data, dtype and shape of an encoded tensor or array, checked against each other
    and bounded like `encode` bounds them, before anything is allocated."""
    data, dtype, shape = value[tag], value.get("dtype"), value.get("shape")
    if not isinstance(data, list) or len(data) > _MAX_JSON_TENSOR:
        raise CheckpointError(f"{tag} data must be a list of at most {_MAX_JSON_TENSOR} numbers")
    if dtype not in _ARRAY_DTYPES:
        raise CheckpointError(f"{tag} has dtype {dtype!r:.40}, not a number type")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _MAX_JSON_TENSOR for d in shape
    ):
        raise CheckpointError(f"{tag} has shape {shape!r:.40}, not a list of sizes")
    count = 1
    for d in shape:
        count *= d
    if count != len(data) or not all(isinstance(x, (int, float)) for x in data):
        raise CheckpointError(f"{tag} holds {len(data)} values for shape {shape}")
    return data, dtype, shape


def dumps(value: Any, path: str = "") -> str:
    return json.dumps(encode(value, path), indent=1)


def loads(text: str) -> Any:
    return decode(json.loads(text))
