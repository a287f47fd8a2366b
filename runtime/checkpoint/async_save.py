"""Saves that do not stop training: snapshot now, write in a background thread.

`AsyncSaver.start` runs on every rank after the engine took a snapshot of what it saves
(copies of this rank's pieces and extra tensors, the manifest's JSON state, the RNG state):
training may change the live tensors at once. The thread then writes exactly as a
synchronous save (`storage.write_checkpoint`): each rank its shard into the partial folder,
an agreement that every rank's files are complete, rank 0's atomic commit and only then
``latest``. A crash mid-write leaves the previous checkpoint and ``latest`` as they were.

The agreement's collectives run on a process group of their own (gloo, built at the first
async save, on every rank in the same order), so they never interleave with training's. At
most one save is in flight: the next save, a load, `wait` and the interpreter's exit (the
thread is not a daemon) wait for it; a failed write is raised by the next of these.
"""

from __future__ import annotations

import threading

import torch

from .errors import CheckpointError

__all__ = ["AsyncSaver"]


def snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Host copies that training cannot change (a device tensor is copied to host memory)."""
    return {k: t.detach().to("cpu", copy=True) for k, t in tensors.items()}


class AsyncSaver:
    """One engine's background checkpoint writer."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._comm = None
        self.path: str | None = None
        """The folder of the last save started."""

    def communicator(self, engine):
        """The save's own gloo group over the engine's ranks (built once, collectively)."""
        if self._comm is None:
            if engine.model_parallel.mpu is not None:
                from ..errors import UnsupportedError

                raise UnsupportedError(
                    "save_checkpoint(async_save=True) with an mpu is not supported; save "
                    "synchronously (async_save=False)"
                )
            import torch.distributed as dist

            from runtime.distributed import Communicator

            self._comm = Communicator(dist.new_group(backend="gloo"))
        return self._comm

    def start(self, write, path: str) -> None:
        """Run ``write()`` (a `storage.write_checkpoint` call on snapshots) in the thread."""
        self.wait()

        def run() -> None:
            try:
                write()
            except BaseException as err:  # noqa: BLE001 - raised again by wait()
                self._error = err

        self.path = path
        self._thread = threading.Thread(target=run, name="zlaunch-async-save", daemon=False)
        self._thread.start()

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the save in flight is complete; raise its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if isinstance(error, CheckpointError):
            raise error
        if error is not None:
            raise CheckpointError(
                f"the background save of {self.path} failed ({type(error).__name__}: {error}); "
                "the previous checkpoint and 'latest' are unchanged"
            ) from error
