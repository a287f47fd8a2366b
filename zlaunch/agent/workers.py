"""The worker processes of one node: how the agent starts, signals and reaps them (stdlib only).

Each worker runs in its own session (so its whole process group can be signalled, and a
terminal's Ctrl-C reaches only the controller), with ``PR_SET_PDEATHSIG`` so that a dead agent
takes its workers with it, and with a pipe for structured events whose fd is in
``ZLAUNCH_EVENTS_FD``. Where the kernel has pidfds, a worker's exit wakes the agent's selector;
elsewhere the agent polls.

A worker's group is signalled as a group only while the worker is not reaped (its pid, the
group's id, cannot be reused before); after that, what it left behind is found and signalled
process by process (zlaunch/agent/procs.py), so a stop never reaches a stranger whose group got
the old number, and a ``setsid`` child does not outlive the job.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from zlaunch.agent.cgroup import JobCgroup
from zlaunch.agent.procs import ProcessTable, boot_ticks, carries_tag, new_job_tag
from zlaunch.wire import frames, protocol
from zlaunch.worker import argv as worker_args
from zlaunch.worker import module_argv, without_empty_entries

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


def _signal_process(pid: int, signum: int) -> None:
    """To the process, not a thread of it: the thread that waits for the signal takes it."""
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
    behind zlaunch.worker.boot, which arms `zlaunch stacks` first; anything else as it is.
    The boot runs as ``-m`` would run it, but never from the job's working directory
    (zlaunch/worker/python_start.py): there, sys.path gets what ``python SCRIPT`` gives it."""
    if (
        len(argv) >= 3
        and argv[1] == "-u"
        and os.path.basename(argv[0]).startswith("python")
        and argv[2] not in ("-c", "-")
        and not (argv[2] == "-m" and len(argv) < 4)
    ):
        return module_argv(argv[0], "zlaunch.worker.boot", *argv[2:])
    return argv


def _safe_pythonpath(env: dict[str, str]) -> None:
    """No empty entry in the worker's PYTHONPATH: one is the working directory while the
    interpreter starts, before the boot can do anything (the plan drops the controller's and
    says so; this catches what the node's own environment adds)."""
    if "PYTHONPATH" in env:
        env["PYTHONPATH"] = without_empty_entries(env["PYTHONPATH"], os.pathsep)[0]


def _script_args(argv: Sequence[str]) -> int:
    """How many of a booted worker's arguments (``python -u SCRIPT|-m MODULE ...``) are its
    script's own."""
    return len(argv) - (4 if argv[2] == "-m" else 3)


def _child_setup(
    agent_pid: int, ignored_signals: tuple[int, ...], cgroup: JobCgroup | None
) -> None:
    """Runs in the forked worker before exec: die with the agent (Linux only).

    The save-on signal starts ignored (ignoring survives exec): one that arrives while the
    worker is still importing must not kill it; the runtime installs its handler later. So
    does a preemption signal that is not a stop signal (--preemption-signal USR2): a scheduler
    that sends it to every process of the job (Slurm's --signal does) must reach the agent as
    the host's notice, not end the ranks before they save.
    """
    if cgroup is not None:
        cgroup.join()  # before exec: nothing the worker starts is ever outside
    for ignored in ignored_signals:
        signal.signal(ignored, signal.SIG_IGN)
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
        self.reaped_at: int | None = None
        """Boot ticks when it was reaped: from then on its group id may be someone else's."""
        self.armed_pid: int | None = None
        """The process that armed `zlaunch stacks` (a wrapper's Python child, or the worker)."""
        self.stacks_thread = False
        """It dumps from a thread of its own (zlaunch/worker/stack_dumper.py), which takes the
        stacks signal sent to the process; else faulthandler in its main thread does."""

    @property
    def exited(self) -> bool:
        return self.returncode is not None

    def signal_group(self, sig: int) -> None:
        """Its whole group, while the pid is still ours (not reaped); else nothing."""
        if self.reaped_at is not None:
            return
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


def start_worker(
    entry: frames.WorkerSpec,
    cwd: str | None,
    node_env: dict[str, str],
    tag: str = "",
    cgroup: JobCgroup | None = None,
    preemption_signal: int | None = None,
) -> Worker:
    """Start one worker of the spec in its own session; StartFailed if it cannot start.
    ``tag``: the agent's job tag, which everything the worker starts inherits; ``cgroup``:
    the job's cgroup, which the worker joins before it runs; ``preemption_signal``: the
    host's preemption signal when it is no stop signal, which the worker starts ignoring."""
    env = {**os.environ, **node_env, **entry.env}
    _safe_pythonpath(env)
    events_r, events_w = os.pipe()
    env[protocol.EVENTS_FD_ENV] = str(events_w)
    if tag:
        env[protocol.JOB_TAG_ENV] = tag
    agent_pid = os.getpid()
    ignored = tuple({sig for sig in (_save_signal(env), preemption_signal) if sig is not None})
    argv = boot_argv(list(entry.argv))
    if argv != list(entry.argv):  # behind the boot: secret-looking arguments wait in env
        argv = worker_args.hide(argv, _script_args(entry.argv), env)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(events_w,),
            start_new_session=True,
            preexec_fn=lambda: _child_setup(agent_pid, ignored, cgroup),
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

    def __init__(self, sel: selectors.BaseSelector, tag: str | None = None):
        self._sel = sel
        self._by_rank: dict[int, Worker] = {}
        self.tag = tag or new_job_tag()
        """Every worker's ZLAUNCH_JOB_TAG: what carries it is this agent's to stop."""
        self._cgroup: JobCgroup | None = None
        self._cgroup_tried = False

    @property
    def cgroup(self) -> JobCgroup | None:
        """The job's cgroup on this node, made with the first worker (None where it may not
        be made: zlaunch/agent/cgroup.py)."""
        if not self._cgroup_tried:
            self._cgroup_tried = True
            self._cgroup = JobCgroup.create(self.tag)
        return self._cgroup

    def close(self) -> None:
        """Remove the job's cgroup (once its processes are gone)."""
        if self._cgroup is not None:
            self._cgroup.remove()

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
        worker.reaped_at = boot_ticks()
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
        """Something of the job still runs: a worker, or what one started (in its group or,
        by the job tag, outside it)."""
        return any(not w.exited for w in self) or bool(self.leftovers())

    def leftovers(self) -> set[int]:
        """Live processes the reaped workers left behind, and every tagged one."""
        table = ProcessTable()
        if not table.available:
            return set()
        found = set(table.tagged(self.tag))
        if self._cgroup is not None:
            found.update(self._cgroup.pids())
        for worker in self:
            if worker.reaped_at is not None:
                found.update(table.left_of_group(worker.pgid, worker.reaped_at))
        # a live worker's group is signalled as a group: nobody in it gets a signal twice
        signalled_as_group = {w.pgid for w in self if w.reaped_at is None}
        return {pid for pid in found if table.group_of(pid) not in signalled_as_group}

    def signal_groups(self, sig: int) -> None:
        """Every worker's group while it is ours, and what was left behind, one by one."""
        for worker in self:
            worker.signal_group(sig)
        for pid in self.leftovers():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill_remaining(self) -> None:
        if self._cgroup is not None:
            self._cgroup.signal(signal.SIGKILL)  # the kernel's cgroup.kill: all at once
        self.signal_groups(signal.SIGKILL)

    def note_armed(self, rank: int, pid: object, dumper: object = None) -> None:
        """Rank ``rank`` said that process ``pid`` dumps its stacks on the stacks signal (from
        its stacks thread when ``dumper`` is ``"thread"``); it is believed only for the worker
        itself or a process of its job (the tag). A later word for the same process (the
        runtime's, once it starts) does not take its thread away."""
        worker = self._by_rank.get(rank)
        if worker is None or worker.exited:
            return
        if pid is None:  # a runtime that does not say: the worker armed itself
            pid = worker.pid
        if isinstance(pid, int) and (pid == worker.pid or carries_tag(pid, self.tag)):
            thread = dumper == "thread" or (pid == worker.armed_pid and worker.stacks_thread)
            worker.armed_pid = pid
            worker.stacks_thread = thread

    def signal_processes(self, sig: int, ranks: list[int] | None) -> list[Worker]:
        """To the worker processes themselves, not their groups: all, or ``ranks`` only. The
        stacks signal goes only to the process that armed itself for it: anything else (a
        bash wrapper) would die of it; to the process (for its stacks thread, the only one
        that does not block it) or to its main thread (faulthandler). The workers whose
        stacks thread was asked are returned (their answer is awaited)."""
        asked = []
        for worker in self:
            if worker.exited or (ranks is not None and worker.rank not in ranks):
                continue
            if sig != protocol.STACKS_SIGNAL:
                _signal_main_thread(worker.pid, sig)
                continue
            pid = worker.armed_pid
            # the worker's own pid is its own while it is not reaped; another only by its tag
            if pid is None or (pid != worker.pid and not carries_tag(pid, self.tag)):
                continue
            if worker.stacks_thread:
                _signal_process(pid, sig)
                asked.append(worker)
            else:
                _signal_main_thread(pid, sig)
        return asked

    def fall_back(self, rank: int, pid: int) -> bool:
        """faulthandler's dump for a rank whose stacks thread did not answer (its main
        thread: where faulthandler's handler runs without the GIL). False if it is gone."""
        worker = self._by_rank.get(rank)
        if worker is None or worker.exited or worker.armed_pid != pid:
            return False
        if pid != worker.pid and not carries_tag(pid, self.tag):
            return False
        _signal_main_thread(pid, protocol.STACKS_FALLBACK_SIGNAL)
        return True
