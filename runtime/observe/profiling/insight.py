"""What the engine tells the profilers, and what they add to the step metrics.

`StepInsight` is built once by the engine from the config and owns its parts: the wall-clock
timers (`wall_clock_breakdown`), the comms logger (`comms_logger`), the FLOP count of one step
(for MFU, where it was asked for: `flops_profiler`, which adds the per-module table, or
`zlaunch --mfu` / `--peak-tflops`). The engine calls the
`forward_*`, `backward_*`, `step_*` hooks; StepMetrics asks `report_fields` on report steps,
on every rank (the breakdown is gathered from all ranks there, one small all-gather).

Fields added to the engine's metrics event:

- always: ``flops_per_step`` (this rank, forward+backward of all micro-batches of one optimizer
  step, counted once at ``flops_profiler.profile_step``, default 1), ``tflops`` (per device,
  over the report window's step time, data loading included), ``mfu`` (tflops / peak),
  ``peak_tflops`` and ``peak_source``; None until the count is done, when no peak is known,
  and when nobody asked for the count.
- with wall_clock_breakdown: ``time_forward``, ``time_backward``, ``time_reduce_wait``,
  ``time_step``, ``time_allgather_wait`` (rank 0, seconds per optimizer step over the window),
  the same with ``slowest_`` for the slowest rank (the most forward+backward+step time less
  the waits: a straggler's peers spend its extra time waiting in collectives),
  ``slowest_rank`` and ``straggler`` ("host (rank N)").

Why the count is asked for rather than always on: torch's counter is a dispatch mode, a Python
call on every op, which slowed the counted step by 3-14% on examples/gpt.py models of 6 and 2
layers on CPU and forces it eager under torch.compile. The light count (`StepFlops`, MFU only)
is entered inside the engine's forward and backward calls only, never between them, so a script
that leaves a step unfinished (an exception, an engine dropped mid-accumulation) leaves no mode
on. The profiler's count (`ModuleProfile`) spans its step's first forward to its last backward:
torch attributes backward FLOPs to modules only across the whole span.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import torch

from zlaunch.wire import EVENTS_FD_ENV, MFU_ENV, PEAK_TFLOPS_ENV

from .busy import BusyClock
from .comms import CommsLogger, format_summary
from .flops import ModuleProfile, StepFlops, StepTimes, format_table
from .peak import Peak, resolve_peak
from .timers import PHASES, Phase, WallClock

__all__ = ["StepInsight", "BREAKDOWN_FIELDS"]

log = logging.getLogger("runtime.observe.profiling")

BREAKDOWN_FIELDS = tuple(f"time_{p.value}" for p in PHASES)
_HOST_BYTES = 64


def mfu_asked(environ) -> bool:
    """`zlaunch --mfu` or `--peak-tflops` (or their variables, under another launcher)."""
    return environ.get(MFU_ENV, "").strip() == "1" or bool(environ.get(PEAK_TFLOPS_ENV, "").strip())


class _Fanout:
    """Several observers of one CommStats."""

    sync_cuda = False

    def __init__(self, *observers):
        self.observers = observers
        self.sync_cuda = any(o.sync_cuda for o in observers)

    def on_done(self, *args) -> None:
        for o in self.observers:
            o.on_done(*args)


class StepInsight:
    def __init__(self, engine: Any):
        config = engine.config
        self.engine = engine
        self.rank = engine.global_rank
        self.every = int(config.steps_per_print or 0)
        cuda = engine.device.type == "cuda"
        self.clock = WallClock(sync_cuda=cuda) if config.wall_clock_breakdown else None
        block = config.comms_logger
        self.comms = None
        if block.enabled:
            self.comms = CommsLogger(
                kinds=block.kinds,
                verbose=block.verbose,
                debug=block.debug,
                rank=self.rank,
                sync_cuda=cuda,
            )
        # Each rank's own step time for zlaunch's straggler scores: under zlaunch, on CPU
        # devices (where the host is blocked for as long as a collective waits).
        under_zlaunch = os.environ.get(EVENTS_FD_ENV, "").isdigit()
        self.busy = BusyClock() if under_zlaunch and engine.device.type == "cpu" else None
        observers = [o for o in (self.clock, self.comms, self.busy) if o is not None]
        if observers:
            stats = engine.comm.stats
            stats.observer = observers[0] if len(observers) == 1 else _Fanout(*observers)
        self.profiler_config = config.flops_profiler
        self.profile_step = self.profiler_config.profile_step if self.profiler_config.enabled else 1
        self.count_flops = self.profiler_config.enabled or mfu_asked(os.environ)
        self._sync_cuda = cuda
        self._counter: StepFlops | ModuleProfile | None = None  # the counted step is running
        self._counting = False  # the counter's dispatch mode is entered
        self._profile_started = 0.0
        self._profile_times = StepTimes()  # the profiled step's phases, for the profile
        self._phase_started = 0.0
        self.flops_per_step: int | None = None
        self._peak: Peak | None = None
        self._hosts: list[str] | None = None

    @property
    def counting(self) -> bool:
        """Torch's FLOP counting (a dispatch mode) is on: this step must run eagerly."""
        return self._counting

    # ---- engine hooks -----------------------------------------------------------------------

    def forward_begin(self) -> None:
        # Only a training forward starts the count: its backward ends it. An evaluation
        # forward (no grad) has none to end it, and adds nothing to a training step's FLOPs.
        if self.count_flops and self.flops_per_step is None and torch.is_grad_enabled():
            if self._counter is None and self.engine.global_steps + 1 == self.profile_step:
                self._start_count()
            elif isinstance(self._counter, StepFlops):
                self._resume_count()
        if self.clock is not None:
            self.clock.start(Phase.FORWARD)
        if self.busy is not None:
            self.busy.start()
        self._phase_begin()

    def forward_end(self) -> None:
        """After the engine's forward, also when it raised (the engine calls it in `finally`)."""
        if self.clock is not None:
            self.clock.stop()
        self._profile_times.forward_s += self._phase_seconds()
        if isinstance(self._counter, StepFlops):
            self._pause_count()

    def backward_begin(self) -> None:
        if isinstance(self._counter, StepFlops):
            self._resume_count()
        if self.clock is not None:
            self.clock.start(Phase.BACKWARD)
        self._phase_begin()

    def backward_end(self, boundary: bool) -> None:
        """After the engine's backward, also when it raised."""
        if self.clock is not None:
            self.clock.stop()
        self._profile_times.backward_s += self._phase_seconds()
        if isinstance(self._counter, StepFlops):
            self._pause_count()
        elif boundary and self._counting:
            self._counting = False
            self._counter.__exit__(None, None, None)

    def step_begin(self) -> None:
        if self.clock is not None:
            self.clock.start(Phase.STEP)
        self._phase_begin()

    def step_end(self) -> None:
        """After an optimizer step (accumulation boundary), before the step metrics."""
        if self.clock is not None:
            self.clock.stop()
            self.clock.end_step()
        self._profile_times.step_s += self._phase_seconds()
        counter = self._counter
        if counter is not None and not self._counting:
            self._counter = None
            self.flops_per_step = counter.flops
            if isinstance(counter, ModuleProfile):
                self._show_profile(counter, time.perf_counter() - self._profile_started)

    # ---- FLOPs ---------------------------------------------------------------------------------

    def _profiling(self) -> bool:
        return isinstance(self._counter, ModuleProfile)

    def _phase_begin(self) -> None:
        if self._profiling():
            if self._sync_cuda:
                torch.cuda.synchronize()
            self._phase_started = time.perf_counter()

    def _phase_seconds(self) -> float:
        """Seconds since `_phase_begin` while the module profile runs, else 0."""
        if not self._profiling():
            return 0.0
        if self._sync_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - self._phase_started

    def _start_count(self) -> None:
        if self.profiler_config.enabled:
            self._counter = ModuleProfile(self.engine.module, sync_cuda=self._sync_cuda)
        else:
            self._counter = StepFlops()
        self._profile_started = time.perf_counter()
        self._counter.__enter__()
        self._counting = True

    def _resume_count(self) -> None:
        if not self._counting:
            self._counter.__enter__()
            self._counting = True

    def _pause_count(self) -> None:
        if self._counting:
            self._counting = False
            self._counter.__exit__(None, None, None)

    def _show_profile(self, profile: ModuleProfile, step_s: float) -> None:
        if self.rank != 0:
            return
        block = self.profiler_config
        times = self._profile_times
        engine = self.engine
        times.world_size = engine.comm.world_size
        times.samples = (
            engine.train_micro_batch_size_per_gpu() * engine.gradient_accumulation_steps()
        )
        options = dict(
            step=self.profile_step,
            times=times,
            module_depth=block.module_depth,
            top_modules=block.top_modules,
            detailed=block.detailed,
            mfu=self._profile_mfu(profile.flops, step_s),
        )
        rows = profile.rows()
        if block.output_file:
            with open(block.output_file, "w") as handle:
                handle.write(format_table(rows, **options) + "\n")
            return
        from runtime.observe.metrics import _log_line

        for line in format_table(rows, **options).splitlines():
            _log_line(line)

    def _profile_mfu(self, flops: int, step_s: float) -> str | None:
        """The profiled step's MFU in words: its FLOP rate over the device's peak."""
        if self._peak is None:
            self._peak = resolve_peak(self.engine.device, self.engine.precision.param_dtype)
        if not self._peak.tflops or step_s <= 0:
            return f"- (no peak: {self._peak.source})"
        tflops = flops / step_s / 1e12
        return f"{100 * tflops / self._peak.tflops:.3g}% ({tflops:.3g} of {self._peak.tflops:g} TFLOP/s, {self._peak.source})"

    # ---- reports -------------------------------------------------------------------------------

    def is_report_step(self, step: int) -> bool:
        return step == 1 or (self.every > 0 and step % self.every == 0)

    def report_fields(
        self, step: int, step_time: float, report: bool | None = None
    ) -> dict[str, Any]:
        """Fields for the metrics event of `step` (call on every rank: on report steps the
        breakdown is a collective); `step_time` is the window's seconds per optimizer step,
        `report` whether StepMetrics reports this step (default: the first and every
        steps_per_print-th)."""
        fields: dict[str, Any] = {}
        if report is None:
            report = self.is_report_step(step)
        if self.clock is not None and report:
            fields.update(self._breakdown())
        if self.rank != 0:
            return fields
        fields.update(self._rates(step_time))
        return fields

    def _rates(self, step_time: float) -> dict[str, Any]:
        flops = self.flops_per_step
        out: dict[str, Any] = {
            "flops_per_step": flops,
            "tflops": None,
            "mfu": None,
            "peak_tflops": None,
            "peak_source": None,
        }
        if flops is None or step_time <= 0:
            return out
        if self._peak is None:
            self._peak = resolve_peak(self.engine.device, self.engine.precision.param_dtype)
        tflops = flops / step_time / 1e12
        out["tflops"] = tflops
        out["peak_tflops"] = self._peak.tflops
        out["peak_source"] = self._peak.source
        if self._peak.tflops:
            out["mfu"] = tflops / self._peak.tflops
        return out

    def _breakdown(self) -> dict[str, Any]:
        comm = self.engine.comm
        mine = torch.tensor(self.clock.take(), dtype=torch.float64, device=self.engine.device)
        world = comm.world_size
        if self._hosts is None:
            self._hosts = self._gather_hosts()
        everyone = torch.empty(world * len(PHASES), dtype=torch.float64, device=mine.device)
        comm.all_gather(everyone, mine)
        table = everyone.view(world, len(PHASES)).tolist()
        if self.rank != 0:
            return {}
        # Busy time: forward + backward + step less the waits. A straggler's peers wait for
        # it inside their collectives, so their totals grow too; their waits tell them apart.
        busy = [row[0] + row[1] + row[3] - row[2] - row[4] for row in table]
        slowest = max(range(world), key=lambda r: busy[r])
        fields: dict[str, Any] = {}
        for name, value in zip(BREAKDOWN_FIELDS, table[comm.rank], strict=True):
            fields[name] = value
        for name, value in zip(BREAKDOWN_FIELDS, table[slowest], strict=True):
            fields[f"slowest_{name}"] = value
        fields["slowest_rank"] = slowest
        fields["straggler"] = f"{self._hosts[slowest]} (rank {slowest})"
        return fields

    def _gather_hosts(self) -> list[str]:
        comm = self.engine.comm
        name = socket.gethostname().encode()[:_HOST_BYTES].ljust(_HOST_BYTES, b"\0")
        mine = torch.tensor(list(name), dtype=torch.uint8, device=self.engine.device)
        everyone = torch.empty(comm.world_size * _HOST_BYTES, dtype=torch.uint8, device=mine.device)
        comm.all_gather(everyone, mine)
        rows = everyone.view(comm.world_size, _HOST_BYTES).tolist()
        return [bytes(r).rstrip(b"\0").decode(errors="replace") for r in rows]

    # ---- comms summary -------------------------------------------------------------------------

    def comms_summary(self, show: bool = True) -> list[dict]:
        """This rank's collectives so far, one row per (kind, message size); printed on rank 0
        when `show`. Empty without the comms_logger block."""
        if self.comms is None:
            return []
        rows = self.comms.summary()
        if show and self.rank == 0 and rows:
            from runtime.observe.metrics import _log_line

            for line in format_summary(rows, self.rank).splitlines():
                _log_line(line)
        return rows
