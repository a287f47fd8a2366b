"""The one error a checkpoint operation raises for anything wrong with the files or inputs."""

from __future__ import annotations

from ..errors import UsageError

__all__ = ["CheckpointError"]


class CheckpointError(UsageError):
    """A checkpoint cannot be written or read; the message names the file and the fix.

    Raised before anything is modified: a load that fails leaves the engine as it was.
    """
