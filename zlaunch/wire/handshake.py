"""The handshake of an agent that connects back to the controller over TCP (``--slurm-mode
one-step``): both sides prove they hold the job's token without sending it. Standard library
only: the agent (zlaunch/agent/connect.py) and the controller (zlaunch/transport/connect_back.py)
import it; the socket work is theirs, the lines and their checks are here (pure).

Three lines, then the connection carries frames as a pipe would::

    controller -> agent   ZLAUNCH-CONNECT 1 <controller nonce>
    agent -> controller   AGENT <node> <task> <agent nonce> <mac>
    controller -> agent   OK <mac>

Each mac is HMAC-SHA256 under the token over both nonces, the node and which side speaks, so an
answer cannot be replayed on another connection nor passed off as the other side's. The agent
checks the controller's mac too: whoever listens on the port after the controller is gone (any
user may bind it) cannot hand the agent a command to run.

Instead of its greeting or its proof the controller may say one of two lines and close::

    BUSY                  no room for this connection now: try again (the agent backs off)
    REFUSED <reason>      the answer was refused (a fixed phrase, never the peer's own bytes)

Neither is authenticated, so neither is trusted beyond what closing the connection could do
anyway: BUSY makes an agent try again within its own deadline, REFUSED makes it give up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import socket
import time
from dataclasses import dataclass

__all__ = [
    "Answer",
    "Busy",
    "HandshakeError",
    "MAX_LINE",
    "Refused",
    "TokenMismatch",
    "answer_line",
    "busy_line",
    "challenge_line",
    "check_answer",
    "check_proof",
    "new_nonce",
    "proof_line",
    "read_challenge",
    "recv_line",
    "refusal_line",
]

VERSION = "1"
MAX_LINE = 512  # a longer first line is not a zlaunch agent: refused before it is read further
_HEX64 = r"[0-9a-f]{64}"
_CHALLENGE = re.compile(rf"^ZLAUNCH-CONNECT {VERSION} ({_HEX64})$")
# A Slurm node name or host name; the task is SLURM_PROCID, "-" outside a step.
_ANSWER = re.compile(
    rf"^AGENT ([A-Za-z0-9][A-Za-z0-9._-]{{0,252}}) ([0-9]{{1,9}}|-) ({_HEX64}) ({_HEX64})$"
)
_PROOF = re.compile(rf"^OK ({_HEX64})$")
_BUSY = "BUSY"
_REFUSED = re.compile(r"^REFUSED ([a-z][a-z ]{0,60})$")


class HandshakeError(Exception):
    """The other end is not (or cannot prove it is) this job's controller or agent."""


class TokenMismatch(HandshakeError):
    """A well-formed answer whose mac is not under this job's token."""


class Busy(HandshakeError):
    """The controller had no room for this connection: the agent may try again."""


class Refused(HandshakeError):
    """The controller refused this agent's answer: trying again would change nothing."""


@dataclass(frozen=True)
class Answer:
    """Who connected: its node name, its Slurm task id (None outside a step), its nonce."""

    node: str
    task: int | None
    nonce: str


def new_nonce() -> str:
    return secrets.token_hex(32)


def _mac(token: str, *parts: str) -> str:
    return hmac.new(token.encode(), "|".join(parts).encode(), hashlib.sha256).hexdigest()


def challenge_line(nonce: str) -> bytes:
    return f"ZLAUNCH-CONNECT {VERSION} {nonce}\n".encode()


def busy_line() -> bytes:
    return f"{_BUSY}\n".encode()


def refusal_line(reason: str) -> bytes:
    """``reason``: a fixed phrase of the controller's (lower-case words), never peer bytes."""
    if not re.fullmatch(r"[a-z][a-z ]{0,60}", reason):
        raise ValueError(f"a refusal reason is a short lower-case phrase, got {reason!r}")
    return f"REFUSED {reason}\n".encode()


def _controller_said_no(text: str) -> None:
    """BUSY or REFUSED in place of the controller's greeting or proof."""
    if text == _BUSY:
        raise Busy("the controller had no room for this connection")
    refused = _REFUSED.match(text)
    if refused:
        raise Refused(f"the controller refused this agent: {refused.group(1)}")


def read_challenge(line: bytes) -> str:
    """The controller's nonce from its first line."""
    match = _CHALLENGE.match(_text(line))
    if match is None:
        _controller_said_no(_text(line))
        raise HandshakeError(f"not a zlaunch controller's greeting: {_shown(line)}")
    return match.group(1)


def answer_line(token: str, challenge: str, nonce: str, node: str, task: int | None) -> bytes:
    task_text = "-" if task is None else str(task)
    mac = _mac(token, "agent", challenge, nonce, node, task_text)
    return f"AGENT {node} {task_text} {nonce} {mac}\n".encode()


def check_answer(token: str, challenge: str, line: bytes) -> Answer:
    """The agent's answer to ``challenge``, or HandshakeError saying what was wrong with it."""
    match = _ANSWER.match(_text(line))
    if match is None:
        raise HandshakeError(f"not a zlaunch agent's answer: {_shown(line)}")
    node, task_text, nonce, mac = match.groups()
    if not hmac.compare_digest(mac, _mac(token, "agent", challenge, nonce, node, task_text)):
        raise TokenMismatch(f"an agent claiming to be on {node} does not hold this job's token")
    return Answer(node, None if task_text == "-" else int(task_text), nonce)


def proof_line(token: str, challenge: str, answer: Answer) -> bytes:
    return f"OK {_mac(token, 'controller', challenge, answer.nonce, answer.node)}\n".encode()


def check_proof(token: str, challenge: str, nonce: str, node: str, line: bytes) -> None:
    """The controller's last line proves it holds the token, or HandshakeError."""
    match = _PROOF.match(_text(line))
    if match is None:
        _controller_said_no(_text(line))
        raise HandshakeError(f"the controller refused this agent: {_shown(line)}")
    if not hmac.compare_digest(match.group(1), _mac(token, "controller", challenge, nonce, node)):
        raise HandshakeError("whoever answered on the controller's port does not hold the token")


def recv_line(sock: socket.socket, deadline: float) -> bytes:
    """One line (without its newline) from ``sock`` by ``deadline`` (monotonic), reading nothing
    past it: what follows belongs to the frames. HandshakeError on EOF, a line over MAX_LINE or
    the deadline."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HandshakeError("no handshake line in time")
        sock.settimeout(left)
        try:
            seen = sock.recv(MAX_LINE + 1, socket.MSG_PEEK)
        except TimeoutError:
            raise HandshakeError("no handshake line in time") from None
        except OSError as err:
            raise HandshakeError(f"connection failed during the handshake: {err}") from None
        if not seen:
            raise HandshakeError("connection closed during the handshake")
        end = seen.find(b"\n")
        if end >= 0:
            line = _recv_exactly(sock, end + 1)
            return line[:-1]
        if len(seen) > MAX_LINE:
            raise HandshakeError(f"handshake line longer than {MAX_LINE} bytes")
        # Part of a line so far: wait for more without spinning on the same peeked bytes.
        time.sleep(0.01)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise HandshakeError("connection closed during the handshake")
        data += chunk
    return data


def _text(line: bytes) -> str:
    return line.decode("ascii", "replace").rstrip("\r")


def _shown(line: bytes) -> str:
    text = repr(line[:60])
    return text + ("..." if len(line) > 60 else "")
