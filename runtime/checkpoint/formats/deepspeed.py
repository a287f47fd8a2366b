"""DeepSpeed ZeRO checkpoints (stages 1-3, any data-parallel size) as a checkpoint reader.

`DeepSpeedReader` answers the same questions as the native `CheckpointReader` (`shapes`,
`kinds`, `read(name, kind, lo, hi)`, `state(key)`, `extra`, ...), so the engine loads and
reshards a DeepSpeed checkpoint exactly as its own: each rank reads only the element ranges
its new layout owns. The fp32 master weights and the optimizer's element-wise state (Adam's
``exp_avg``/``exp_avg_sq``) come from the ``*_optim_states.pt`` partitions (`ds_layout` says
where each parameter lies); the scalar optimizer state, hyperparameters, LR scheduler, loss
scaler, counters and client state from the model-states file. Files are read through
`ds_pickle` (an allow-list, never a bare unpickle) and memory-mapped.

Everything is checked when the reader is built, before any engine state changes: the files
present, the stage and partition count in every file, the flat sizes against the shapes.
Pipeline-parallel and tensor-parallel checkpoints are refused by name.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import torch

from .. import jsonable
from ..errors import CheckpointError
from .ds_fields import check_fragments, check_model_fields, check_optim_fields
from .ds_layout import ParamPlace, zero3_places, zero12_places
from .ds_pickle import DSObject, load_ds_file

__all__ = ["DeepSpeedReader", "is_deepspeed_checkpoint", "DS_STATE_KEYS"]

_OPTIM = re.compile(r"(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")
_MODEL = re.compile(r"(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt")
_PIPELINE = re.compile(r"layer_\d+-model_\d+-model_states\.pt")

# The model-states entries DeepSpeed writes itself; every other top-level key is client state.
DS_STATE_KEYS = frozenset(
    {
        "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
        "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
        "sparse_tensor_module_names", "csr_tensor_module_names", "skipped_steps", "global_steps",
        "global_samples", "dp_world_size", "mp_world_size", "checkpoint_parallel_dimensions",
        "ds_config", "ds_version",
    }
)  # fmt: skip


def is_deepspeed_checkpoint(path: str) -> bool:
    """Whether ``path`` is the folder of one DeepSpeed checkpoint tag."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(_MODEL.fullmatch(n) or _PIPELINE.fullmatch(n) for n in names)


class DeepSpeedReader:
    """One DeepSpeed checkpoint tag folder, validated; the reader interface of the engine."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        names = sorted(os.listdir(self.path))
        self._refuse_parallel_layouts(names)
        optim = self._optim_files(names)
        self.world_size = len(optim)
        model_files = self._model_files(names)
        self.manifest_path = model_files[0]
        self._model = load_ds_file(model_files[0])
        self._check_model_file()
        self._optim = [self._optim_state(f) for f in optim]
        self.stage = self._stage()
        shapes = [
            {n: tuple(int(d) for d in s) for n, s in g.items()} for g in self._model["param_shapes"]
        ]
        self._places = self._layout(shapes)
        self.shapes = {n: p.shape for n, p in self._places.items()}
        self._flats = self._flat_tensors()
        self.kinds = {k: "float32" for k in self._flats}
        self._extra = self._extra_tensors(model_files)
        # As the native reader gives them: (shard, {"shape", "dtype"}).
        self.extra = {
            n: (0, {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")})
            for n, t in self._extra.items()
        }

    # ------------------------------------------------------------------ files
    def _bad(self, problem: str) -> CheckpointError:
        return CheckpointError(f"DeepSpeed checkpoint {self.path}: {problem}")

    def _refuse_parallel_layouts(self, names: list[str]) -> None:
        if any(_PIPELINE.fullmatch(n) for n in names):
            raise self._bad(
                "it was saved by a pipeline-parallel engine (layer_*-model_states.pt files); "
                "pipeline checkpoints are not read here (load it with DeepSpeed's "
                "PipelineModule and save the model without pipeline parallelism)"
            )
        mp = {int(m.group(2)) for n in names if (m := _MODEL.fullmatch(n))}
        mp |= {int(m.group(3)) for n in names if (m := _OPTIM.fullmatch(n))}
        if mp - {0}:
            raise self._bad(
                f"it holds {max(mp) + 1} tensor-parallel parts (mp_rank_00..mp_rank_"
                f"{max(mp):02d}); only checkpoints of tensor-parallel size 1 are read, and "
                "resharding tensor-parallel weights needs the model's own split rules"
            )

    def _optim_files(self, names: list[str]) -> list[str]:
        found = {int(m.group(2)): n for n in names if (m := _OPTIM.fullmatch(n))}
        if not found:
            raise self._bad(
                "it has no zero_pp_rank_*_mp_rank_00_optim_states.pt files: only ZeRO "
                "(stage 1-3) checkpoints are read; a stage-0 checkpoint keeps its optimizer "
                "in DeepSpeed's own pickled form"
            )
        ranks = sorted(found)
        if ranks != list(range(len(ranks))):
            missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
            raise self._bad(
                f"the optimizer states of rank(s) {missing} are missing; the save did not "
                "finish or files were removed"
            )
        prefixes = {found[r].startswith("bf16_") for r in ranks}
        if len(prefixes) > 1:
            raise self._bad("it mixes bf16_zero_* and zero_* optimizer files from two saves")
        return [os.path.join(self.path, found[r]) for r in ranks]

    def _model_files(self, names: list[str]) -> list[str]:
        plain = "mp_rank_00_model_states.pt"
        if plain in names:
            return [os.path.join(self.path, plain)]
        per_rank = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(self.world_size)]
        missing = [n for n in per_rank if n not in names]
        if missing:
            raise self._bad(f"{', '.join(missing)} missing; the save did not finish")
        return [os.path.join(self.path, n) for n in per_rank]

    def _check_model_file(self) -> None:
        m = self._model
        if not isinstance(m, dict) or "param_shapes" not in m:
            raise CheckpointError(
                f"{self.manifest_path} has no param_shapes: it is not a DeepSpeed ZeRO "
                "model-states file"
            )
        check_model_fields(m, self.manifest_path)
        mp = m.get("mp_world_size", 1)
        if mp not in (None, 1):
            raise self._bad(f"it was saved at tensor-parallel size {mp}; only 1 is read")
        dims = m.get("checkpoint_parallel_dimensions") or {}
        for key, what in (("pp_degree", "pipeline-parallel"), ("tp_degree", "tensor-parallel")):
            if dims.get(key, 1) not in (None, 1):
                raise self._bad(f"it was saved at {what} size {dims[key]}; only 1 is read")

    def _optim_state(self, file: str) -> dict:
        content = load_ds_file(file)
        state = content.get("optimizer_state_dict") if isinstance(content, dict) else None
        if not isinstance(state, dict) or "zero_stage" not in state:
            raise CheckpointError(f"{file} is not a DeepSpeed ZeRO optimizer-states file")
        check_optim_fields(state, file)
        state["_file"] = file
        return state

    def _stage(self) -> int:
        stages = {int(s["zero_stage"]) for s in self._optim}
        if len(stages) != 1 or not stages <= {1, 2, 3}:
            raise self._bad(f"its optimizer files are of ZeRO stages {sorted(stages)}")
        for s in self._optim:
            count = s.get("partition_count")
            counts = count if isinstance(count, list) else [count]
            if any(c != self.world_size for c in counts):
                raise CheckpointError(
                    f"{s['_file']}: saved by {counts} data-parallel ranks, but the folder holds "
                    f"{self.world_size} optimizer files; files of another save are mixed in"
                )
        return stages.pop()

    # ------------------------------------------------------------------ layout
    def _fp32_parts(self, s: dict) -> list[torch.Tensor]:
        key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        parts = s.get(key)
        if not isinstance(parts, list) or not all(torch.is_tensor(t) for t in parts):
            raise CheckpointError(f"{s['_file']}: {key} is missing or not a list of tensors")
        return parts

    def _layout(self, shapes: list[dict]) -> dict[str, ParamPlace]:
        where = f"DeepSpeed checkpoint {self.path}"
        if self.stage == 3:
            first = self._fp32_parts(self._optim[0])
            for s in self._optim[1:]:
                sizes = [t.numel() for t in self._fp32_parts(s)]
                if sizes != [t.numel() for t in first]:
                    raise CheckpointError(
                        f"{s['_file']}: flat fp32 sizes {sizes} differ from rank 0's "
                        f"{[t.numel() for t in first]}; at ZeRO-3 every rank holds as many"
                    )
            return zero3_places(shapes, sum(t.numel() for t in first), self.world_size, where)
        # Stage 1/2: each rank's partition is saved without the alignment padding it holds,
        # so the ranks' sizes may differ; padded, they are equal.
        per_rank = [[t.numel() for t in self._fp32_parts(s)] for s in self._optim]
        padded = None
        for s, sizes in zip(self._optim, per_rank, strict=True):
            pads = self._group_paddings(s, len(sizes))
            full = [n + p for n, p in zip(sizes, pads, strict=True)]
            if padded is not None and full != padded:
                raise CheckpointError(
                    f"{s['_file']}: flat fp32 partitions of {sizes} elements with group_paddings "
                    f"{pads} make {full}, rank 0's make {padded}; DeepSpeed's partitions of a "
                    "group are equal before their padding is removed, so files of two saves "
                    "are mixed"
                )
            padded = full
        rank_numel = [list(group) for group in zip(*per_rank, strict=True)]
        paddings = self._optim[0].get("param_alignment_paddings")
        return zero12_places(shapes, rank_numel, paddings, where)

    def _group_paddings(self, s: dict, groups: int) -> list[int]:
        """The end padding each flat partition of this rank held and was saved without."""
        pads = s.get("group_paddings")
        if pads is None:
            return [0] * groups
        if (
            not isinstance(pads, list)
            or len(pads) != groups
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pads)
        ):
            raise CheckpointError(
                f"{s['_file']}: group_paddings must be a list of {groups} non-negative "
                f"integers (one per param group), not {pads!r:.80}"
            )
        return pads

    def _base_state(self, s: dict) -> dict:
        base = s.get("optimizer_state_dict" if self.stage == 3 else "base_optimizer_state")
        if isinstance(base, list):  # older DeepSpeed: one state dict per group
            base = {"state": dict(enumerate(base)), "param_groups": []}
        if not isinstance(base, dict) or not isinstance(base.get("state"), dict):
            raise CheckpointError(f"{s['_file']}: the optimizer's own state is missing")
        return base

    def _flat_tensors(self) -> dict[str, list[list[torch.Tensor]]]:
        """Per kind, per rank: the flat tensors (param groups or stage-3 sub-groups).

        Element-wise optimizer state is every tensor of one or more dimensions (DeepSpeed's
        own rule when it strips padding); at stage 1/2 it is saved with the partition's end
        padding (the optimizer's own state dict) or without it (elastic checkpoints): only
        the elements the fp32 partition holds are kept."""
        out: dict[str, list[list[torch.Tensor]]] = {"param": []}
        for s in self._optim:
            parts = [t.detach() for t in self._fp32_parts(s)]
            pads = self._group_paddings(s, len(parts)) if self.stage != 3 else [0] * len(parts)
            out["param"].append(parts)
            state = self._base_state(s)["state"]
            kinds = None
            for i, part in enumerate(parts):
                entry = state.get(i, {})
                if not isinstance(entry, dict):
                    raise CheckpointError(
                        f"{s['_file']}: the optimizer state of flat group {i} is "
                        f"{type(entry).__name__}, not a dict of tensors"
                    )
                found = {}
                for k, v in entry.items():
                    if k in _SCALAR_STATE or not (torch.is_tensor(v) and v.dim() > 0):
                        continue
                    if v.numel() not in (part.numel(), part.numel() + pads[i]):
                        raise CheckpointError(
                            f"{s['_file']}: optimizer state {k!r} of flat group {i} has "
                            f"{v.numel()} elements, its fp32 partition {part.numel()}; the "
                            "optimizer's state does not belong to these weights"
                        )
                    found[k] = v.detach().reshape(-1)[: part.numel()]
                if kinds is None:
                    kinds = set(found)
                if set(found) != kinds:
                    raise CheckpointError(
                        f"{s['_file']}: flat group {i} has optimizer state {sorted(found)}, "
                        f"group 0 has {sorted(kinds)}"
                    )
                for k, v in found.items():
                    out.setdefault(k, [[] for _ in self._optim])[len(out["param"]) - 1].append(v)
        for kind, ranks in out.items():
            if any(len(r) != len(out["param"][0]) for r in ranks):
                raise self._bad(f"optimizer state {kind!r} is missing on some ranks")
        return out

    def _extra_tensors(self, model_files: list[str]) -> dict[str, torch.Tensor]:
        """Buffers and frozen parameters, whole."""
        module = self._model.get("module") or {}
        out = {n: module[n] for n in self._model.get("buffer_names") or [] if n in module}
        frozen = self._model.get("frozen_param_shapes") or {}
        if self.stage != 3 and not frozen:
            # DeepSpeed 0.19 records no frozen_param_shapes at stage 1/2: the module's state
            # holds them whole, beside the trained weights (whose fp32 masters are in the
            # partitions) and the tied names of those.
            aliases = self._model.get("shared_params") or {}
            frozen = {
                n: tuple(t.shape)
                for n, t in module.items()
                if n not in self._places and n not in aliases and n not in out
            }
        if not frozen:
            return out
        if self.stage != 3:
            for name in frozen:
                if name not in module:
                    raise CheckpointError(f"{self.manifest_path}: frozen parameter {name} missing")
                out[name] = module[name]
            return out
        fragments = [self._model.get("frozen_param_fragments") or {}]
        for file in model_files[1:]:
            content = load_ds_file(file)
            if not isinstance(content, dict):
                raise CheckpointError(f"{file} is not a DeepSpeed model-states file")
            check_fragments(content, file)
            fragments.append(content.get("frozen_param_fragments") or {})
        for name, shape in frozen.items():
            numel = math.prod(shape)
            parts = [f.get(name) for f in fragments]
            if any(p is None for p in parts):
                raise self._bad(f"a rank's part of frozen parameter {name} is missing")
            flat = torch.cat([p.reshape(-1) for p in parts])
            if flat.numel() < numel:
                raise self._bad(
                    f"the ranks' parts of frozen parameter {name} (frozen_param_fragments) hold "
                    f"{flat.numel()} elements, its shape {list(shape)} needs {numel}"
                )
            out[name] = flat[:numel].view(tuple(shape))
        return out

    # ------------------------------------------------------------------ reads
    def read(self, name: str, kind: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Elements [lo, hi) of the flattened ``name`` of ``kind`` (fp32), a new tensor."""
        place = self._places.get(name)
        if place is None:
            raise CheckpointError(f"{self.path} has no parameter {name}")
        if kind not in self._flats:
            raise CheckpointError(
                f"{self.path} holds no {kind!r} state (it has {', '.join(sorted(self._flats))})"
            )
        hi = place.numel if hi is None else hi
        if not 0 <= lo <= hi <= place.numel:
            raise CheckpointError(f"range [{lo}, {hi}) is outside {name} ({place.numel} elements)")
        out = torch.empty(hi - lo, dtype=torch.float32)
        for span in place.spans:
            a, b = max(lo, span.lo), min(hi, span.hi)
            if a < b:
                flat = self._flats[kind][span.rank]
                if self.stage != 3:
                    flat = [flat[place.group]]
                out[a - lo : b - lo] = _flat_slice(flat, span.at + a - span.lo, b - a)
        return out

    def param_group(self, name: str) -> int:
        return self._places[name].group

    def read_full(self, name: str, kind: str = "param") -> torch.Tensor:
        return self.read(name, kind).view(self.shapes[name])

    def read_extra(self, name: str) -> torch.Tensor:
        return self._extra[name]

    # ------------------------------------------------------------------ state
    def state(self, key: str, default: Any = None) -> Any:
        m = self._model
        if key == "optimizer":
            return self._optimizer_state()
        if key == "lr_scheduler":
            return m.get("lr_scheduler")
        if key == "loss_scaler":
            return _loss_scaler(self._optim[0].get("loss_scaler"))
        if key == "counters":
            keys = ("global_steps", "global_samples", "skipped_steps")
            return {k: int(m[k]) for k in keys if isinstance(m.get(k), int)}
        if key == "client_state":
            return {k: v for k, v in m.items() if k not in DS_STATE_KEYS}
        if key == "aliases":
            return dict(m.get("shared_params") or {})
        if key == "zero_stage":
            return self.stage
        return default

    def rank_state(self, rank: int) -> dict:  # noqa: ARG002 - DeepSpeed saves no RNG state
        return {}

    def _optimizer_state(self) -> dict:
        base = self._base_state(self._optim[0])
        groups = base.get("param_groups") or []
        if len(groups) != len(self._model["param_shapes"]) and self.stage != 3:
            raise self._bad(
                f"{len(groups)} optimizer param groups for {len(self._model['param_shapes'])} "
                "groups of parameters"
            )
        hyper, scalars = [], []
        for group in groups:
            hyper.append({k: v for k, v in group.items() if k != "params"})
            first = (group.get("params") or [None])[0]
            entry = base["state"].get(first, {})
            values = {
                k: _scalar(v, k, self._optim[0]["_file"])
                for k, v in entry.items()
                if k in _SCALAR_STATE or not (torch.is_tensor(v) and v.dim() > 0)
            }
            scalars.append({"values": jsonable.encode(values, "optimizer state"), "on_device": []})
        return {"class": self._optimizer_class(), "param_groups": hyper, "scalar_state": scalars}

    def _optimizer_class(self) -> str | None:
        config = (self._model.get("ds_config") or {}).get("optimizer")
        if not isinstance(config, dict) or "type" not in config:
            return None  # a client optimizer: DeepSpeed does not record its class
        from runtime.optim import resolve_optimizer_class

        try:
            return resolve_optimizer_class(
                str(config["type"]), dict(config.get("params") or {})
            ).__name__
        except Exception:  # noqa: BLE001 - a type this runtime lacks: the check names it later
            return str(config["type"])

    def check_engine(self, engine) -> None:
        """What the names and shapes do not show: which param group each parameter is in."""
        trained = engine.sharding.trained_params()
        for name, param in trained.items():
            place = self._places.get(name)
            if place is not None and place.group != param.param_group and self.stage != 3:
                raise self._bad(
                    f"parameter {name} is in param group {place.group} of the checkpoint but in "
                    f"group {param.param_group} of this engine; build the optimizer's param "
                    "groups in the same order as the run that saved it"
                )

    def describe(self) -> dict:
        return {
            "path": self.path,
            "format": f"DeepSpeed ZeRO-{self.stage}",
            "world_size": self.world_size,
            "params": len(self.shapes),
            "kinds": sorted(self.kinds),
        }

    def close(self) -> None:
        self._flats = {}
        self._extra = {}

    def __enter__(self) -> DeepSpeedReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Optimizer state that is one number whatever its shape in the file.
_SCALAR_STATE = frozenset({"step"})


def _scalar(value: Any, key: str, file: str) -> Any:
    """A scalar optimizer state entry as torch's optimizers keep it: ``step`` a 0-dim float32
    tensor (DeepSpeed's FusedAdam and CPUAdam keep a plain int, torch's Adam a tensor; torch's
    Adam refuses to step with anything but a singleton tensor)."""
    if key != "step":
        return value
    if torch.is_tensor(value) and value.numel() == 1 and value.dtype != torch.bool:
        number = float(value.reshape(()))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise CheckpointError(
            f"{file}: optimizer state 'step' is {value!r:.60}, not a number or a one-element tensor"
        )
    if not (math.isfinite(number) and number >= 0 and number == int(number)):
        raise CheckpointError(f"{file}: optimizer state 'step' is {number}, not a count of steps")
    return torch.tensor(number, dtype=torch.float32)


def _flat_slice(parts: list[torch.Tensor], at: int, count: int) -> torch.Tensor:
    """``count`` elements from ``at`` of the concatenation of ``parts``."""
    pieces = []
    for t in parts:
        n = t.numel()
        if at < n and count > 0:
            take = min(count, n - at)
            pieces.append(t.reshape(-1)[at : at + take])
            count -= take
            at = 0
        else:
            at -= n
    if count:
        raise CheckpointError("a DeepSpeed flat tensor is shorter than its layout")
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _loss_scaler(scaler: Any) -> dict | None:
    """DeepSpeed's fp16 loss scaler as this runtime's scaler state (None: nothing to restore,
    the config's static scale or no scaler applies)."""
    if not isinstance(scaler, DSObject) or not scaler.get("dynamic", False):
        return None
    return {
        "dynamic": True,
        "scale": float(scaler.get("cur_scale")),
        "iteration": int(scaler.get("cur_iter", 0)),
        "last_overflow_iteration": int(scaler.get("last_overflow_iter", -1)),
        "hysteresis_left": int(scaler.get("cur_hysteresis", scaler.get("delayed_shift", 1))),
    }
