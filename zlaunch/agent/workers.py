"""The worker processes of one node: how the agent starts, signals and reaps them (stdlib only).

Each worker runs in its own session (so its whole process group can be signalled, and a
terminal's Ctrl-C reaches only the controller), with ``PR_SET_PDEATHSIG`` so that a dead agent
takes its workers with it, and with a pipe for structured events whose fd is in
``ZLAUNCH_EVENTS_FD``. Where the kernel has pidfds, a worker's exit wakes the agent's selector;
elsewhere the agent polls.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

from zlaunch import frames, protocol

__all__ = ["Worker", "WorkerGroup", "StartFailed", "start_worker", "boot_argv", "EVENTS"]

EVENTS = "events"
"""The name of a worker's third pipe, beside protocol.STDOUT and protocol.STDERR."""

_PR_SET_PDEATHSIG = 1


def _load_libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


def _signal_main_thread(pid: int, signum: int) -> None:
    """Deliver ``signum`` to the main thread of process ``pid`` (tgkill; its tid is the pid).

    Python runs its handlers there anyway, and no other thread (a collective's network I/O)
    sees an interrupted system call. Without tgkill: the process, as kill(2) does.
    """
    if _LIBC is not None and hasattr(_LIBC, "tgkill"):
        _LIBC.tgkill(pid, pid, signum)  # fails only when the worker is already gone
        return
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _save_signal(env: Mapping[str, str]) -> int | None:
    """The save-on signal zlaunch forwards to workers (ZLAUNCH_SAVE_ON), if any."""
    name = env.get(protocol.SAVE_ON_ENV, "").strip().upper()
    if not name or name == "NONE":
        return None
    try:
        return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    except KeyError:
        return None


def boot_argv(argv: list[str]) -> list[str]:
    """A Python worker (``python -u SCRIPT|-m MODULE ...``, as the plan writes it) starts
    behind zlaunch.worker_boot, which arms `zlaunch stacks` first; anything else as it is."""
    if (
        len(argv) >= 3
        and argv[1] == "-u"
        and os.path.basename(argv[0]).startswith("python")
        and argv[2] not in ("-c", "-")
        and not (argv[2] == "-m" and len(argv) < 4)
    ):
        return [argv[0], "-u", "-m", "zlaunch.worker_boot", *argv[2:]]
    return argv


def _child_setup(agent_pid: int, ignored_signal: int | None) -> None:
    """Runs in the forked worker before exec: die with the agent (Linux only).

    The save-on signal starts ignored (ignoring survives exec): one that arrives while the
    worker is still importing must not kill it; the runtime installs its handler later.
    """
    if ignored_signal is not None:
        signal.signal(ignored_signal, signal.SIG_IGN)
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != agent_pid:  # the agent died before prctl took effect
            os._exit(1)


class Worker:
    """One worker process and the three pipes the agent reads from it."""

    def __init__(self, rank: int, proc: subprocess.Popen, events_fd: int):
        self.rank = rank
        self.proc = proc
        self.pid = proc.pid
        self.pgid = proc.pid  # start_new_session: the worker leads its own group
        self.pipes: dict[int, str] = {
            proc.stdout.fileno(): protocol.STDOUT,
            proc.stderr.fileno(): protocol.STDERR,
            events_fd: EVENTS,
        }
        self.pidfd: int | None = None
        self.returncode: int | None = None

    @property
    def exited(self) -> bool:
        return self.returncode is not None

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class StartFailed(Exception):
    """A worker could not be started; ``code`` is the shell's (126 not executable, 127 not
    found), so the controller reports it as it would a failed ``exec``."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def start_worker(entry: frames.WorkerSpec, cwd: str | None, node_env: dict[str, str]) -> Worker:
    """Start one worker of the spec in its own session; StartFailed if it cannot start."""
    env = {**os.environ, **node_env, **entry.env}
    events_r, events_w = os.pipe()
    env[protocol.EVENTS_FD_ENV] = str(events_w)
    agent_pid = os.getpid()
    ignored_signal = _save_signal(env)
    try:
        proc = subprocess.Popen(
            boot_argv(list(entry.argv)),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(events_w,),
            start_new_session=True,
            preexec_fn=lambda: _child_setup(agent_pid, ignored_signal),
        )
    except (OSError, ValueError) as err:
        # ValueError: a NUL byte in an argument or a variable. The controller refuses
        # those at parse time; this keeps a bad spec from ending the agent.
        os.close(events_r)
        os.close(events_w)
        where = f" in {cwd}" if cwd else ""
        raise StartFailed(
            f"rank {entry.rank}: cannot start {entry.argv[0]!r}{where}: {err}",
            126 if isinstance(err, PermissionError) else 127,
        ) from None
    os.close(events_w)
    return Worker(entry.rank, proc, events_r)


class WorkerGroup:
    """The workers of this node by rank, and their exits as selector events (pidfds)."""

    def __init__(self, sel: selectors.BaseSelector):
        self._sel = sel
        self._by_rank: dict[int, Worker] = {}

    def __iter__(self) -> Iterator[Worker]:
        return iter(self._by_rank.values())

    def __len__(self) -> int:
        return len(self._by_rank)

    def add(self, worker: Worker) -> None:
        self._by_rank[worker.rank] = worker
        try:
            worker.pidfd = os.pidfd_open(worker.pid)
        except (AttributeError, OSError):
            worker.pidfd = None
        if worker.pidfd is not None:
            self._sel.register(worker.pidfd, selectors.EVENT_READ, ("pidfd", worker))

    def reap(self, worker: Worker) -> bool:
        """True if ``worker`` has just exited (its return code is set now)."""
        if worker.exited:
            return False
        code = worker.proc.poll()
        if code is None:
            return False
        worker.returncode = code
        if worker.pidfd is not None:
            self._sel.unregister(worker.pidfd)
            os.close(worker.pidfd)
            worker.pidfd = None
        return True

    def unwatched(self) -> list[Worker]:
        """Running workers without a pidfd: their exit is only seen by polling."""
        return [w for w in self if not w.exited and w.pidfd is None]

    @property
    def needs_polling(self) -> bool:
        return bool(self._by_rank) and all(w.pidfd is None for w in self)

    def all_exited(self) -> bool:
        return all(w.exited for w in self)

    def any_group_alive(self) -> bool:
        return any(w.group_alive() for w in self)

    def signal_groups(self, sig: int) -> None:
        for worker in self:
            worker.signal_group(sig)

    def kill_remaining(self) -> None:
        for worker in self:
            if not worker.exited or worker.group_alive():
                worker.signal_group(signal.SIGKILL)

    def signal_processes(self, sig: int, ranks: list[int] | None) -> None:
        """To the worker processes themselves, not their groups: all, or ``ranks`` only."""
        for worker in self:
            if not worker.exited and (ranks is None or worker.rank in ranks):
                _signal_main_thread(worker.pid, sig)
