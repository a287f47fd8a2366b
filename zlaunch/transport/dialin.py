"""Agents that dial in: the one path by which every scheduler that places processes for
zlaunch (one Slurm step for all nodes, Ray, Kubernetes, or one zlaunch does not know) hands
the controller its agents.

The controller listens (transport/connect_back.py), a :class:`Scheduler` places one process per
node running ``python -m zlaunch.agent --connect HOST:PORT --token-file FILE`` (it is told the
address and the token in a :class:`Rendezvous`), each agent proves the token and its connection
becomes that node's link. The scheduler places processes and nothing else: it returns a
:class:`Placement`, which says what it knows of them (their stderr, that they cannot come, that
a node was lost: it cuts that node's link) and removes them when the links are done.

``--launcher dialin --nodes N`` is the scheduler that places nothing: the user (or a scheduler
zlaunch does not know: Nomad, AWS Batch, SkyPilot) starts the agents; the controller writes the
token file (private) and waits for N of them. Any agent holding the token fills the next free
node; the nodes are named ``agent-0`` .. ``agent-N-1`` in the order they joined.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from zlaunch.agent import ConnectFailed, read_token_file
from zlaunch.errors import HostUnreachable, Interrupted, UsageError
from zlaunch.job import Host
from zlaunch.transport.connect_back import ConnectBackLink, Listener, Starter
from zlaunch.transport.preauth import Refusal
from zlaunch.wire import Answer

__all__ = [
    "DIALIN_TIMEOUT",
    "AnyRoster",
    "HandStarted",
    "Placement",
    "Rendezvous",
    "Scheduler",
    "cleanup_token_dir",
    "dialin_hosts",
    "open_dialin",
    "private_token_dir",
    "token_from_file",
]

DIALIN_TIMEOUT = 600.0
"""Seconds the controller waits for every agent to dial in (a scheduler may first pull images
or start nodes); Ctrl-C ends the wait sooner."""
NODE_PREFIX = "agent-"


@dataclass(frozen=True)
class Rendezvous:
    """What a scheduler is told to place the agents: where they dial and how they prove it."""

    address: str
    """``HOST:PORT`` for the agents' ``--connect``."""
    token: str
    """The job's secret. A scheduler hands it to the agents as a private file (a Kubernetes
    Secret mounted as a file, a file an actor writes with mode 0600), never on a command line
    nor in an environment a scheduler shows."""
    token_file: str
    """The token, in a private file on the controller's machine."""
    agent_argv: tuple[str, ...]
    """The agent's command (``python -u -m zlaunch.agent``); the scheduler appends
    ``--connect ADDRESS --token-file PATH`` (its own path to the token on the node)."""
    nodes: int
    """How many agents to place: one per node."""

    def command(self, token_path: str) -> list[str]:
        """The whole command of one agent whose token lies at ``token_path`` on its node."""
        return [*self.agent_argv, "--connect", self.address, "--token-file", token_path]


class Placement(Starter, Protocol):
    """The processes a scheduler placed (see :class:`Starter`: their stderr, their exit, what
    ended them; ``release`` is called once per link and with the last one everything placed
    is removed). Also:"""

    def joined(self, link: ConnectBackLink, answer: Answer, peer: str) -> None:
        """An agent is in: ``answer.node`` is the name it reports (its host name), ``peer``
        the address it connected from. When the scheduler learns that this node is lost, it
        calls ``link.cut()``: the controller takes it as lost at once."""
        ...

    def failed(self) -> str | None:
        """Why no more agents will come (a placement that gave up), else None."""
        ...

    def remove(self) -> None:
        """Remove everything placed now (a start that failed or was interrupted)."""
        ...


class Scheduler(Protocol):
    """Places one agent per node, told where to dial in."""

    def place(self, rendezvous: Rendezvous) -> Placement: ...


class AnyRoster:
    """``nodes`` slots that any agent holding the token fills, first come first placed: the
    controller did not choose the nodes, so it cannot name them in advance."""

    def __init__(self, nodes: int):
        self._missing = list(range(nodes))

    def place(self, answer: Answer) -> int | Refusal:
        return self._missing[0] if self._missing else Refusal.TWICE

    def joined(self, index: int) -> None:
        self._missing.remove(index)

    def missing(self) -> list[int]:
        return list(self._missing)


class HandStarted:
    """``--launcher dialin``: agents started by someone else; zlaunch knows only their
    connections (their stderr is where whoever started them sees it)."""

    def stderr_tail(self, task: int | None, link: ConnectBackLink | None = None) -> list[str]:
        return []

    def wait(self, timeout: float | None = None) -> int | None:
        return None

    def release(self, link: ConnectBackLink) -> None:
        pass

    def settle(self) -> None:
        pass

    def end_reason(self, wait: float = 2.0) -> str | None:
        return None

    def joined(self, link: ConnectBackLink, answer: Answer, peer: str) -> None:
        pass

    def failed(self) -> str | None:
        return None

    def remove(self) -> None:
        pass


class _HandStarting:
    def place(self, rendezvous: Rendezvous) -> Placement:
        return HandStarted()


def dialin_hosts(nodes: int, slots: Sequence[int]) -> list[Host]:
    """The job's nodes before any agent dialed in: ``agent-0`` .. ``agent-N-1``."""
    return [Host(f"{NODE_PREFIX}{i}", tuple(slots)) for i in range(nodes)]


def private_token_dir() -> str:
    """A directory only this user may enter, for the controller's copy of the token it made
    for a scheduler's agents (the scheduler hands it to them its own way)."""
    return tempfile.mkdtemp(prefix="zlaunch-dialin-")


def cleanup_token_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def token_from_file(path: str) -> str:
    """The token in ``path``, which is written (a new token, mode 0600, never over another
    file) when it does not exist yet. A file that others may read is refused: the token is
    what lets a process on the network run commands as this user."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    except OSError as err:
        raise UsageError(
            f"--token-file {path}: cannot create it: {err.strerror or err}",
            hint="give a path in a directory you can write to",
        ) from None
    else:
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    try:
        info = os.stat(path)
        if info.st_mode & 0o077:
            raise UsageError(
                f"--token-file {path}: its mode {stat.S_IMODE(info.st_mode):04o} lets others "
                "read it, and the token lets whoever holds it run commands as you",
                hint=f"chmod 600 {path}, or give a path that does not exist yet (zlaunch "
                "writes a new token there)",
            )
        return read_token_file(path)
    except ConnectFailed as err:
        raise UsageError(str(err), hint="remove it: zlaunch writes a new token there") from None
    except OSError as err:
        raise UsageError(f"--token-file {path}: {err.strerror or err}") from None


def open_dialin(
    hosts: Sequence[Host],
    agent_argv: Sequence[str],
    *,
    token_file: str,
    scheduler: Scheduler | None = None,
    controller_addr: str | None = None,
    port: int = 0,
    on_open: Callable[[int, ConnectBackLink], object] | None = None,
    on_listening: Callable[[str], None] = lambda _w: None,
    on_refused: Callable[[str], None] = lambda _w: None,
    interrupted: Callable[[], int | None] = lambda: None,
    timeout: float = DIALIN_TIMEOUT,
) -> list[ConnectBackLink]:
    """Listen, have ``scheduler`` place one agent per host (None: they are started by hand),
    and wait until each has dialed in; links in host order. If some never come, everything
    placed is removed and HostUnreachable names the hosts not filled (``.hosts``); if
    ``interrupted()`` names a signal first, Interrupted."""
    token = token_from_file(token_file)
    listener = Listener(controller_addr or "0.0.0.0", token, port=port)
    address = listener.address
    if controller_addr is None:  # bound to every address: tell the agents one that routes
        address = f"{_this_machine()}:{address.rpartition(':')[2]}"
    rendezvous = Rendezvous(address, token, token_file, tuple(agent_argv), len(hosts))
    if scheduler is None:  # the user starts them: say how
        on_listening(
            f"waiting for {len(hosts)} agents to dial in at {address}: on each node run\n  "
            f"zlaunch agent --connect {address} --token-file FILE\n"
            f"  (FILE: a private copy of {token_file})"
        )
    else:  # the scheduler starts them with the token; the address is what the nodes must reach
        on_listening(f"waiting for {len(hosts)} agents to dial in at {address}")
    try:
        placement = (scheduler or _HandStarting()).place(rendezvous)
    except BaseException:
        listener.close()
        raise
    links: list[ConnectBackLink | None] = [None] * len(hosts)

    def on_agent(index: int, sock: socket.socket, answer: Answer) -> None:
        link = ConnectBackLink(hosts[index], sock, answer.task, placement)
        links[index] = link
        try:
            peer = sock.getpeername()[0]
        except OSError:
            peer = "?"
        on_listening(f"{hosts[index].name} is {answer.node} ({peer})")
        placement.joined(link, answer, peer)
        if on_open is not None:
            on_open(index, link)

    def no_more_coming() -> bool:
        return interrupted() is not None or placement.failed() is not None

    try:
        missing = listener.accept_agents(
            AnyRoster(len(hosts)), time.monotonic() + timeout, on_agent, on_refused, no_more_coming
        )
    finally:
        listener.close()
    if not missing:
        return [link for link in links if link is not None]
    for link in links:
        if link is not None:
            link.cut()
            link.terminate(0.5)
    placement.remove()
    signum = interrupted()
    if signum is not None:
        raise Interrupted(
            f"stopped while the agents were dialing in ({len(missing)} of {len(hosts)} not yet)",
            exit_code=128 + signum,
        )
    gave_up = placement.failed()
    why = gave_up or f"not within {timeout:.0f} s"
    names = [hosts[i].name for i in missing]
    hint = (
        "each node runs `zlaunch agent --connect ADDRESS --token-file FILE` and must reach "
        "this machine over TCP (--controller-addr sets the address it listens on)"
    )
    if gave_up is not None:  # the scheduler said why: it is not the network
        hint = (
            "the scheduler's reason is in parentheses; the agents' image or command is the "
            "usual cause (--image, --k8s-python under --launcher k8s; the Ray nodes' Python "
            "under --launcher ray). Everything placed was removed"
        )
    raise HostUnreachable(
        f"{len(missing)} of {len(hosts)} agents did not dial in to {address} ({why})",
        hosts=names,
        hint=hint,
    )


def _this_machine() -> str:
    """This machine's address as other machines reach it: the one the kernel sends from on
    its default route, else its host name."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent, a route is chosen
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()
