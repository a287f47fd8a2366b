"""Agents that connect back: the controller listens on a TCP port, each agent it started
(``python -m zlaunch.agent --connect HOST:PORT``) dials in, the two prove they hold the job's
token (zlaunch/wire/handshake.py), and the connection becomes the node's :class:`Link`.

What started the agents (one ``srun`` for the whole allocation: transport/slurm_one_step.py) is
a :class:`Starter`: the links ask it for the stderr of their task and hand it back when they are
done, and it closes every link when it ends (every agent is lost with it). Which agents may
join is a :class:`~zlaunch.transport.roster.Roster`'s to say: the listener knows nothing of
the scheduler.

Anyone on the network may connect to the port, so a connection that has not proven the token
costs a bounded amount (transport/preauth.py): one thread runs every handshake on non-blocking
sockets, each peer has a deadline from its accept and one line of room, at most a few hundred
wait at once and the oldest is shed first, and a controller out of file descriptors sheds and
backs off instead of failing the start. A connection that fails the handshake (garbage, a
wrong token, a node that is not the job's, a node that already connected) is refused, told
why in a fixed phrase and closed; the controller goes on waiting for the real agents.
"""

from __future__ import annotations

import errno
import os
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from zlaunch.errors import LaunchError
from zlaunch.job import Host
from zlaunch.transport.link import Link
from zlaunch.transport.preauth import Pending, PendingPeers, Refusal, RefusalTally
from zlaunch.transport.roster import Roster
from zlaunch.wire import Answer, HandshakeError, TokenMismatch
from zlaunch.wire import handshake as connect_handshake

__all__ = ["ConnectBackLink", "Listener", "Starter", "HANDSHAKE_TIMEOUT"]

HANDSHAKE_TIMEOUT = 10.0
"""Seconds from its accept that a connection has to answer (an agent needs one round trip)."""
MAX_PENDING = 512
MIN_PENDING = 16
"""Unauthenticated connections held at once: a quarter of the descriptors free when the wait
starts, within these bounds."""
ACCEPT_BATCH = 32
"""Connections accepted per turn of the loop; between turns every peer that answered is read,
so a flood of new connections cannot push an agent's answer back."""
ACCEPT_POLL = 0.2
"""How often the wait asks ``stop_waiting`` (and at most how long it sleeps)."""
BACKOFF_FIRST, BACKOFF_MAX = 0.05, 1.0
"""How long accepting pauses while no descriptor is free and no peer of ours could be shed."""
_PRESSURE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# accept(2) reports these for the one connection it was taking (gone, or the network's):
_TRANSIENT = {
    errno.ECONNABORTED, errno.EPROTO, errno.ENETDOWN, errno.ENOPROTOOPT, errno.EHOSTDOWN,
    errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH, errno.EPERM, errno.ETIMEDOUT,
    errno.ECONNRESET, getattr(errno, "ENONET", errno.ENETDOWN),
}  # fmt: skip
# What a refused peer is told (never its own bytes, so nothing it sent is reflected).
_WIRE_REASON = {
    Refusal.NOT_AN_AGENT: "not an agent answer",
    Refusal.WRONG_TOKEN: "wrong token",
    Refusal.NOT_A_NODE: "not a node of this job",
    Refusal.TWICE: "node connected already",
}


class Starter(Protocol):
    """What started the agents that connect back (one process for all of them)."""

    def stderr_tail(self, task: int | None, link: ConnectBackLink | None = None) -> list[str]:
        """The lines of task ``task``'s process (``None``: every task's); ``link``: the agent
        asking, for a starter that knows its agents by their links rather than by task ids
        (a pod, a Ray node)."""
        ...

    def wait(self, timeout: float | None = None) -> int | None: ...

    def release(self, link: ConnectBackLink) -> None: ...

    def end_reason(self, wait: float = 2.0) -> str | None: ...

    def settle(self) -> None:
        """Wait until what ``release`` set going (removing what was placed) is done; its own
        calls are bounded."""
        ...


class ConnectBackLink(Link):
    """One agent's connection: frames both ways on a TCP socket. EOF on the agent's side
    (``close_stdin``) is a half-close, as EOF on a pipe is."""

    def __init__(self, host: Host, sock: socket.socket, task: int | None, starter: Starter):
        super().__init__(host)
        self.sock = sock
        self.task = task
        self.starter = starter
        self._released = False
        self._eof = threading.Event()  # the reader saw the agent's end of the connection

    def _write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, size: int = 65536) -> bytes:
        try:
            data = self.sock.recv(size)
        except OSError:
            data = b""
        if not data:
            self._eof.set()
        return data

    def close_stdin(self) -> None:
        with self._send_lock:
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def cut(self) -> None:
        """The process behind the agent is gone: end both directions now, so the reader sees
        EOF even if the peer's host never says so."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def running(self) -> bool:
        return not self._eof.is_set() and super().running()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status of what started the agent (one for all nodes)."""
        return self.starter.wait(timeout)

    def stderr_tail(self) -> list[str]:
        return self.starter.stderr_tail(self.task, link=self)

    def end_reason(self, wait: float = 2.0) -> str | None:
        """Why the scheduler ended what started the agent, if it did (see SlurmLink's)."""
        return self.starter.end_reason(wait)

    def settle(self) -> None:
        if self._released:
            self.starter.settle()

    def terminate(self, wait: float = 5.0) -> None:
        if self._released:  # ended already (a failed start ends what did connect)
            return
        # EOF first: the agent then stops its workers itself and closes its end when done.
        self.close_stdin()
        self.closed = True
        # The agent closes its end once its workers are gone; its last frames are the reader
        # thread's to take (reading here would take them from it).
        self._eof.wait(max(0.0, wait))
        self.cut()
        self.sock.close()
        self._released = True
        self.starter.release(self)


class Listener:
    """The controller's port for one attempt's agents: bound to ``address`` (one the nodes
    reach), on ``port`` (0: any free one)."""

    def __init__(self, address: str, token: str, port: int = 0):
        self.token = token
        try:
            infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
            family, _, _, _, sockaddr = infos[0]
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            # a fixed port is bound again by the next attempt while the last one's
            # connections linger in TIME_WAIT
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(sockaddr[:2])
            # the kernel's whole queue: a flood waits there to be accepted and shed, rather
            # than having an agent's connection dropped before it is seen
            self.sock.listen(socket.SOMAXCONN)
        except OSError as err:
            raise LaunchError(
                f"cannot listen on {address}:{port} for the agents to connect back: {err}",
                hint="--controller-addr ADDR sets an address of this machine the nodes reach",
            ) from None
        self.sock.setblocking(False)
        host, port = self.sock.getsockname()[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        """``HOST:PORT`` as the agents' ``--connect`` takes it."""
        # One descriptor held back: with none left, it lets one waiting connection be told
        # BUSY (and so try again) instead of sitting unanswered in the kernel's queue.
        self._reserve = _reserve_descriptor()

    def close(self) -> None:
        self.sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def accept_agents(
        self,
        roster: Roster,
        deadline: float,
        on_agent: Callable[[int, socket.socket, Answer], None],
        on_refused: Callable[[str], None],
        stop_waiting: Callable[[], bool],
    ) -> list[int]:
        """Accept until ``roster`` is complete, ``deadline`` (monotonic) passes or
        ``stop_waiting()`` says no more will come; each authenticated agent is handed to
        ``on_agent(index, sock, answer)`` (a blocking socket, its handshake read to the last
        byte). Refusals are told to ``on_refused``. Returns the roster's missing indices."""
        wait = _Wait(self, roster, on_agent, RefusalTally(on_refused))
        try:
            wait.run(deadline, stop_waiting)
        finally:
            wait.close()
        return roster.missing()


class _Wait:
    """One :meth:`Listener.accept_agents`: the selector, the pending peers, the tally."""

    def __init__(self, listener: Listener, roster: Roster, on_agent, tally: RefusalTally):
        self.listener = listener
        self.roster = roster
        self.on_agent = on_agent
        self.tally = tally
        self.pending = PendingPeers(_pending_cap(), HANDSHAKE_TIMEOUT)
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener.sock, selectors.EVENT_READ, None)
        self.listening = True
        self.resume_at = 0.0
        self.backoff = BACKOFF_FIRST

    def run(self, deadline: float, stop_waiting: Callable[[], bool]) -> None:
        asked = 0.0
        while self.roster.missing():
            now = time.monotonic()
            if now >= deadline:
                return
            if now - asked >= ACCEPT_POLL:
                if stop_waiting():
                    return
                asked = now
            if not self.listening and now >= self.resume_at:
                self.sel.register(self.listener.sock, selectors.EVENT_READ, None)
                self.listening = True
            wake = min(deadline, asked + ACCEPT_POLL)
            if self.pending.next_deadline() is not None:
                wake = min(wake, self.pending.next_deadline())
            if not self.listening:
                wake = min(wake, self.resume_at)
            events = self.sel.select(max(0.0, wake - now))
            # answers first: an agent's line is read before any more strangers are let in
            incoming = False
            for key, _ in events:
                if key.data is None:
                    incoming = True
                else:
                    self._answer(key.data)
            if incoming and self.roster.missing():
                self._accept_some()
            for entry in self.pending.expired(time.monotonic()):
                self._drop(entry, connect_handshake.busy_line())
                self._refused(Refusal.SILENT, entry, "no handshake line in time")

    def close(self) -> None:
        """Connections still waiting are not the job's any more: each is closed."""
        for entry in self.pending:
            self.pending.remove(entry.key)
            self._drop(entry, None)
        self.sel.close()
        summary = self.tally.summary()
        if summary:
            self.tally.note_once(summary)

    # ---- one turn ---------------------------------------------------------------------------

    def _accept_some(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = self.listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in _PRESSURE:
                    if not self._out_of_descriptors(err):
                        return
                    continue
                if err.errno in _TRANSIENT:
                    continue
                raise LaunchError(f"accepting the agents' connections failed: {err}") from None
            self.backoff = BACKOFF_FIRST
            while self.pending.full:  # room for the newcomer: the oldest waiting peer goes
                self._shed_oldest()
            self._greet(conn, _peer(addr))

    def _greet(self, conn: socket.socket, peer: str) -> None:
        challenge = connect_handshake.new_nonce()
        line = connect_handshake.challenge_line(challenge)
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if conn.send(line) != len(line):  # a new socket's buffer takes one line
                raise OSError("the greeting did not fit the socket's buffer")
        except OSError as err:
            conn.close()
            self.tally.refused(
                Refusal.FAILED, peer, f"refused a connection from {peer}: connection failed: {err}"
            )
            return
        entry = self.pending.add(conn.fileno(), conn, peer, challenge, time.monotonic())
        self.sel.register(conn, selectors.EVENT_READ, entry)

    def _answer(self, entry: Pending) -> None:
        """``entry`` is readable: take what it sent, and settle it once its line is whole."""
        try:
            data = entry.conn.recv(self.pending.room(entry))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._settle(entry, Refusal.FAILED, f"connection failed: {err}")
            return
        if not data:
            self._settle(entry, Refusal.CLOSED, "connection closed during the handshake")
            return
        try:
            line = self.pending.feed(entry, data)
            if line is None:
                return
            answer = connect_handshake.check_answer(self.listener.token, entry.challenge, line)
            self.pending.check_alone(entry)
        except TokenMismatch as err:
            self._settle(entry, Refusal.WRONG_TOKEN, str(err))
            return
        except HandshakeError as err:
            self._settle(entry, Refusal.NOT_AN_AGENT, str(err))
            return
        placed = self.roster.place(answer)
        if isinstance(placed, Refusal):
            why = "is not a node of this job" if placed is Refusal.NOT_A_NODE else "connected twice"
            self._settle(entry, placed, f"{answer.node} {why}", agent=True)
            return
        self._admit(entry, placed, answer)

    def _admit(self, entry: Pending, index: int, answer: Answer) -> None:
        self.pending.remove(entry.key)
        self.sel.unregister(entry.conn)
        conn: socket.socket = entry.conn  # type: ignore[assignment]
        proof = connect_handshake.proof_line(self.listener.token, entry.challenge, answer)
        try:
            if conn.send(proof) != len(proof):
                raise OSError("the proof did not fit the socket's buffer")
            conn.setblocking(True)
        except OSError as err:
            conn.close()
            self.tally.refused(
                Refusal.FAILED, entry.peer,
                f"the agent on {answer.node} went away during the handshake: {err}",
            )  # fmt: skip
            return
        self.roster.joined(index)
        self.on_agent(index, conn, answer)

    # ---- refusing ---------------------------------------------------------------------------

    def _settle(self, entry: Pending, kind: Refusal, why: str, agent: bool = False) -> None:
        """Refuse ``entry`` after it answered (or failed to): told why where it can use it."""
        self.pending.remove(entry.key)
        reason = _WIRE_REASON.get(kind)
        self._drop(entry, None if reason is None else connect_handshake.refusal_line(reason))
        self._refused(kind, entry, why, agent)

    def _refused(self, kind: Refusal, entry: Pending, why: str, agent: bool = False) -> None:
        what = "the agent" if agent else "a connection"
        self.tally.refused(kind, entry.peer, f"refused {what} from {entry.peer}: {why}")

    def _drop(self, entry: Pending, line: bytes | None) -> None:
        conn: socket.socket = entry.conn  # type: ignore[assignment]
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        if line is not None:
            try:
                conn.send(line)
            except OSError:
                pass  # gone already, or its buffer full: closing says enough
        conn.close()

    def _shed_oldest(self) -> None:
        entry = self.pending.oldest()
        if entry is None:
            return
        self.pending.remove(entry.key)
        self._drop(entry, connect_handshake.busy_line())
        self._refused(
            Refusal.SHED, entry, f"no answer yet with {self.pending.cap} connections waiting"
        )

    def _out_of_descriptors(self, err: OSError) -> bool:
        """accept() found no descriptor free. Shed the oldest waiting peer and hold no more
        than fitted (True: accept again), or, with none of ours to shed, tell one waiting
        connection BUSY through the reserve and pause accepting for a while (False)."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.tally.note_once(
            f"the controller ran out of file descriptors while the agents connected back "
            f"({err.strerror}; ulimit -n is {soft}): the oldest unanswered connections are "
            "dropped to make room"
        )
        if len(self.pending):
            # the one that failed did not fit beside these: hold one fewer from now on
            self.pending.shrink_to(len(self.pending) - 1)
            self._shed_oldest()
            return True
        self._turn_one_away()
        if self.listening:
            self.sel.unregister(self.listener.sock)
            self.listening = False
        self.resume_at = time.monotonic() + self.backoff
        self.backoff = min(BACKOFF_MAX, self.backoff * 2)
        return False

    def _turn_one_away(self) -> None:
        listener = self.listener
        if listener._reserve is None:
            listener._reserve = _reserve_descriptor()
            return
        os.close(listener._reserve)
        listener._reserve = None
        try:
            conn, addr = listener.sock.accept()
        except OSError:
            conn = None
        if conn is not None:
            try:
                conn.setblocking(False)
                conn.send(connect_handshake.busy_line())
            except OSError:
                pass
            conn.close()
            peer = _peer(addr)
            self.tally.refused(
                Refusal.NO_DESCRIPTOR, peer,
                f"turned away a connection from {peer}: no file descriptor free",
            )  # fmt: skip
        listener._reserve = _reserve_descriptor()


def _pending_cap() -> int:
    """A quarter of the descriptors free now, within [MIN_PENDING, MAX_PENDING]."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_PENDING
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 0
    return max(MIN_PENDING, min(MAX_PENDING, (soft - used) // 4))


def _reserve_descriptor() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _peer(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer)
