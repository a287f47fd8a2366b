"""Training precision: parameter dtype, loss scaling, and the one per-step gradient check.

fp16 trains 16-bit parameters and gradients against fp32 master weights with a loss scale
(dynamic or static, runtime.optim.loss_scaler); bf16 the same without scaling; fp32 uses the
parameters themselves as master weights. Whether the step overflowed and the global gradient
norm are decided together by ONE all-reduce of ``[sum of squares, non-finite flag]``, and the
step metrics' numbers (loss, tokens: `StepRiders`) ride in the same tensor, so that an optimizer
step pays one small collective and one host read (at stage 0, where the gradients are whole on
every rank, the collective carries only the riders).

A step whose gradients hold inf or nan is skipped (and counted) at every precision and ZeRO
stage, so the weights never silently become non-finite. DeepSpeed (0.19.8, measured) skips the
same steps, with one exception: at fp32 stage 0 it applies them. ``bf16.check_grad_overflow:
false`` applies such steps at bf16 stages 1-2, the only place DeepSpeed reads the key (at bf16
stages 0 and 3 it skips them regardless, and so does this runtime).
"""

from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass

import torch

from runtime.distributed import Communicator

__all__ = ["PrecisionMode", "Precision", "GradStats", "StepRiders", "global_grad_stats"]

log = logging.getLogger("runtime.optim.precision")


class PrecisionMode(enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


_DTYPES = {
    PrecisionMode.FP32: torch.float32,
    PrecisionMode.FP16: torch.float16,
    PrecisionMode.BF16: torch.bfloat16,
}


class Precision:
    """The precision policy of one engine."""

    def __init__(self, mode: PrecisionMode, fp16_config=None, *, check_overflow: bool = True):
        self.mode = mode
        self.param_dtype = _DTYPES[mode]
        self.check_overflow = check_overflow or mode is PrecisionMode.FP16
        """Skip steps with non-finite gradients (always under fp16: the loss scale needs it)."""
        self.scaler = None
        if mode is PrecisionMode.FP16:
            from .loss_scaler import build_loss_scaler

            self.scaler = build_loss_scaler(fp16_config)

    @classmethod
    def from_config(cls, config) -> Precision:
        mode = PrecisionMode(config.precision)
        check = True
        if mode is PrecisionMode.BF16 and config.zero_optimization.stage in (1, 2):
            check = config.bf16.check_grad_overflow
        return cls(mode, config.fp16, check_overflow=check)

    @property
    def mixed(self) -> bool:
        """Master weights are a separate fp32 copy."""
        return self.mode is not PrecisionMode.FP32

    @property
    def skips_on_overflow(self) -> bool:
        """A step with non-finite gradients is skipped instead of applied."""
        return self.check_overflow

    @property
    def loss_scale(self) -> float:
        return float(self.scaler.scale) if self.scaler is not None else 1.0

    def cast_inputs(self, obj):
        """Floating tensors in ``obj`` (nested lists, tuples, dicts) in the parameters' dtype
        under mixed precision; anything else as it is."""
        if not self.mixed:
            return obj
        return _cast_floats(obj, self.param_dtype)

    def state_dict(self) -> dict | None:
        """The loss scaler's state (fp16), or None: nothing else here changes while training."""
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if self.scaler is not None and state is not None:
            self.scaler.load_state_dict(state)

    def update(self, overflow: bool, *, step: int, rank: int) -> None:
        """Feed the step's overflow to the scaler; rank 0 logs one line on overflow."""
        if self.scaler is None:
            if overflow and rank == 0:
                log.warning(
                    "step %d: %s gradients are not finite (inf or nan): skipping step",
                    step,
                    self.mode.value,
                )
            return
        before = self.loss_scale
        self.scaler.update(overflow)
        if overflow and rank == 0:
            message = getattr(self.scaler, "last_message", None) or (
                f"gradient overflow: skipping step, loss scale {before:g} -> {self.loss_scale:g}"
            )
            log.warning("step %d: fp16 %s", step, message)


def _cast_floats(obj, dtype):
    if torch.is_tensor(obj):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_floats(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj


@dataclass(frozen=True)
class GradStats:
    sq_norm: float
    """Sum of squares of the (scaled) gradients over all ranks."""
    nonfinite: bool
    """Some rank saw an inf or nan."""


class StepRiders:
    """Numbers summed over the data-parallel ranks in the step's gradient-statistics
    all-reduce instead of a collective of their own (the step metrics' loss and tokens, stage
    3's collective-sequence check).

    Before the optimizer step every rank boards the same seats with the same number of float64
    values each, in the same order; the gradient check sends them with its own and leaves the
    sums here, by seat. Nothing boarded, or a norm summed over another group (a model-parallel
    layout): `take_sums` is None and the owner reduces its numbers itself."""

    METRICS = "metrics"

    def __init__(self) -> None:
        self._local: dict[str, torch.Tensor] = {}
        self._sums: dict[str, list[float]] = {}
        self._layout: list[tuple[str, int]] = []

    def board(self, values: torch.Tensor, seat: str = METRICS) -> None:
        self._local[seat] = values.reshape(-1)
        self._sums.pop(seat, None)

    def take_local(self) -> torch.Tensor | None:
        """Every seat's values, concatenated in boarding order (the sums come back in it)."""
        if not self._local:
            return None
        self._layout = [(seat, t.numel()) for seat, t in self._local.items()]
        device = next(iter(self._local.values())).device
        values = [_to_device(t, device) for t in self._local.values()]
        self._local = {}
        return torch.cat(values)

    def set_sums(self, sums: list[float]) -> None:
        at = 0
        for seat, n in self._layout:
            self._sums[seat] = sums[at : at + n]
            at += n

    def take_sums(self, seat: str = METRICS) -> list[float] | None:
        """This seat's summed values of this step (once), or None when they did not ride."""
        self._local.pop(seat, None)
        return self._sums.pop(seat, None)


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` in float64 on ``device``. A host tensor goes to a GPU from pinned memory without
    blocking: a plain copy from pageable memory would make the host wait for the device."""
    t = t.to(torch.float64)
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def global_grad_stats(
    grads: list[torch.Tensor],
    comm: Communicator,
    partitioned: bool,
    riders: StepRiders | None = None,
) -> GradStats:
    """Squared norm and overflow of gradients, summed over ranks with one all-reduce that also
    sums what `riders` carries; one host read.

    ``partitioned``: each rank holds a disjoint shard (stages 1-2), so the partial sums add up;
    otherwise every rank holds the same full gradients: their statistics stay local and the
    collective runs only for the riders (zeros stand in for the statistics on the wire).
    """
    extra = riders.take_local() if riders is not None else None
    device = grads[0].device if grads else (extra.device if extra is not None else "cpu")
    if grads:
        norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads])
        sq = norms.double().square().sum()
        flag = (~torch.isfinite(norms)).any().double()
        local = torch.stack([sq, flag])
    else:
        local = torch.zeros(2, dtype=torch.float64, device=device)
    if extra is None:
        if partitioned:
            comm.all_reduce(local)
        values = local.tolist()
    else:
        carried = local if partitioned else torch.zeros_like(local)
        wire = torch.cat([carried, _to_device(extra, torch.device(device)).reshape(-1)])
        comm.all_reduce(wire)
        values = (wire if partitioned else torch.cat([local, wire[2:]])).tolist()
        riders.set_sums(values[2:])
    sq_norm, flag = values[0], values[1]
    return GradStats(sq_norm, flag > 0 or not math.isfinite(sq_norm))
