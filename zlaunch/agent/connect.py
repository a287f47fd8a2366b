"""The agent's end of ``--connect HOST:PORT``: instead of speaking frames on its stdin and
stdout (ssh, one srun step per node), the agent dials the controller, proves it holds the job's
token (zlaunch/wire/handshake.py) and speaks frames on that socket. This is how the agents
of one ``srun`` step for the whole allocation (``--slurm-mode one-step``) reach the controller:
one step has one stdin, shared by every task.

A scheduler zlaunch does not know (Nomad, AWS Batch, SkyPilot, a Kubernetes pod) starts
``zlaunch agent --connect HOST:PORT --token-file FILE``: the token is read from a private file
(never from a command line, which every user of the node can read).

Which node it is: Slurm's node name (``SLURMD_NODENAME``), which is how the allocation's node
list names it, else the host name; and its task id (``SLURM_PROCID``), which srun's labelled
stderr lines carry.
"""

from __future__ import annotations

import os
import random
import socket
import stat
import sys
import time

from zlaunch.wire import handshake as connect_handshake
from zlaunch.wire import protocol

__all__ = [
    "ConnectFailed",
    "agent_fds",
    "connect_back",
    "connected_ends",
    "parse_address",
    "read_token_file",
]

CONNECT_DEADLINE = 60.0
"""Seconds an agent keeps trying to get in (the controller waits as long for the last one)."""
TRY_TIMEOUT = 15.0
"""Seconds one try waits for each of the controller's lines."""
RETRY_FIRST, RETRY_MAX = 0.05, 2.0
"""Pause before the second try, doubling up to this (each with jitter: agents shed together
must not come back together)."""


TOKEN_MIN, TOKEN_MAX = 32, 1024
"""Characters a token file's one line may hold (zlaunch writes 64 hex digits)."""

_ends: tuple[str, str] | None = None
"""(this end's address, the controller's) of the connection made, for the agent's hello."""


class ConnectFailed(Exception):
    """The agent could not reach or authenticate with the controller (the message says which)."""


class _TryAgain(Exception):
    """This try failed in a way another one may not: no room, a lost or silent connection."""


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT``."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConnectFailed(f"--connect {text!r}: expected HOST:PORT")
    return host, int(port)


def node_identity(environ: dict[str, str] | os._Environ) -> tuple[str, int | None]:
    node = environ.get("SLURMD_NODENAME") or socket.gethostname()
    task = environ.get("SLURM_PROCID", "")
    return node, int(task) if task.isdigit() else None


def read_token_file(path: str) -> str:
    """The token in ``path``: one line, printable, no spaces; the file readable by nobody but
    its owner and group (a Kubernetes Secret mounted with ``defaultMode: 0440`` or tighter)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY)
    except OSError as err:
        raise ConnectFailed(f"--token-file {path}: cannot open: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConnectFailed(f"--token-file {path}: not a regular file")
        if info.st_mode & 0o007:
            raise ConnectFailed(
                f"--token-file {path}: other users may read or write it (mode "
                f"{stat.S_IMODE(info.st_mode):04o}); chmod o-rwx {path} (a Kubernetes Secret: "
                "defaultMode 0400 or 0440)"
            )
        data = os.read(fd, TOKEN_MAX + 2)
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    if not TOKEN_MIN <= len(text) <= TOKEN_MAX or not all(33 <= ord(c) < 127 for c in text):
        raise ConnectFailed(
            f"--token-file {path}: expected one line of {TOKEN_MIN}-{TOKEN_MAX} printable "
            "characters without spaces (the file the controller wrote for --launcher dialin)"
        )
    return text


def connected_ends() -> tuple[str, str] | None:
    """(this end's address, the controller's) of the connection to the controller, once made:
    the address the other nodes reach this one at, as the hello says it."""
    return _ends


def connect_back(
    address: str,
    environ=os.environ,
    deadline_s: float = CONNECT_DEADLINE,
    token_file: str | None = None,
) -> socket.socket:
    """A socket to the controller, the handshake done. The token is read from ``token_file``,
    else taken out of ``environ`` (where one srun step carries it), so no worker inherits it.

    A try that finds no room (BUSY, a connection dropped or unanswered: the controller sheds
    strangers under a flood, and may have shed this agent with them) is followed by another,
    after a growing pause, until ``deadline_s`` seconds have passed; a refusal, a port that
    does not speak zlaunch or a controller without the token ends it at once."""
    token = environ.pop(protocol.CONNECT_TOKEN_ENV, "")
    if token_file is not None:
        token = read_token_file(token_file)
    if not token:
        raise ConnectFailed(
            f"--connect needs the job's token: --token-file FILE (the file --launcher dialin "
            f"wrote), or {protocol.CONNECT_TOKEN_ENV} where zlaunch starts the agents itself"
        )
    parse_address(address)  # a bad address is refused before any try
    node, task = node_identity(environ)
    start = time.monotonic()
    deadline = start + deadline_s
    pause = RETRY_FIRST
    tries = 0
    while True:
        tries += 1
        try:
            return _try(address, token, node, task, min(deadline, time.monotonic() + TRY_TIMEOUT))
        except _TryAgain as err:
            left = deadline - time.monotonic()
            if left <= 0:
                took = time.monotonic() - start
                raise ConnectFailed(
                    f"could not get in to the controller at {address} in {took:.0f} s "
                    f"({tries} tries; the last: {err})"
                ) from None
        except (connect_handshake.HandshakeError, OSError) as err:
            raise ConnectFailed(
                f"handshake with the controller at {address} failed: {err}"
            ) from None
        time.sleep(min(left, pause * random.uniform(0.5, 1.0)))
        pause = min(RETRY_MAX, pause * 2)


def _try(address: str, token: str, node: str, task: int | None, deadline: float):
    """One connection and handshake; _TryAgain where another try may succeed."""
    host, port = parse_address(address)
    try:
        sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
    except ConnectionRefusedError as err:  # nobody listens: the controller is gone (a full
        # queue drops a connection silently, it never refuses one)
        raise ConnectFailed(f"cannot connect to the controller at {address}: {err}") from None
    except OSError as err:  # unreachable, timed out: the network's, or a long queue
        raise _TryAgain(f"cannot connect: {err}") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        greeting = _line(sock, deadline)
        challenge = connect_handshake.read_challenge(greeting)
        nonce = connect_handshake.new_nonce()
        sock.sendall(connect_handshake.answer_line(token, challenge, nonce, node, task))
        proof = _line(sock, deadline)
        connect_handshake.check_proof(token, challenge, nonce, node, proof)
    except connect_handshake.Busy as err:
        sock.close()
        raise _TryAgain(str(err)) from None
    except OSError as err:
        sock.close()
        raise _TryAgain(f"connection failed: {err}") from None
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    global _ends
    _ends = (_plain(sock.getsockname()[0]), _plain(sock.getpeername()[0]))
    return sock


def _plain(addr: str) -> str:
    return addr[7:] if addr.startswith("::ffff:") and "." in addr else addr


def _line(sock: socket.socket, deadline: float) -> bytes:
    """The controller's next line; _TryAgain when there is none (the controller shed this
    connection, or it waited in a queue too long to be answered in time)."""
    try:
        return connect_handshake.recv_line(sock, deadline)
    except connect_handshake.HandshakeError as err:
        raise _TryAgain(str(err)) from None


def parse_argv(argv: list[str]) -> tuple[str | None, str | None]:
    """(``--connect`` address, ``--token-file`` path) from the agent's arguments (each also as
    ``--flag=value``); ConnectFailed on anything else."""
    values: dict[str, str] = {}
    rest = list(argv)
    while rest:
        flag, eq, value = rest.pop(0).partition("=")
        if flag not in ("--connect", "--token-file") or flag in values:
            raise ConnectFailed(
                f"unexpected arguments {argv!r}; expected --connect HOST:PORT [--token-file FILE]"
            )
        if not eq:
            if not rest:
                raise ConnectFailed(f"{flag} needs a value")
            value = rest.pop(0)
        values[flag] = value
    if "--token-file" in values and "--connect" not in values:
        raise ConnectFailed("--token-file goes with --connect HOST:PORT")
    return values.get("--connect"), values.get("--token-file")


def agent_fds(argv: list[str]) -> tuple[int, int]:
    """The agent's (input, output) descriptors from its arguments: stdin and stdout, or with
    ``--connect HOST:PORT`` the connected socket twice (the output a duplicate, so the agent's
    selector can watch the two directions apart). Exits 2 with a message on bad arguments or
    a failed connection: there is no controller to tell."""
    try:
        address, token_file = parse_argv(argv)
    except ConnectFailed as err:
        print(f"zlaunch agent: {err}", file=sys.stderr)
        sys.exit(2)
    if address is None:
        return 0, 1
    try:
        sock = connect_back(address, token_file=token_file)
    except ConnectFailed as err:
        print(f"zlaunch agent on {socket.gethostname()}: {err}", file=sys.stderr)
        sys.exit(2)
    fd = sock.detach()
    return fd, os.dup(fd)
