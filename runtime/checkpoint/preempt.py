"""What zlaunch's checkpoint options do inside a worker: resume at start, save on a signal.

zlaunch exports (see ``zlaunch --checkpoint-dir/--resume/--save-on``):

* ``ZLAUNCH_CHECKPOINT_DIR``: where `Engine.save_checkpoint()` / `load_checkpoint()` go by
  default;
* ``ZLAUNCH_RESUME=1``: `runtime.initialize` loads the latest checkpoint there (none yet: a
  warning, and training starts fresh);
* ``ZLAUNCH_SAVE_ON=SIGUSR1``: the signal sets a flag; at the next optimizer-step boundary the
  ranks sum the flag (so all of them decide at the same step, whichever got the signal
  first), save, and exit with status 0. The flag rides in the step's gradient all-reduce
  (`runtime.optim.precision.StepRiders`): zlaunch sets the variable for every job, so a collective
  and a host read of its own would cost every step of every job.
"""

from __future__ import annotations

import logging
import os
import signal

import torch

from .errors import CheckpointError

__all__ = [
    "RESUME_ENV",
    "SAVE_ON_ENV",
    "SaveOnSignal",
    "resume_from_env",
    "save_on_signal_from_env",
    "SAVED_MARKER",
]

log = logging.getLogger("runtime.checkpoint")

from zlaunch.wire import RESUME_ENV, SAVE_ON_ENV, events  # noqa: E402 - the shared names

SAVED_MARKER = "zlaunch: saved checkpoint"


class SaveOnSignal:
    """A step hook (`runtime.engine.step_hooks.RidingStepHook`): sets a flag on ``signum``;
    `after_step` saves on every rank once any rank saw it."""

    SEAT = "save_request"

    def __init__(self, signum: int, device: torch.device | str = "cpu"):
        self.signum = signum
        self.device = torch.device(device)
        self.requested = False
        signal.signal(signum, self._on_signal)
        # From now on this rank can be asked to save: zlaunch may then answer a host's
        # preemption notice with a save instead of a stop.
        events.emit_to(os.environ, events.SaveReady())

    def board(self, riders) -> None:
        """Before the optimizer step: this rank's flag, summed with the gradient norm."""
        # A fill, not torch.tensor(...): a host-to-device copy would wait for the device.
        riders.board(
            torch.full((1,), float(self.requested), dtype=torch.float64, device=self.device),
            self.SEAT,
        )

    def _on_signal(self, _signum, _frame) -> None:
        if not self.requested:
            _acknowledge()
        self.requested = True

    def after_step(self, engine, outcome) -> None:  # noqa: ARG002 - a step hook
        """Called by `Engine.step` after every micro step; acts only at step boundaries."""
        if engine.micro_steps % engine.gradient_accumulation_steps() != 0:
            return
        riders = getattr(engine, "step_riders", None)
        sums = riders.take_sums(self.SEAT) if riders is not None else None
        if sums is None:  # it did not ride (a model-parallel norm): agree on it here
            flag = torch.tensor([1.0 if self.requested else 0.0], device=engine.device)
            engine.comm.all_reduce(flag)
            sums = flag.tolist()
        if sums[0] == 0.0:
            return
        step = engine.global_steps
        events.emit_to(os.environ, events.Checkpoint("saving", step, requested=True))
        try:
            path = engine.save_checkpoint()
        except BaseException:
            events.emit_to(os.environ, events.Checkpoint("failed", step, requested=True))
            raise
        events.emit_to(os.environ, events.Checkpoint("saved", step, requested=True))
        if engine.global_rank == 0:
            name = signal.Signals(self.signum).name
            print(
                f"{SAVED_MARKER} {path} at step {engine.global_steps} on {name}; exiting",
                flush=True,
            )
        from runtime.distributed import shutdown_distributed

        shutdown_distributed()
        raise SystemExit(0)


def _acknowledge() -> None:
    """Tell zlaunch this rank will save, so it does not say that nobody handles the signal."""
    events.emit_to(os.environ, events.SaveAck())  # nothing outside zlaunch, or no agent now


def _signal_number(name: str) -> int:
    try:
        return int(
            signal.Signals[name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()]
        )
    except KeyError:
        raise CheckpointError(
            f"{SAVE_ON_ENV}={name!r} is not a signal name (e.g. SIGUSR1)"
        ) from None


def resume_from_env(engine) -> tuple[str | None, dict | None]:
    """Under ``ZLAUNCH_RESUME=1``, load the latest checkpoint: ``(path, client_state)``;
    ``(None, None)`` when not asked or when there is none yet."""
    if os.environ.get(RESUME_ENV) != "1":
        return None, None
    path, client = engine.load_checkpoint()
    if path is not None and engine.global_rank == 0:
        print(f"zlaunch: resumed from {path} at step {engine.global_steps}", flush=True)
    return path, client


def save_on_signal_from_env(device: torch.device | str = "cpu") -> SaveOnSignal | None:
    """The hook ``ZLAUNCH_SAVE_ON`` asks for (its signal handler installed), or None;
    ``device``: the engine's (where the flag boards the step's all-reduce)."""
    name = os.environ.get(SAVE_ON_ENV, "").strip()
    if name and name.lower() != "none":
        return SaveOnSignal(_signal_number(name), device)
    return None
