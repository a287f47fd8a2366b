"""One exception tree for everything the controller can report to a user.

Every error carries the exit code the process ends with; `cli.main` renders it once, as a
message without a traceback. Raise the most specific class; put the fix in `hint`.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ZlaunchError",
    "UsageError",
    "ConfigError",
    "HostfileError",
    "LaunchError",
    "HostUnreachable",
    "WorkerFailed",
    "Interrupted",
]

EXIT_USAGE = 2
EXIT_RUNTIME = 1


class ZlaunchError(Exception):
    """Base of all user-facing errors. `message` says what is wrong, `hint` how to fix it."""

    exit_code = EXIT_RUNTIME

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def render(self) -> str:
        text = f"error: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class UsageError(ZlaunchError):
    """Bad command line: options that conflict, a missing file, a selector that selects nothing."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """The training config (JSON/YAML) is invalid; the message names the file and key."""


class HostfileError(UsageError):
    """The hostfile is invalid; the message names the file and line."""


class LaunchError(ZlaunchError):
    """The job could not be started or kept running for reasons outside the workers."""


class HostUnreachable(LaunchError):
    """SSH to a host failed (refused, timed out, auth); the message names the host.

    ``hosts``: the names of every host found out of reach (a restart may go on without them,
    or wait for them); empty when the failure is not one host's (a broken known_hosts file)."""

    def __init__(
        self,
        message: str,
        *,
        hosts: Sequence[str] = (),
        hint: str | None = None,
        exit_code: int | None = None,
    ):
        super().__init__(message, hint=hint, exit_code=exit_code)
        self.hosts: tuple[str, ...] = tuple(hosts)

    @classmethod
    def of(cls, host: str, message: str, *, hint: str | None = None) -> HostUnreachable:
        """The one host ``host`` is out of reach."""
        return cls(message, hosts=(host,), hint=hint)


class WorkerFailed(ZlaunchError):
    """A worker exited non-zero; exit_code is its code, or 128+N for a death by signal N."""


class Interrupted(ZlaunchError):
    """The controller was stopped by SIGINT (exit 130) or SIGTERM (exit 143)."""
