"""The types of the fields of DeepSpeed's checkpoint files, checked before any is used.

A field of the wrong type (a string where a dict or tensor is, a list for a count, an integer
tensor where fp32 weights are) is a `CheckpointError` naming the file and the field, never an
exception from deep inside the reader, and never a value converted into something else: the
reader then relies on each field being what DeepSpeed 0.19 writes. Optional fields may be
absent or None."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import CheckpointError
from .ds_pickle import DSObject

__all__ = ["check_model_fields", "check_optim_fields", "is_count"]


def is_count(value: Any) -> bool:
    """A non-negative Python integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _describe(value: Any) -> str:
    if torch.is_tensor(value):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if isinstance(value, (str, int, float)) or value is None:
        return f"{type(value).__name__} {value!r:.40}"
    return f"a {type(value).__name__}"


class _Fields:
    def __init__(self, file: str, content: dict):
        self.file = file
        self.content = content

    def bad(self, path: str, value: Any, expected: str) -> CheckpointError:
        return CheckpointError(
            f"{self.file}: field {path} is {_describe(value)}, where DeepSpeed writes "
            f"{expected}; the file is corrupt or was not written by DeepSpeed"
        )

    def get(self, container: dict, key: str, path: str, required: bool) -> Any:
        if key not in container:
            if required:
                raise CheckpointError(
                    f"{self.file}: field {path} is missing; the file is incomplete or was not "
                    "written by DeepSpeed"
                )
            return None
        return container[key]

    def typed(self, container, key, path, kind, expected, required=False):
        value = self.get(container, key, path, required)
        if value is None and not required:
            return None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise self.bad(path, value, expected)
        return value

    def count(self, container, key, path, required=False):
        value = self.get(container, key, path, required)
        if (value is None and not required) or is_count(value):
            return value
        raise self.bad(path, value, "a non-negative integer")

    def counts(self, value, path, expected="a list of non-negative integers"):
        if not isinstance(value, list) or not all(is_count(v) for v in value):
            raise self.bad(path, value, expected)

    def shape(self, value, path):
        if not isinstance(value, (list, tuple)) or not all(is_count(d) for d in value):
            raise self.bad(path, value, "a shape (a torch.Size of non-negative integers)")

    def tensors(self, value, path, floating: bool = False):
        for name, t in value.items():
            if not torch.is_tensor(t) or (floating and not t.is_floating_point()):
                kind = "a floating-point tensor" if floating else "a tensor"
                raise self.bad(f"{path}[{name!r}]", t, kind)


def check_model_fields(m: dict, file: str) -> None:
    """The model-states file: what the reader takes from it."""
    f = _Fields(file, m)
    shapes = f.typed(m, "param_shapes", "param_shapes", list, "a list of dicts", required=True)
    for g, group in enumerate(shapes):
        if not isinstance(group, dict):
            raise f.bad(f"param_shapes[{g}]", group, "a dict of parameter names to shapes")
        for name, shape in group.items():
            if not isinstance(name, str):
                raise f.bad(f"param_shapes[{g}] key", name, "a parameter name")
            f.shape(shape, f"param_shapes[{g}][{name!r}]")
    module = f.typed(m, "module", "module", dict, "a dict of tensors")
    if module is not None:
        f.tensors(module, "module")
    names = f.typed(m, "buffer_names", "buffer_names", list, "a list of names")
    if names is not None and not all(isinstance(n, str) for n in names):
        raise f.bad("buffer_names", names, "a list of names")
    frozen = f.typed(m, "frozen_param_shapes", "frozen_param_shapes", dict, "a dict of shapes")
    for name, shape in (frozen or {}).items():
        f.shape(shape, f"frozen_param_shapes[{name!r}]")
    check_fragments(m, file)
    shared = f.typed(m, "shared_params", "shared_params", dict, "a dict of names to names")
    for alias, target in (shared or {}).items():
        if not isinstance(alias, str) or not isinstance(target, str):
            raise f.bad(f"shared_params[{alias!r}]", target, "a parameter name")
    f.count(m, "mp_world_size", "mp_world_size")
    dims = f.typed(m, "checkpoint_parallel_dimensions", "checkpoint_parallel_dimensions", dict,
                   "a dict of parallel sizes")  # fmt: skip
    for key in ("pp_degree", "tp_degree"):
        f.count(dims or {}, key, f"checkpoint_parallel_dimensions[{key!r}]")
    for key in ("global_steps", "global_samples", "skipped_steps", "dp_world_size"):
        f.count(m, key, key)
    f.typed(m, "lr_scheduler", "lr_scheduler", dict, "a dict (the scheduler's state_dict)")
    config = f.typed(m, "ds_config", "ds_config", dict, "a dict (the DeepSpeed config)")
    optimizer = f.typed(config or {}, "optimizer", "ds_config['optimizer']", dict, "a dict")
    if optimizer is not None:
        f.typed(optimizer, "type", "ds_config['optimizer']['type']", str, "a string")
        f.typed(optimizer, "params", "ds_config['optimizer']['params']", dict, "a dict")


def check_fragments(m: dict, file: str) -> None:
    """A model-states file's parts of the frozen parameters (stage 3, every rank's file)."""
    f = _Fields(file, m)
    fragments = f.typed(m, "frozen_param_fragments", "frozen_param_fragments", dict,
                        "a dict of tensors")  # fmt: skip
    if fragments is not None:
        f.tensors(fragments, "frozen_param_fragments")


def check_optim_fields(s: dict, file: str) -> None:
    """``optimizer_state_dict`` of an optimizer-states file (its stage says which fields)."""
    f = _Fields(file, s)
    where = "optimizer_state_dict"
    stage = f.count(s, "zero_stage", f"{where}['zero_stage']", required=True)
    count = f.get(s, "partition_count", f"{where}['partition_count']", required=True)
    if not is_count(count):
        f.counts(count, f"{where}['partition_count']", "an integer or a list of integers")
    flat = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    parts = f.typed(s, flat, f"{where}[{flat!r}]", list, "a list of fp32 tensors", required=True)
    f.tensors(dict(enumerate(parts)), f"{where}[{flat!r}]")
    for i, t in enumerate(parts):
        if t.dtype != torch.float32:
            raise f.bad(f"{where}[{flat!r}][{i}]", t, "a float32 tensor (the fp32 master weights)")
    paddings = f.typed(s, "param_alignment_paddings", f"{where}['param_alignment_paddings']",
                       list, "a list of lists of integers")  # fmt: skip
    for g, pads in enumerate(paddings or []):
        f.counts(pads, f"{where}['param_alignment_paddings'][{g}]")
    base_key = "optimizer_state_dict" if stage == 3 else "base_optimizer_state"
    base = f.get(s, base_key, f"{where}[{base_key!r}]", required=True)
    path = f"{where}[{base_key!r}]"
    if isinstance(base, list):  # older DeepSpeed: one state dict per group
        for i, entry in enumerate(base):
            _check_entry(f, entry, f"{path}[{i}]")
        return
    if not isinstance(base, dict):
        raise f.bad(path, base, "the optimizer's state_dict (a dict)")
    state = f.typed(base, "state", f"{path}['state']", dict, "a dict", required=True)
    for key, entry in state.items():
        _check_entry(f, entry, f"{path}['state'][{key!r}]")
    groups = f.typed(base, "param_groups", f"{path}['param_groups']", list, "a list of dicts")
    for g, group in enumerate(groups or []):
        if not isinstance(group, dict):
            raise f.bad(f"{path}['param_groups'][{g}]", group, "a dict of hyperparameters")
        params = f.typed(group, "params", f"{path}['param_groups'][{g}]['params']", list,
                         "a list of integers")  # fmt: skip
        if params is not None:
            f.counts(params, f"{path}['param_groups'][{g}]['params']")
    scaler = s.get("loss_scaler")
    if scaler is not None and not isinstance(scaler, DSObject):
        raise f.bad(f"{where}['loss_scaler']", scaler, "a LossScaler or DynamicLossScaler")
    if isinstance(scaler, DSObject) and scaler.get("dynamic", False):
        for key in ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"):
            value = scaler.get(key)
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool)
            ):
                raise f.bad(f"{where}['loss_scaler'].{key}", value, "a number")


def _check_entry(f: _Fields, entry: Any, path: str) -> None:
    """One parameter's optimizer state: element-wise tensors are floating point (Adam's
    moments); a scalar (``step``) is checked where it is read."""
    if not isinstance(entry, dict):
        raise f.bad(path, entry, "a dict of the optimizer's state")
    for key, value in entry.items():
        if torch.is_tensor(value) and value.dim() > 0 and key != "step":
            if not value.is_floating_point():
                raise f.bad(f"{path}[{key!r}]", value, "a floating-point tensor")
