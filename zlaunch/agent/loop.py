"""The per-node agent: ``python -m zlaunch.agent`` (stdlib only: it runs on every node).

It talks to the controller over its own stdin/stdout, or over the socket of ``--connect``
(frames from :mod:`zlaunch.wire.protocol`):
it says hello, waits for the spec, starts one worker per entry, forwards every output line,
event and exit upstream, and kills its workers when told to stop, when the controller goes
away (EOF on stdin) or when the heartbeat stops. It exits once its workers are gone.

The agent is single-threaded: one selector loop over stdin, the worker pipes, pidfds and
stdout, so a slow link never stops the heartbeat check and a flood of output never starves
the exit handling. Its parts: the worker processes (workers.py), their pipes turned into
frames (output.py), the buffered link to the controller (upstream.py); this module
is the loop and the controller's commands.
"""

from __future__ import annotations

import enum
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from zlaunch.agent.netinfo import interface_for
from zlaunch.agent.output import PROGRESS_INTERVAL, READ_SIZE, OutputPump
from zlaunch.agent.stack_requests import StackRequests, fallback_marker
from zlaunch.agent.upstream import Upstream
from zlaunch.agent.workers import StartFailed, Worker, WorkerGroup, start_worker
from zlaunch.wire import BASE_HEARTBEAT_TIMEOUT, SilenceClock, events, frames, protocol
from zlaunch.worker import RecordFiles

__all__ = ["Agent", "AgentPhase", "main", "DEFAULT_HEARTBEAT_TIMEOUT", "UPSTREAM_LOST_GRACE"]

DEFAULT_HEARTBEAT_TIMEOUT = BASE_HEARTBEAT_TIMEOUT  # until the spec says the job's own
# Without anything else to send for this long, the agent says it is alive (a heartbeat of its
# own): the controller hears every agent whether or not its own heartbeats go out on time.
OWN_HEARTBEAT_INTERVAL = 1.0
# A turn of the loop normally comes back within this (IDLE_WAIT, plus work); a later one means
# the agent was not running (a loaded machine), and that time is not the controller's silence.
TURN = 1.0
# With the controller gone there is nobody to report to: workers get at most this long to exit.
UPSTREAM_LOST_GRACE = 3.0
# After every worker has exited, how long to wait for stray holders of the output pipes.
DRAIN_AFTER_EXIT = 1.0
# The longest the loop sleeps with nothing due (signals and frames wake it earlier).
IDLE_WAIT = 0.5
# Without pidfds, how often a worker's exit is polled for.
EXIT_POLL = 0.05


class AgentPhase(enum.Enum):
    AWAITING_SPEC = "awaiting spec"
    RUNNING = "running"
    STOPPING = "stopping"  # TERM sent (or nothing to run); KILL at ``kill_at``
    KILLED = "killed"  # KILL sent to every group still alive


class Agent:
    def __init__(self, stdin_fd: int = 0, stdout_fd: int = 1):
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.sel = selectors.DefaultSelector()
        self.workers = WorkerGroup(self.sel)
        self.output = OutputPump(self.sel, self._send)
        self.upstream = Upstream(stdout_fd, self.sel, self._upstream_lost, self.output.pause)
        self.stdin_open = True
        self.frames = frames.FrameReader(on_bad=self._bad_frame)
        self.heartbeat_timeout = DEFAULT_HEARTBEAT_TIMEOUT
        self.grace = 5.0
        self.controller = SilenceClock(1, time.monotonic(), TURN)
        """When the controller was last heard (any bytes), on the agent's own running time."""
        self.phase = AgentPhase.AWAITING_SPEC
        self.kill_at: float | None = None
        self.all_exited_at: float | None = None
        self.signal_r, self.signal_w = os.pipe()
        self.pending_signals: list[int] = []
        self.records = RecordFiles()  # each rank's recent collectives, sent with its stacks
        self.stack_requests = StackRequests()  # asked stacks threads that have not answered
        self.preemption_signal: int | None = None
        """The spec's: this signal is the host's preemption notice, not a stop."""
        self.preemption_check: PreemptionCheck | None = None
        self.preempted = False
        """The notice was sent upstream (once: the controller keeps its deadline)."""

    def _send(self, frame: frames.Frame) -> None:
        if isinstance(frame, frames.Event):
            for event in frame.events:
                if isinstance(event, events.StacksReady):
                    self.workers.note_armed(frame.rank, event.pid, event.dumper)
                elif isinstance(event, events.StacksDumped):
                    self.stack_requests.answered(frame.rank, event.pid)
        self.upstream.send(frame)

    @property
    def stopping(self) -> bool:
        return self.phase in (AgentPhase.STOPPING, AgentPhase.KILLED)

    # ---- the spec -------------------------------------------------------------------------

    def start_workers(self, spec: frames.Spec) -> None:
        self.phase = AgentPhase.RUNNING
        self.grace = spec.grace
        self.heartbeat_timeout = spec.heartbeat_timeout
        self.preemption_signal = spec.preemption_signal
        if self.preemption_signal is not None and self.preemption_signal not in _STOP_SIGNALS:
            signal.signal(self.preemption_signal, self._on_signal)
        if spec.preemption_check:
            self.preemption_check = PreemptionCheck(
                spec.preemption_check, spec.preemption_check_interval, spec.cwd or None
            )
        node_env = {**self._socket_ifname_env(spec.master_addr), **spec.env}
        for entry in spec.workers:
            if self.stopping:
                break
            self._spawn(entry, spec.cwd or None, node_env)
        if not len(self.workers):
            self.phase = AgentPhase.STOPPING

    def _socket_ifname_env(self, master: str | None) -> dict[str, str]:
        """Gloo and NCCL on the interface that reaches the master (not the first one up)."""
        if not master:
            return {}
        try:
            iface = interface_for(master)
        except OSError as err:
            self._send(frames.Error(f"no route to master {master}: {err}"))
            return {}
        return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface} if iface else {}

    def _spawn(self, entry: frames.WorkerSpec, cwd: str | None, node_env: dict[str, str]) -> None:
        try:
            env = {**node_env, protocol.COLLECTIVES_FILE_ENV: self.records.path(entry.rank)}
            worker = start_worker(
                entry,
                cwd,
                env,
                self.workers.tag,
                self.workers.cgroup,
                preemption_signal=(
                    self.preemption_signal if self.preemption_signal not in _STOP_SIGNALS else None
                ),
            )
        except StartFailed as err:
            self._send(frames.Error(str(err)))
            self._send(frames.Exited.of_returncode(entry.rank, None, err.code))
            return
        self.workers.add(worker)
        self.output.watch(worker)
        self._send(frames.Started(worker.rank, worker.pid))

    # ---- workers ending -------------------------------------------------------------------

    def _reap(self, worker: Worker) -> None:
        if not self.workers.reap(worker):
            return
        self.stack_requests.forget(worker.rank)
        # Everything the worker wrote before it died is in the pipes now: send it first, so
        # the controller has the last lines when it hears of the exit.
        self.output.drain(worker.rank)
        self._send(frames.Exited.of_returncode(worker.rank, worker.pid, worker.returncode))
        if self.workers.all_exited():
            self.all_exited_at = time.monotonic()

    def stop(self, grace: float, why: str = "", cause: str | None = None) -> None:
        """TERM every worker group now; KILL whatever is left after ``grace`` seconds."""
        grace = max(0.0, grace)
        deadline = time.monotonic() + grace
        if self.stopping and self.kill_at is not None and self.kill_at <= deadline:
            return
        self.phase = AgentPhase.STOPPING
        self.kill_at = deadline
        self.workers.signal_groups(signal.SIGKILL if grace == 0 else signal.SIGTERM)
        if why:
            # with a cause, the controller tells a cut-off node from a failure
            self._send(frames.Error(f"stopping workers: {why}", cause))

    def _kill_remaining(self) -> None:
        self.workers.kill_remaining()
        self.phase = AgentPhase.KILLED

    def _finished(self, now: float) -> bool:
        if self.phase is AgentPhase.AWAITING_SPEC:
            return False
        if not self.workers.all_exited():
            return False
        if self.output.open and (
            self.all_exited_at is None or now - self.all_exited_at <= DRAIN_AFTER_EXIT
        ):
            return False  # the pipes still flow: look for what was left behind once they end
        if self.workers.any_group_alive():  # reads /proc: once the output is done, not per turn
            # Leaders are gone but something they started lives on: end it too.
            if not self.stopping:
                self.stop(self.grace, "")
            return False
        return True

    # ---- the controller -------------------------------------------------------------------

    def _read_stdin(self) -> None:
        try:
            chunk = os.read(self.stdin_fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close_stdin()
            self.stop(min(self.grace, UPSTREAM_LOST_GRACE), "controller closed the connection")
            return
        self.controller.heard(0, time.monotonic())
        for frame in self.frames.feed(chunk):
            self._handle(frame)

    def _close_stdin(self) -> None:
        if self.stdin_open:
            self.stdin_open = False
            self.sel.unregister(self.stdin_fd)

    def _upstream_lost(self, why: str) -> None:
        self._close_stdin()
        self.stop(min(self.grace, UPSTREAM_LOST_GRACE), why)

    def _bad_frame(self, err: frames.ProtocolError) -> None:
        """A frame from the controller that could not be read. Before the spec it can only
        have been the spec: without it there is nothing to run, so give up at once."""
        self._send(frames.Error(f"unreadable frame from the controller: {err}"))
        if self.phase is AgentPhase.AWAITING_SPEC:
            self.stop(0.0, "the spec could not be read")

    def _handle(self, frame: frames.Frame) -> None:
        if isinstance(frame, frames.Spec) and self.phase is AgentPhase.AWAITING_SPEC:
            self.start_workers(frame)
        elif isinstance(frame, frames.Stop):
            self.stop(frame.grace, "")
        elif isinstance(frame, frames.Signal):  # --save-on, stacks: to the worker, not its group
            asked = self.workers.signal_processes(frame.sig, frame.ranks)
            if frame.sig == protocol.STACKS_SIGNAL:
                now = time.monotonic()
                for worker in asked:
                    self.stack_requests.asked(worker.rank, worker.armed_pid, now)
                self._send_records(frame.ranks or [w.rank for w in self.workers])
        elif isinstance(frame, frames.Heartbeat):
            # Echoed, so the controller hears from this agent at least every heartbeat
            # interval and can tell a silent node (link down, partition) from a quiet one.
            self._send(frames.Heartbeat())

    def _send_records(self, ranks: list[int]) -> None:
        """The ranks' collective records, read from their files: a rank that cannot answer
        (stopped, stuck in C) still shows what it last did."""
        for rank in ranks:
            event = self.records.event(rank)
            if event is not None:
                self._send(frames.Event(rank, [event]))

    def _heartbeat_missed(self, now: float) -> bool:
        if not self.stdin_open or self.controller.silent_for(0, now) <= self.heartbeat_timeout:
            return False
        # What waits unread on stdin was sent before now: read it before judging (an agent
        # that was busy or not scheduled must not blame the controller for its own absence).
        if self.stdin_fd in {key.fd for key, _ in self.sel.select(0)}:
            self._read_stdin()
        silence = self.controller.silent_for(0, now)
        if not self.stdin_open or silence <= self.heartbeat_timeout:
            return False
        # The link may still carry our output (a hung controller, not a dead pipe): report,
        # but stop as if the controller were gone.
        self._close_stdin()
        self.stop(
            min(self.grace, UPSTREAM_LOST_GRACE),
            f"no heartbeat for {silence:.1f}s",
            cause=protocol.CAUSE_NO_HEARTBEAT,
        )
        return True

    # ---- main loop ------------------------------------------------------------------------

    def run(self) -> int:
        self._install()
        self._send(hello())
        try:
            while not self._finished(time.monotonic()):
                self._turn(time.monotonic())
        finally:
            self.records.remove()
            if self.preemption_check is not None:
                self.preemption_check.close()
        self.workers.close()
        self._send(frames.Bye())
        self.upstream.flush_blocking()
        return 0

    def _install(self) -> None:
        os.set_blocking(self.signal_r, False)
        os.set_blocking(self.signal_w, False)
        signal.set_wakeup_fd(self.signal_w)
        for signum in _STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        os.set_blocking(self.stdout_fd, False)
        self.sel.register(self.stdin_fd, selectors.EVENT_READ, "stdin")
        self.sel.register(self.signal_r, selectors.EVENT_READ, "signal")

    def _turn(self, now: float) -> None:
        """One round of the loop: what is due now, then wait for the next thing to happen."""
        self.controller.awake(now)
        if self._heartbeat_missed(now):
            return
        if now - self.upstream.sent_at >= OWN_HEARTBEAT_INTERVAL and self.upstream.ok:
            self._send(frames.Heartbeat())
        if self.phase is AgentPhase.STOPPING and self.kill_at is not None and now >= self.kill_at:
            self._kill_remaining()
        self._stacks_fallbacks(now)
        self._check_preemption(now)
        progress_waits = self.output.forward_due_progress(now)
        for key, _ in self.sel.select(self._wait_time(now, progress_waits)):
            self._dispatch(key)
        for worker in self.workers.unwatched():
            self._reap(worker)

    def _stacks_fallbacks(self, now: float) -> None:
        """faulthandler for the ranks whose stacks thread has not answered in time (their GIL
        is held in C code), after a line on their stderr that says who dumps and why."""
        for rank, pid in self.stack_requests.due(now):
            self._send(frames.Out(rank, protocol.STDERR, [fallback_marker(pid)], False))
            self.workers.fall_back(rank, pid)

    def _wait_time(self, now: float, progress_waits: bool) -> float:
        timeout = IDLE_WAIT
        fallback = self.stack_requests.next_due(now)
        if fallback is not None:
            timeout = min(timeout, fallback)
        if self.stdin_open:
            timeout = min(timeout, self.heartbeat_timeout - self.controller.silent_for(0, now))
        if self.phase is AgentPhase.STOPPING and self.kill_at is not None:
            timeout = min(timeout, self.kill_at - now)
        if self.workers.needs_polling:
            timeout = min(timeout, EXIT_POLL)
        if self.preemption_check is not None and not self.preempted:
            timeout = min(timeout, self.preemption_check.next_due(now))
        if progress_waits:  # a progress line held back by PROGRESS_INTERVAL
            timeout = min(timeout, PROGRESS_INTERVAL)
        return max(0.0, timeout)

    def _dispatch(self, key: selectors.SelectorKey) -> None:
        tag = key.data
        if tag == "stdin":
            self._read_stdin()
        elif tag == "stdout":
            self.upstream.flush()
        elif tag == "signal":
            self._drain_signals()
        elif tag == "pipe":
            self.output.read(key.fd)
        elif tag[0] == "pidfd":
            self._reap(tag[1])

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.pending_signals.append(signum)

    def _drain_signals(self) -> None:
        try:
            os.read(self.signal_r, 1024)
        except BlockingIOError:
            pass
        signals, self.pending_signals = self.pending_signals, []
        for signum in signals:
            name = signal.Signals(signum).name
            if signum == self.preemption_signal and self.phase is AgentPhase.RUNNING:
                self._preemption_notice(f"the agent received {name}")
            elif signum in _STOP_SIGNALS:
                self.stop(self.grace, f"agent received {name}")

    # ---- preemption notices ---------------------------------------------------------------

    def _preemption_notice(self, why: str) -> None:
        """Say once that this host is about to go; the workers keep running: the controller
        asks every rank to save, then stops them (or they exit after the save)."""
        if self.preempted:
            return
        self.preempted = True
        if self.preemption_check is not None:
            self.preemption_check.close()
        self._send(frames.Error(why, protocol.CAUSE_PREEMPTED))

    def _check_preemption(self, now: float) -> None:
        if self.preemption_check is None or self.preempted:
            return
        if self.phase is not AgentPhase.RUNNING:
            self.preemption_check.close()
            return
        if self.preemption_check.says_preempted(now):
            self._preemption_notice(
                f"--preemption-check {self.preemption_check.command!r} exited 0"
            )


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class PreemptionCheck:
    """The user's command, run every ``interval`` seconds without blocking the loop: its exit
    status 0 is the host's preemption notice. A run that outlasts the interval is killed and
    counts as "not preempted" (a metadata endpoint that does not answer says nothing)."""

    def __init__(self, command: str, interval: float, cwd: str | None):
        self.command = command
        self.interval = max(0.1, interval)
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.due_at = 0.0

    def next_due(self, now: float) -> float:
        if self.proc is not None:
            return EXIT_POLL * 2
        return max(0.0, self.due_at - now)

    def says_preempted(self, now: float) -> bool:
        if self.proc is None:
            if now < self.due_at:
                return False
            try:
                self.proc = subprocess.Popen(
                    self.command,
                    shell=True,
                    cwd=self.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError:
                self.due_at = now + self.interval
                return False
            self.started_at = now
            return False
        code = self.proc.poll()
        if code is None:
            if now - self.started_at > self.interval:
                self.close()
                self.due_at = now + self.interval
            return False
        self.proc = None
        self.due_at = now + self.interval
        return code == 0

    def close(self) -> None:
        """Kill a run in flight (its whole session) and reap it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        self.proc = None


def hello() -> frames.Hello:
    """Where this agent runs: over SSH, the addresses of both ends of the connection; an agent
    that connected back, both ends of its connection (this node as the controller reaches it)."""
    from zlaunch.agent.connect import connected_ends

    addr = client_addr = None
    conn = os.environ.get("SSH_CONNECTION", "").split()
    ends = connected_ends()
    if ends is not None:  # first: an agent started by hand may run in someone's ssh session
        addr, client_addr = ends
    elif len(conn) == 4:
        client_addr, addr = _plain_ip(conn[0]), _plain_ip(conn[2])
    return frames.Hello(
        hostname=socket.gethostname(),
        pid=os.getpid(),
        python=sys.executable,
        addr=addr,
        client_addr=client_addr,
        port=_free_port(addr),
        cpus=_usable_cpus(),
    )


def _usable_cpus() -> int | None:
    """The cores this process may run on (a cgroup or taskset limit counts), as workers get."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this platform
        return os.cpu_count()


def _plain_ip(addr: str) -> str:
    return addr[7:] if addr.startswith("::ffff:") and "." in addr else addr


def _free_port(addr: str | None) -> int:
    """A TCP port nobody listens on right now, on every address (as the TCP store binds)."""
    family = socket.AF_INET6 if addr and ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    from zlaunch.agent.connect import agent_fds  # --connect HOST:PORT: frames over TCP

    sys.exit(Agent(*agent_fds(sys.argv[1:] if argv is None else argv)).run())


if __name__ == "__main__":
    main()
