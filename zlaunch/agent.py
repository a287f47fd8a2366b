"""The per-node agent: ``python -m zlaunch.agent`` (stdlib only: it runs on every node).

It talks to the controller over its own stdin/stdout (frames from :mod:`zlaunch.protocol`):
it says hello, waits for the spec, starts one worker per entry, forwards every output line,
event and exit upstream, and kills its workers when told to stop, when the controller goes
away (EOF on stdin) or when the heartbeat stops. It exits once its workers are gone.

Each worker runs in its own session (so its whole process group can be signalled, and a
terminal's Ctrl-C reaches only the controller), with ``PR_SET_PDEATHSIG`` so that a dead agent
takes its workers with it, and with a pipe for structured events whose fd is in
``ZLAUNCH_EVENTS_FD``. The agent is single-threaded: one selector loop over stdin, the worker
pipes, pidfds and stdout (non-blocking, buffered), so a slow link never stops the heartbeat
check and a flood of output never starves the exit handling.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from zlaunch import protocol
from zlaunch.netinfo import interface_for

__all__ = ["Agent", "main", "DEFAULT_HEARTBEAT_TIMEOUT", "UPSTREAM_LOST_GRACE"]

DEFAULT_HEARTBEAT_TIMEOUT = 5.0
# With the controller gone there is nobody to report to: workers get at most this long to exit.
UPSTREAM_LOST_GRACE = 3.0
# Stop reading worker pipes while this much output waits for a slow link (backpressure).
MAX_PENDING_OUTPUT = 32 * 1024 * 1024
READ_SIZE = 256 * 1024
# After every worker has exited, how long to wait for stray holders of the output pipes.
DRAIN_AFTER_EXIT = 1.0
# A line redrawn with carriage returns (tqdm) is forwarded at most this often while it has no
# newline: the controller shows its latest state live; every byte still reaches the rank log.
PROGRESS_INTERVAL = 0.2
# One structured event longer than this is dropped (reported as an "invalid" event): events
# are small JSON objects, and a frame must stay below protocol.MAX_FRAME_BYTES.
MAX_EVENT_BYTES = 1024 * 1024

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


def _save_signal(env: dict[str, str]) -> int | None:
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
        self.streams: dict[int, str] = {
            proc.stdout.fileno(): protocol.STDOUT,
            proc.stderr.fileno(): protocol.STDERR,
            events_fd: "events",
        }
        self.splitters = {
            fd: protocol.LineSplitter(
                MAX_EVENT_BYTES if stream == "events" else protocol.MAX_PIECE_BYTES
            )
            for fd, stream in self.streams.items()
        }
        self.dropping_event = 0
        self.progress_sent: dict[int, float] = {}
        """Per output pipe: when its carriage-return tail was last forwarded."""
        """Bytes of an over-long event dropped so far (its end has not arrived yet)."""
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


class Agent:
    def __init__(self, stdin_fd: int = 0, stdout_fd: int = 1):
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.sel = selectors.DefaultSelector()
        self.workers: dict[int, Worker] = {}
        self.fd_owner: dict[int, Worker] = {}
        self.pidfd_owner: dict[int, Worker] = {}
        self.outbuf = bytearray()
        self.upstream_ok = True
        self.stdin_open = True
        self.frames = protocol.FrameReader(on_bad=self._bad_frame)
        self.heartbeat_timeout = DEFAULT_HEARTBEAT_TIMEOUT
        self.grace = 5.0
        self.last_heard = time.monotonic()
        self.spec_received = False
        self.stopping = False
        self.kill_at: float | None = None
        self.killed = False
        self.all_exited_at: float | None = None
        self.paused = False
        self.signal_r, self.signal_w = os.pipe()
        self.pending_signals: list[int] = []

    # ---- upstream -------------------------------------------------------------------------

    def send(self, frame: protocol.Frame) -> None:
        if not self.upstream_ok:
            return
        self.outbuf += protocol.encode(frame)
        self._flush()

    def _flush(self) -> None:
        while self.outbuf and self.upstream_ok:
            try:
                n = os.write(self.stdout_fd, self.outbuf[: READ_SIZE * 4])
            except BlockingIOError:
                break
            except OSError as err:  # EPIPE: the controller is gone
                if err.errno in (errno.EPIPE, errno.EBADF, errno.ECONNRESET):
                    self._upstream_lost("controller connection closed")
                    return
                raise
            del self.outbuf[:n]
        self._update_stdout_interest()

    def _update_stdout_interest(self) -> None:
        want = bool(self.outbuf) and self.upstream_ok
        key = self.sel.get_map().get(self.stdout_fd)
        if want and key is None:
            self.sel.register(self.stdout_fd, selectors.EVENT_WRITE, "stdout")
        elif not want and key is not None:
            self.sel.unregister(self.stdout_fd)
        pause = len(self.outbuf) > MAX_PENDING_OUTPUT
        if pause != self.paused:
            self.paused = pause
            for fd, worker in self.fd_owner.items():
                if pause:
                    self.sel.unregister(fd)
                else:
                    self.sel.register(fd, selectors.EVENT_READ, ("pipe", worker))

    def _upstream_lost(self, why: str) -> None:
        self.upstream_ok = False
        self.outbuf.clear()
        if self.stdin_open:
            self.stdin_open = False
            self.sel.unregister(self.stdin_fd)
        self.stop(min(self.grace, UPSTREAM_LOST_GRACE), why)

    # ---- hello and spec -----------------------------------------------------------------------

    def hello(self) -> protocol.Hello:
        addr = client_addr = None
        conn = os.environ.get("SSH_CONNECTION", "").split()
        if len(conn) == 4:
            client_addr, addr = _plain_ip(conn[0]), _plain_ip(conn[2])
        return protocol.Hello(
            hostname=socket.gethostname(),
            pid=os.getpid(),
            python=sys.executable,
            addr=addr,
            client_addr=client_addr,
            port=_free_port(addr),
        )

    def start_workers(self, spec: protocol.Spec) -> None:
        self.spec_received = True
        self.grace = spec.grace
        self.heartbeat_timeout = spec.heartbeat_timeout
        cwd = spec.cwd or None
        ifname_env: dict[str, str] = {}
        master = spec.master_addr
        if master:
            try:
                iface = interface_for(master)
            except OSError as err:
                iface = None
                self.send(protocol.Error(f"no route to master {master}: {err}"))
            if iface:
                ifname_env = {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface}
        for entry in spec.workers:
            if self.stopping:
                break
            self._spawn(entry, cwd, {**ifname_env, **spec.env})
        if not self.workers:
            self.stopping = True

    def _spawn(self, entry: protocol.WorkerSpec, cwd: str | None, node_env: dict[str, str]) -> None:
        rank = entry.rank
        env = dict(os.environ)
        env.update(node_env)
        env.update(entry.env)
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
            code = 126 if isinstance(err, PermissionError) else 127
            where = f" in {cwd}" if cwd else ""
            self.send(protocol.Error(f"rank {rank}: cannot start {entry.argv[0]!r}{where}: {err}"))
            self.send(protocol.Exited.of_returncode(rank, None, code))
            return
        os.close(events_w)
        worker = Worker(rank, proc, events_r)
        self.workers[rank] = worker
        for fd in worker.streams:
            os.set_blocking(fd, False)
            self.fd_owner[fd] = worker
            if not self.paused:
                self.sel.register(fd, selectors.EVENT_READ, ("pipe", worker))
        try:
            worker.pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            worker.pidfd = None
        if worker.pidfd is not None:
            self.pidfd_owner[worker.pidfd] = worker
            self.sel.register(worker.pidfd, selectors.EVENT_READ, ("pidfd", worker))
        self.send(protocol.Started(rank, proc.pid))

    # ---- workers --------------------------------------------------------------------------

    def _read_pipe(self, fd: int, worker: Worker, drain: bool = False) -> None:
        """Read what is there; with ``drain``, keep reading until the pipe is empty."""
        while True:
            try:
                chunk = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            splitter = worker.splitters[fd]
            if chunk:
                lines = splitter.feed(chunk)
            else:
                lines = splitter.finish()
            if lines:
                self._forward(worker, worker.streams[fd], lines, splitter.partial)
            if chunk and splitter.has_return():
                self._forward_progress(fd, worker, time.monotonic())
            if not chunk:
                self._close_pipe(fd)
                return
            if not drain:
                return

    def _forward_progress(self, fd: int, worker: Worker, now: float) -> bool:
        """Forward a pipe's carriage-return tail (as a piece) if it is due; True if one waits."""
        stream = worker.streams.get(fd)
        if stream is None or stream == "events":
            return False
        splitter = worker.splitters[fd]
        if not splitter.has_return():
            return False
        if now - worker.progress_sent.get(fd, 0.0) < PROGRESS_INTERVAL:
            return True
        worker.progress_sent[fd] = now
        self._forward(worker, stream, [splitter.take_tail()], True)
        return False

    def _forward(self, worker: Worker, stream: str, lines: list[bytes], partial: bool) -> None:
        """Send one read's lines; ``partial``: the last one has no newline (yet)."""
        if stream == "events":
            events = []
            for index, raw in enumerate(lines):
                unfinished = partial and index == len(lines) - 1
                if unfinished or worker.dropping_event:
                    worker.dropping_event += len(raw)
                    if not unfinished:
                        events.append(
                            {
                                "kind": "invalid",
                                "text": f"event of {worker.dropping_event} bytes dropped "
                                f"(limit {MAX_EVENT_BYTES})",
                            }
                        )
                        worker.dropping_event = 0
                    continue
                if not raw.strip():
                    continue
                try:
                    events.append(json.loads(raw))
                except ValueError:
                    events.append({"kind": "invalid", "text": protocol.line_text(raw)})
            if events:
                self.send(protocol.Event(worker.rank, events))
            return
        self.send(
            protocol.Out(worker.rank, stream, [protocol.line_text(raw) for raw in lines], partial)
        )

    def _close_pipe(self, fd: int) -> None:
        worker = self.fd_owner.pop(fd, None)
        if worker is None:
            return
        if fd in self.sel.get_map():
            self.sel.unregister(fd)
        worker.streams.pop(fd, None)
        os.close(fd)

    def _reap(self, worker: Worker) -> None:
        if worker.exited:
            return
        code = worker.proc.poll()
        if code is None:
            return
        worker.returncode = code
        if worker.pidfd is not None:
            self.sel.unregister(worker.pidfd)
            self.pidfd_owner.pop(worker.pidfd, None)
            os.close(worker.pidfd)
            worker.pidfd = None
        # Everything the worker wrote before it died is in the pipes now: send it first, so
        # the controller has the last lines when it hears of the exit.
        for fd in list(worker.streams):
            self._read_pipe(fd, worker, drain=True)
        self.send(protocol.Exited.of_returncode(worker.rank, worker.pid, code))
        if all(w.exited for w in self.workers.values()):
            self.all_exited_at = time.monotonic()

    def stop(self, grace: float, why: str = "", cause: str | None = None) -> None:
        """TERM every worker group now; KILL whatever is left after ``grace`` seconds."""
        grace = max(0.0, grace)
        deadline = time.monotonic() + grace
        if self.stopping and self.kill_at is not None and self.kill_at <= deadline:
            return
        self.stopping = True
        self.kill_at = deadline
        sig = signal.SIGKILL if grace == 0 else signal.SIGTERM
        for worker in self.workers.values():
            worker.signal_group(sig)
        if why and self.upstream_ok:
            # with a cause, the controller tells a cut-off node from a failure
            self.send(protocol.Error(f"stopping workers: {why}", cause))

    def _kill_remaining(self) -> None:
        for worker in self.workers.values():
            if not worker.exited or worker.group_alive():
                worker.signal_group(signal.SIGKILL)
        self.killed = True

    # ---- controller input -----------------------------------------------------------------

    def _read_stdin(self) -> None:
        try:
            chunk = os.read(self.stdin_fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.stdin_open = False
            self.sel.unregister(self.stdin_fd)
            self.stop(min(self.grace, UPSTREAM_LOST_GRACE), "controller closed the connection")
            return
        self.last_heard = time.monotonic()
        for frame in self.frames.feed(chunk):
            self._handle(frame)

    def _bad_frame(self, err: protocol.ProtocolError) -> None:
        """A frame from the controller that could not be read. Before the spec it can only
        have been the spec: without it there is nothing to run, so give up at once."""
        self.send(protocol.Error(f"unreadable frame from the controller: {err}"))
        if not self.spec_received and not self.stopping:
            self.stop(0.0, "the spec could not be read")

    def _handle(self, frame: protocol.Frame) -> None:
        if isinstance(frame, protocol.Spec) and not self.spec_received and not self.stopping:
            self.start_workers(frame)
        elif isinstance(frame, protocol.Stop):
            self.stop(frame.grace, "")
        elif isinstance(frame, protocol.Signal):  # --save-on, stacks: to the worker, not its group
            for worker in self.workers.values():
                if not worker.exited and (frame.ranks is None or worker.rank in frame.ranks):
                    _signal_main_thread(worker.pid, frame.sig)
        elif isinstance(frame, protocol.Heartbeat):
            # Echoed, so the controller hears from this agent at least every heartbeat
            # interval and can tell a silent node (link down, partition) from a quiet one.
            self.send(protocol.Heartbeat())

    # ---- main loop ------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.pending_signals.append(signum)

    def _finished(self, now: float) -> bool:
        if not self.stopping and not self.spec_received:
            return False
        if not all(w.exited for w in self.workers.values()):
            return False
        if any(w.group_alive() for w in self.workers.values()):
            # Leaders are gone but something they started lives on in the group: end it too.
            if not self.stopping:
                self.stop(self.grace, "")
            return False
        if self.fd_owner and self.all_exited_at is not None:
            return now - self.all_exited_at > DRAIN_AFTER_EXIT
        return not self.fd_owner

    def run(self) -> int:
        os.set_blocking(self.signal_r, False)
        os.set_blocking(self.signal_w, False)
        signal.set_wakeup_fd(self.signal_w)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        os.set_blocking(self.stdout_fd, False)
        self.sel.register(self.stdin_fd, selectors.EVENT_READ, "stdin")
        self.sel.register(self.signal_r, selectors.EVENT_READ, "signal")
        self.send(self.hello())
        while True:
            now = time.monotonic()
            if self._finished(now):
                break
            timeout = 0.5
            if self.stdin_open:
                silence = now - self.last_heard
                if silence > self.heartbeat_timeout:
                    # The link may still carry our output (a hung controller, not a dead
                    # pipe): report, but stop as if the controller were gone.
                    self.stdin_open = False
                    self.sel.unregister(self.stdin_fd)
                    self.stop(
                        min(self.grace, UPSTREAM_LOST_GRACE),
                        f"no heartbeat for {silence:.1f}s",
                        cause=protocol.CAUSE_NO_HEARTBEAT,
                    )
                    continue
                timeout = min(timeout, self.heartbeat_timeout - silence)
            if self.kill_at is not None and not self.killed:
                if now >= self.kill_at:
                    self._kill_remaining()
                else:
                    timeout = min(timeout, self.kill_at - now)
            if self.workers and not self.pidfd_owner:
                timeout = min(timeout, 0.05)  # no pidfd support: poll for exits
            waiting = False  # progress tails held back by PROGRESS_INTERVAL
            for worker in self.workers.values():
                for fd in list(worker.splitters):
                    waiting = self._forward_progress(fd, worker, now) or waiting
            if waiting:
                timeout = min(timeout, PROGRESS_INTERVAL)
            for key, _ in self.sel.select(max(0.0, timeout)):
                tag = key.data
                if tag == "stdin":
                    self._read_stdin()
                elif tag == "stdout":
                    self._flush()
                elif tag == "signal":
                    self._drain_signals()
                elif tag[0] == "pipe":
                    if key.fd in self.fd_owner:
                        self._read_pipe(key.fd, tag[1])
                elif tag[0] == "pidfd":
                    self._reap(tag[1])
            for worker in self.workers.values():
                if not worker.exited and worker.pidfd is None:
                    self._reap(worker)
        self.send(protocol.Bye())
        self._flush_blocking()
        return 0

    def _drain_signals(self) -> None:
        try:
            os.read(self.signal_r, 1024)
        except BlockingIOError:
            pass
        signals, self.pending_signals = self.pending_signals, []
        for signum in signals:
            self.stop(self.grace, f"agent received {signal.Signals(signum).name}")

    def _flush_blocking(self, timeout: float = 5.0) -> None:
        """Last words before exit: a bounded wait, a stuck link must not keep us alive."""
        deadline = time.monotonic() + timeout
        while self.outbuf and self.upstream_ok:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            _, writable, _ = select.select([], [self.stdout_fd], [], min(remaining, 0.5))
            if writable:
                self._flush()


def _plain_ip(addr: str) -> str:
    return addr[7:] if addr.startswith("::ffff:") and "." in addr else addr


def _free_port(addr: str | None) -> int:
    """A TCP port nobody listens on right now, on every address (as the TCP store binds)."""
    family = socket.AF_INET6 if addr and ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def main() -> None:
    sys.exit(Agent().run())


if __name__ == "__main__":
    main()
