"""Step metrics: what rank 0 tells the controller every step (and the log on report steps).

On every optimizer step each rank sends three numbers (its mean micro-batch loss of the step,
whether it had one, and the tokens it saw) with the gradient-norm all-reduce of the step
(`runtime.optim.precision.StepRiders`: one collective and one host read per step; under a
model-parallel norm they take an all-reduce of their own), and rank 0 emits one event to the
controller (under zlaunch; without it only report steps are logged: the first,
every ``steps_per_print``-th, a skipped one and the last)::

    {"kind": "metrics", "source": "engine", "step", "samples", "total_steps", "loss", "lr",
     "loss_scale", "grad_norm", "skipped_steps", "step_time", "samples_per_s", "tokens_per_s",
     "memory_kind", "memory_bytes", "memory_peak_bytes", "comm_bytes", "world_size"}

Every key is always present (``None`` where it does not apply: ``grad_norm`` on an overflow
step, ``tokens_per_s`` when the batch is not a token tensor, ``total_steps`` when unknown), plus
``"report"`` (a report step). ``loss`` is the step's loss: the mean over its micro batches and
over the data-parallel ranks. ``step_time`` and the rates are over the step (so they include
data loading). New keys may be added; readers ignore the ones they do not know. Memory is the device's allocated/peak bytes on GPU, the process RSS and
peak RSS on CPU. ``comm_bytes`` is this rank's logical traffic so far (`runtime.distributed.comm`).
``flops_per_step``, ``tflops``, ``mfu``, ``peak_tflops``, ``peak_source`` and, with
``wall_clock_breakdown``, the per-phase times and the straggler come from runtime.observe.profiling
(see its insight module). The ``csv_monitor`` and ``wandb`` blocks write the same scalars
(runtime.observe.monitors).

Under zlaunch (``ZLAUNCH_EVENTS_FD`` set by the agent) the event is one JSON line on that pipe,
never on the script's stdout; the controller writes it to ``metrics.jsonl`` and the live view.
Without zlaunch it is logged as one line on the ``runtime.observe.metrics`` logger (printed to stdout
when logging is not configured). ``engine.log_metrics({...})`` sends a script's own values the
same way (``"source": "user"``). The DeepSpeed ``tensorboard`` block writes the same scalars
with ``torch.utils.tensorboard`` when the ``tensorboard`` package is installed.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import sys
import time
import warnings
from typing import Any

import torch

from runtime.errors import InvalidTypeError, InvalidValueError

__all__ = ["StepMetrics", "EventSink", "EVENTS_FD_ENV", "TOTAL_STEPS_ENV", "METRIC_FIELDS"]

log = logging.getLogger("runtime.observe.metrics")

from zlaunch.wire import EVENTS_FD_ENV, TOTAL_STEPS_ENV, events  # noqa: E402

BUSY_BATCH = 10
"""Steps of a rank's own times sent in one step_busy event: one scored window."""

METRIC_FIELDS = (
    "step",
    "samples",
    "total_steps",
    "loss",
    "lr",
    "loss_scale",
    "grad_norm",
    "skipped_steps",
    "step_time",
    "samples_per_s",
    "tokens_per_s",
    "memory_kind",
    "memory_bytes",
    "memory_peak_bytes",
    "comm_bytes",
    "world_size",
    # runtime.observe.profiling: FLOPs counted once, their rate, MFU against a peak
    "flops_per_step",
    "tflops",
    "mfu",
    "peak_tflops",
    "peak_source",
)


class EventSink:
    """Where rank 0's events go: the zlaunch events pipe if there is one, else the log."""

    def __init__(self, environ: dict[str, str] | None = None):
        environ = os.environ if environ is None else environ
        self.fd: int | None = None
        raw = environ.get(EVENTS_FD_ENV, "")
        if raw.isdigit():
            fd = int(raw)
            try:
                os.fstat(fd)
                self.fd = fd
            except OSError:
                warnings.warn(
                    f"{EVENTS_FD_ENV}={raw} is not an open file descriptor; metrics go to the "
                    "log instead",
                    stacklevel=3,
                )

    def emit(self, event: events.WorkerEvent) -> None:
        if self.fd is not None:
            # NaN and infinity as JSON's common extension (NaN, Infinity): a script's diverged
            # validation loss is news for the controller, which reads them (wire/metrics_check)
            if events.emit(self.fd, event, default=_jsonable):
                return
            self.fd = None  # the agent is gone; keep training, keep reporting locally
        if isinstance(event, events.Metrics):  # the other kinds only mean something to zlaunch
            _log_line(format_line(event.row()))


def _jsonable(value: Any) -> Any:
    if torch.is_tensor(value) and value.numel() == 1:
        return value.item()
    return str(value)


def _log_line(text: str) -> None:
    if not log.handlers and not logging.getLogger().handlers:
        # Logging not configured by the script: make the line visible anyway, on stdout.
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    log.info("%s", text)


def format_line(event: dict[str, Any]) -> str:
    """One event as one human line: ``step 10/100 | loss 2.304 | lr 0.001 | ...``."""
    from zlaunch.wire import format_line as shared_format_line

    return shared_format_line(event)


_META = ("kind", "source", "step")


def _memory(device: torch.device) -> tuple[str, int, int]:
    if device.type == "cuda":
        return (
            "cuda",
            int(torch.cuda.memory_allocated(device)),
            int(torch.cuda.max_memory_allocated(device)),
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    try:
        with open("/proc/self/statm") as handle:
            rss = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = peak
    return "rss", rss, max(peak, rss)


def _token_count(args: tuple, kwargs: dict) -> int | None:
    """numel of the input ids when the batch is a token tensor (integer dtype), else None."""
    candidate = kwargs.get("input_ids")
    if candidate is None and args:
        candidate = args[0]
        if isinstance(candidate, dict):
            candidate = candidate.get("input_ids")
        elif isinstance(candidate, (list, tuple)) and candidate:
            candidate = candidate[0]
    if torch.is_tensor(candidate) and not candidate.is_floating_point():
        if candidate.dtype not in (torch.bool, torch.complex64, torch.complex128):
            return candidate.numel()
    return None


class StepMetrics:
    """Collects one engine's per-step numbers and reports them on report steps.

    The engine calls ``on_forward`` / ``on_backward``, and ``after_step`` as a step hook; every
    rank must report every optimizer step, since report steps run one collective.
    """

    def __init__(self, engine: Any, sink: EventSink | None = None):
        self.engine = engine
        self.rank = engine.global_rank
        self.every = int(engine.config.steps_per_print or 0)
        self.sink = (sink or EventSink()) if self.rank == 0 else None
        # Every rank's own step time goes to the controller (only under zlaunch): each rank
        # writes its own line on its own events pipe, no collective.
        self.busy_sink = self.sink
        if self.rank != 0 and os.environ.get(EVENTS_FD_ENV, "").isdigit():
            self.busy_sink = EventSink()
        self._busy: list[float] = []  # this rank's own seconds of the steps not sent yet
        self._waited: list[float] = []  # and its seconds waiting for its peers in them
        self._busy_first = 0  # the step of self._busy[0]
        self._total_steps: int | None = None
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0
        self._tokens = 0
        self._saw_tokens = False
        self._window_start: float | None = None
        self._window_steps = 0
        self._window_samples = 0
        self._tb = _tensorboard_writer(engine.config, self.rank)
        from .monitors import build_monitors  # csv_monitor, wandb (rank 0)

        self._monitors = build_monitors(engine.config, self.rank)

    # ---- total steps, for the progress bar ----------------------------------------------

    def set_total_steps(self, total: int | None) -> None:
        if total is not None and (isinstance(total, bool) or int(total) <= 0):
            raise InvalidValueError(f"set_total_steps: a positive number of steps, got {total!r}")
        self._total_steps = None if total is None else int(total)

    @property
    def total_steps(self) -> int | None:
        if self._total_steps is not None:
            return self._total_steps
        raw = os.environ.get(TOTAL_STEPS_ENV, "")
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
        total = getattr(self.engine.lr_scheduler, "total_num_steps", None)
        return int(total) if isinstance(total, int) and total > 0 else None

    # ---- hooks ----------------------------------------------------------------------------

    def on_forward(self, args: tuple, kwargs: dict) -> None:
        if self._window_start is None:
            self._window_start = time.perf_counter()
        tokens = _token_count(args, kwargs)
        if tokens is not None:
            self._tokens += tokens
            self._saw_tokens = True

    def on_backward(self, loss: torch.Tensor) -> None:
        if self._window_start is None:
            self._window_start = time.perf_counter()
        if not torch.is_tensor(loss):
            return
        value = loss.detach().float().mean()
        self._loss_sum = value if self._loss_sum is None else self._loss_sum + value
        self._loss_count += 1

    def after_step(self, engine: Any, outcome: Any) -> None:  # noqa: ARG002 - a step hook
        """`runtime.engine.step_hooks.StepHook`: report each optimizer step (``outcome`` is None
        between accumulation boundaries)."""
        if outcome is not None:
            self.on_boundary(outcome.grad_norm, outcome.skipped)

    def board(self, riders: Any) -> None:
        """Before the optimizer step: put this step's loss and tokens on `riders`
        (`runtime.optim.precision.StepRiders`) so they are summed with the gradient norm."""
        riders.board(self._local_numbers())

    def on_boundary(self, grad_norm: float | None, skipped: bool = False) -> None:
        """After an optimizer step (``engine.global_steps`` already counts it).

        Every step: one small all-reduce (the step's loss over data-parallel ranks, tokens) and,
        under zlaunch, one event to the controller, so the panel, ``metrics.jsonl``, ``ls`` and
        ``status`` are never behind. ``"report": true`` marks the steps that are also printed
        and written to tensorboard/csv/wandb: the first, every ``steps_per_print``-th, a skipped
        one (non-finite gradients) and the last (``total_steps``). Without zlaunch only those
        are logged."""
        engine = self.engine
        self._window_steps += 1
        self._window_samples += engine.train_batch_size()
        step = engine.global_steps
        total = self.total_steps
        report = (
            step == 1
            or skipped
            or (self.every > 0 and step % self.every == 0)
            or (total is not None and step == total)
        )
        now = time.perf_counter()
        elapsed = max(now - (self._window_start or now), 1e-9)
        loss, tokens = self._reduce()
        insight = getattr(
            engine, "insight", None
        )  # runtime.observe.profiling; every rank (collective)
        per_step = elapsed / max(self._window_steps, 1)
        extra = insight.report_fields(step, per_step, report) if insight else {}
        if self.rank == 0:
            event = self._event(step, loss, tokens, elapsed, grad_norm)
            event.update(extra)
            event["report"] = report
            if report or self.sink.fd is not None:
                self.sink.emit(events.Metrics.of_row(event))
            if report:
                if self._tb is not None:
                    self._tb.write(event)
                for monitor in self._monitors:
                    monitor.write(event)
        self._send_busy(insight, step, step == total)
        self._window_start = now
        self._window_steps = 0
        self._window_samples = 0
        self._tokens = 0
        self._reset_loss()

    def _send_busy(self, insight: Any, step: int, last: bool) -> None:
        """This rank's own seconds of the step (taken after the step's collectives, which are
        where it waited for its peers), sent to the controller (zlaunch/launcher/stragglers.py)
        every BUSY_BATCH steps: one line per step from every rank woke the agent often enough
        to cost a few percent of a small step on a busy host (benchmarks/stragglers_cost.py)."""
        busy = insight.busy.lap() if insight is not None and insight.busy is not None else None
        sink = self.busy_sink
        if busy is None or sink is None or sink.fd is None:
            return
        if not self._busy:
            self._busy_first = step
        self._busy.append(busy)
        self._waited.append(insight.busy.waited)
        if len(self._busy) >= BUSY_BATCH or last:
            sink.emit(events.StepBusy(self._busy_first, self._busy, self._waited))
            self._busy = []
            self._waited = []

    def log_metrics(self, values: dict[str, Any], step: int | None = None) -> None:
        """A script's own values, sent by rank 0 like the step metrics."""
        if not isinstance(values, dict) or not values:
            raise InvalidTypeError("log_metrics expects a non-empty dict of name -> number")
        if self.rank != 0:
            return
        clean: dict[str, Any] = {}
        for key, value in values.items():
            if torch.is_tensor(value):
                value = value.detach().float().mean().item()
            if not isinstance(key, str) or key in _META:
                raise InvalidValueError(f"log_metrics: bad metric name {key!r}")
            clean[key] = value
        event = {
            "kind": "metrics",
            "source": "user",
            "step": self.engine.global_steps if step is None else int(step),
            **clean,
        }
        self.sink.emit(events.Metrics.of_row(event))
        if self._tb is not None:
            self._tb.write_user(event, self.engine.global_samples)
        for monitor in self._monitors:
            monitor.write_user(event, self.engine.global_samples)

    # ---- internals ------------------------------------------------------------------------

    def _reset_loss(self) -> None:
        self._loss_sum = None
        self._loss_count = 0

    def _local_numbers(self) -> torch.Tensor:
        """[this rank's mean loss of the step, 1 if it had one, tokens] in float64, built on
        the device without reading anything back."""
        device = self.engine.device
        # A fill, not torch.tensor(...): a host-to-device copy would wait for the device.
        tokens = torch.full((), float(self._tokens), dtype=torch.float64, device=device)
        if self._loss_sum is not None and self._loss_count:
            loss = self._loss_sum.to(device, torch.float64) / self._loss_count
            had = torch.ones((), dtype=torch.float64, device=device)
        else:
            loss = had = torch.zeros((), dtype=torch.float64, device=device)
        return torch.stack([loss, had, tokens])

    def _reduce(self) -> tuple[float | None, int]:
        """Mean loss over data-parallel ranks and tokens over ranks: summed with the step's
        gradient norm when they rode along (`board`), else one all-reduce of 3 here."""
        engine = self.engine
        riders = getattr(engine, "step_riders", None)
        sums = riders.take_sums() if riders is not None else None
        if sums is None:
            local = self._local_numbers()
            engine.comm.all_reduce(local)
            sums = local.tolist()
        loss_sum, reporting, tokens = sums
        loss = loss_sum / reporting if reporting else None
        if loss is not None and not math.isfinite(loss):
            loss = None  # JSON has no inf/nan; grad_norm None and skipped_steps tell the story
        return loss, int(tokens)

    def _event(
        self, step: int, loss: float | None, tokens: int, elapsed: float, grad_norm: float | None
    ) -> dict[str, Any]:
        engine = self.engine
        kind, mem, peak = _memory(engine.device)
        lrs = engine.get_lr()
        steps = max(self._window_steps, 1)
        return {
            "kind": "metrics",
            "source": "engine",
            "step": step,
            "samples": engine.global_samples,
            "total_steps": self.total_steps,
            "loss": loss,
            "lr": lrs[0] if lrs else None,
            "loss_scale": float(engine.precision.loss_scale),
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "skipped_steps": engine.skipped_steps,
            "step_time": elapsed / steps,
            "samples_per_s": self._window_samples / elapsed,
            "tokens_per_s": tokens / elapsed if self._saw_tokens else None,
            "memory_kind": kind,
            "memory_bytes": mem,
            "memory_peak_bytes": peak,
            "comm_bytes": engine.comm.stats.total_bytes,
            "world_size": engine.world_size,
            "flops_per_step": None,
            "tflops": None,
            "mfu": None,
            "peak_tflops": None,
            "peak_source": None,
        }


class _TensorBoard:
    """Scalars against the number of samples seen, under DeepSpeed's names."""

    _SCALARS = {
        "loss": "Train/Samples/train_loss",
        "lr": "Train/Samples/lr",
        "loss_scale": "Train/Samples/loss_scale",
        "grad_norm": "Train/Samples/grad_norm",
        "samples_per_s": "Train/Samples/samples_per_s",
        "tokens_per_s": "Train/Samples/tokens_per_s",
        "memory_bytes": "Train/Samples/memory_bytes",
    }

    def __init__(self, writer: Any):
        self.writer = writer

    def write(self, event: dict[str, Any]) -> None:
        for key, tag in self._SCALARS.items():
            value = event.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(tag, value, event["samples"])
        self.writer.flush()

    def write_user(self, event: dict[str, Any], samples: int) -> None:
        for key, value in event.items():
            if key not in _META and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(f"Train/Samples/{key}", value, samples)
        self.writer.flush()


def _tensorboard_writer(config: Any, rank: int) -> _TensorBoard | None:
    block = getattr(config, "tensorboard", None)
    if rank != 0 or block is None or not block.enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        warnings.warn(
            "tensorboard.enabled is true in the config but the tensorboard package is not "
            "installed, so no TensorBoard events are written; install it with "
            "pip install 'zlaunch[tensorboard]' (or pip install tensorboard)",
            stacklevel=2,
        )
        return None
    path = os.path.join(block.output_path or "runs", block.job_name or "DeepSpeedJobName")
    return _TensorBoard(SummaryWriter(log_dir=path))
