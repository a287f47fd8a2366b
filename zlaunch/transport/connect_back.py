"""Agents that connect back: the controller listens on a TCP port, each agent it started
(``python -m zlaunch.agent --connect HOST:PORT``) dials in, the two prove they hold the job's
token (zlaunch/connect_handshake.py), and the connection becomes the node's :class:`Link`.

What started the agents (one ``srun`` for the whole allocation: transport/slurm_one_step.py) is
a :class:`Starter`: the links ask it for the stderr of their task and hand it back when they are
done, and it closes every link when it ends (every agent is lost with it).

A connection that fails the handshake (garbage, a wrong token, a node that is not the job's, a
node that already connected) is refused, reported through ``on_refused`` and closed; the
controller goes on waiting for the real agents.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from zlaunch import connect_handshake
from zlaunch.connect_handshake import Answer, HandshakeError
from zlaunch.errors import LaunchError
from zlaunch.hostfile import Host
from zlaunch.transport.link import Link

__all__ = ["ConnectBackLink", "Listener", "Starter", "HANDSHAKE_TIMEOUT"]

# An accepted connection has this long to answer: a silent one must not hold a handshake slot.
HANDSHAKE_TIMEOUT = 10.0
# Handshakes in flight at once (each waits on one peer's answer).
PARALLEL_HANDSHAKES = 32
ACCEPT_POLL = 0.2


class Starter(Protocol):
    """What started the agents that connect back (one process for all of them)."""

    def stderr_tail(self, task: int | None) -> list[str]: ...

    def wait(self, timeout: float | None = None) -> int | None: ...

    def release(self, link: ConnectBackLink) -> None: ...

    def end_reason(self, wait: float = 2.0) -> str | None: ...


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

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status of what started the agent (one for all nodes)."""
        return self.starter.wait(timeout)

    def stderr_tail(self) -> list[str]:
        return self.starter.stderr_tail(self.task)

    def end_reason(self, wait: float = 2.0) -> str | None:
        """Why the scheduler ended what started the agent, if it did (see SlurmLink's)."""
        return self.starter.end_reason(wait)

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
    reach), any free port."""

    def __init__(self, address: str, token: str, backlog: int):
        self.token = token
        try:
            infos = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)
            family, _, _, _, sockaddr = infos[0]
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock.bind(sockaddr[:2])
            self.sock.listen(min(max(backlog, 16), socket.SOMAXCONN))
        except OSError as err:
            raise LaunchError(
                f"cannot listen on {address} for the agents to connect back: {err}",
                hint="--controller-addr ADDR sets an address of this machine the nodes reach",
            ) from None
        host, port = self.sock.getsockname()[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        """``HOST:PORT`` as the agents' ``--connect`` takes it."""

    def close(self) -> None:
        self.sock.close()

    def accept_agents(
        self,
        hosts: Sequence[Host],
        deadline: float,
        on_agent: Callable[[int, socket.socket, Answer], None],
        on_refused: Callable[[str], None],
        stop_waiting: Callable[[], bool],
    ) -> list[int]:
        """Accept until every host's agent has connected, ``deadline`` (monotonic) passes or
        ``stop_waiting()`` says no more will come; each authenticated agent is handed to
        ``on_agent(index, sock, answer)``. Returns the indices of the hosts still missing."""
        index_of = _index_by_name(hosts)
        missing = set(range(len(hosts)))
        done: queue.Queue = queue.Queue()
        # A finished handshake wakes the loop at once (the last agent's must not wait a poll).
        wake_r, wake_w = socket.socketpair()
        sel = selectors.DefaultSelector()
        self.sock.setblocking(False)
        sel.register(self.sock, selectors.EVENT_READ, "listener")
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        pool = ThreadPoolExecutor(PARALLEL_HANDSHAKES, thread_name_prefix="handshake")
        try:
            while missing and not stop_waiting():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in sel.select(min(left, ACCEPT_POLL)):
                    if key.data == "wake":
                        wake_r.recv(4096)
                        continue
                    try:
                        conn, peer = self.sock.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as err:
                        raise LaunchError(
                            f"accepting the agents' connections failed: {err}"
                        ) from None
                    pool.submit(self._handshake, conn, peer, done, wake_w)
                while True:
                    try:
                        item = done.get_nowait()
                    except queue.Empty:
                        break
                    self._settle(item, index_of, missing, on_agent, on_refused)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            sel.close()
            wake_r.close()
            wake_w.close()
        # Handshakes that finished too late: their agents are not the job's any more.
        while True:
            try:
                item = done.get_nowait()
            except queue.Empty:
                break
            item[0].close()
        return sorted(missing)

    def _settle(self, item, index_of, missing, on_agent, on_refused) -> None:
        """One finished handshake: hand the agent over, or refuse it, saying why."""
        conn, peer, challenge, outcome = item
        if isinstance(outcome, HandshakeError):
            on_refused(f"refused a connection from {_peer(peer)}: {outcome}")
            conn.close()
            return
        index = index_of.get(outcome.node)
        if index is None or index not in missing:
            why = "is not a node of this job" if index is None else "connected twice"
            on_refused(f"refused the agent from {_peer(peer)}: {outcome.node} {why}")
            conn.close()
            return
        try:
            conn.sendall(connect_handshake.proof_line(self.token, challenge, outcome))
        except OSError as err:
            on_refused(f"the agent on {outcome.node} went away during the handshake: {err}")
            conn.close()
            return
        conn.settimeout(None)
        missing.discard(index)
        on_agent(index, conn, outcome)

    def _handshake(
        self, conn: socket.socket, peer: object, done: queue.Queue, wake: socket.socket
    ) -> None:
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        challenge = connect_handshake.new_nonce()
        outcome: Answer | HandshakeError
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn.settimeout(HANDSHAKE_TIMEOUT)
            conn.sendall(connect_handshake.challenge_line(challenge))
            line = connect_handshake.recv_line(conn, deadline)
            outcome = connect_handshake.check_answer(self.token, challenge, line)
        except HandshakeError as err:
            outcome = err
        except OSError as err:
            outcome = HandshakeError(f"connection failed: {err}")
        done.put((conn, peer, challenge, outcome))
        try:
            wake.send(b"x")
        except OSError:
            pass  # the loop has ended: it drains what is left


def _index_by_name(hosts: Sequence[Host]) -> dict[str, int]:
    """Each host by its name, and by its short name where that is unambiguous (an agent
    outside Slurm reports its host name, which may lack the domain)."""
    index = {host.name: i for i, host in enumerate(hosts)}
    shorts: dict[str, list[int]] = {}
    for i, host in enumerate(hosts):
        shorts.setdefault(host.name.split(".")[0], []).append(i)
    for short, found in shorts.items():
        if len(found) == 1:
            index.setdefault(short, found[0])
    return index


def _peer(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
