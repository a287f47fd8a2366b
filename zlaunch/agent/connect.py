"""The agent's end of ``--connect HOST:PORT``: instead of speaking frames on its stdin and
stdout (ssh, one srun step per node), the agent dials the controller, proves it holds the job's
token (zlaunch/connect_handshake.py) and speaks frames on that socket. This is how the agents
of one ``srun`` step for the whole allocation (``--slurm-mode one-step``) reach the controller:
one step has one stdin, shared by every task.

Which node it is: Slurm's node name (``SLURMD_NODENAME``), which is how the allocation's node
list names it, else the host name; and its task id (``SLURM_PROCID``), which srun's labelled
stderr lines carry.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from zlaunch import connect_handshake, protocol

__all__ = ["ConnectFailed", "agent_fds", "connect_back", "parse_address"]

CONNECT_TIMEOUT = 30.0
HANDSHAKE_TIMEOUT = 15.0


class ConnectFailed(Exception):
    """The agent could not reach or authenticate with the controller (the message says which)."""


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


def connect_back(address: str, environ=os.environ) -> socket.socket:
    """A socket to the controller, the handshake done; the token is taken out of ``environ``
    first, so no worker inherits it."""
    token = environ.pop(protocol.CONNECT_TOKEN_ENV, "")
    if not token:
        raise ConnectFailed(
            f"--connect needs the job's token in {protocol.CONNECT_TOKEN_ENV}; "
            "zlaunch sets it for the agents it starts"
        )
    host, port = parse_address(address)
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    except OSError as err:
        raise ConnectFailed(f"cannot connect to the controller at {address}: {err}") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        challenge = connect_handshake.read_challenge(connect_handshake.recv_line(sock, deadline))
        node, task = node_identity(environ)
        nonce = connect_handshake.new_nonce()
        sock.sendall(connect_handshake.answer_line(token, challenge, nonce, node, task))
        proof = connect_handshake.recv_line(sock, deadline)
        connect_handshake.check_proof(token, challenge, nonce, node, proof)
    except (connect_handshake.HandshakeError, OSError) as err:
        sock.close()
        raise ConnectFailed(f"handshake with the controller at {address} failed: {err}") from None
    sock.settimeout(None)
    return sock


def agent_fds(argv: list[str]) -> tuple[int, int]:
    """The agent's (input, output) descriptors from its arguments: stdin and stdout, or with
    ``--connect HOST:PORT`` the connected socket twice (the output a duplicate, so the agent's
    selector can watch the two directions apart). Exits 2 with a message on bad arguments or
    a failed connection: there is no controller to tell."""
    if not argv:
        return 0, 1
    if len(argv) != 2 or argv[0] != "--connect":
        print(f"zlaunch agent: unexpected arguments {argv!r}; expected --connect HOST:PORT",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    try:
        sock = connect_back(argv[1])
    except ConnectFailed as err:
        print(f"zlaunch agent on {socket.gethostname()}: {err}", file=sys.stderr)
        sys.exit(2)
    fd = sock.detach()
    return fd, os.dup(fd)
