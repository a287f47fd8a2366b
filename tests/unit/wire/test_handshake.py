"""The connect-back handshake's lines and checks (zlaunch/wire/handshake.py), without sockets:
both sides prove the token, a wrong token or garbage is refused with a reason, and nothing one
connection says can be replayed on another."""

from __future__ import annotations

import pytest

from zlaunch.agent.connect import ConnectFailed, node_identity, parse_address
from zlaunch.wire import handshake as hs

TOKEN = "a" * 64


def _exchange(agent_token=TOKEN, controller_token=TOKEN, node="node7", task=6):
    challenge = hs.new_nonce()
    greeting = hs.challenge_line(challenge)
    seen = hs.read_challenge(greeting.rstrip(b"\n"))
    nonce = hs.new_nonce()
    answer_line = hs.answer_line(agent_token, seen, nonce, node, task)
    answer = hs.check_answer(controller_token, challenge, answer_line.rstrip(b"\n"))
    proof = hs.proof_line(controller_token, challenge, answer)
    hs.check_proof(agent_token, seen, nonce, node, proof.rstrip(b"\n"))
    return answer, nonce


def test_both_sides_holding_the_token_agree_on_who_connected():
    answer, nonce = _exchange()
    assert answer == hs.Answer("node7", 6, nonce)


def test_outside_a_step_the_task_is_none():
    answer, _ = _exchange(task=None)
    assert answer.task is None


def test_an_agent_with_a_wrong_token_is_refused_naming_its_node():
    with pytest.raises(hs.HandshakeError, match="claiming to be on node7 does not hold"):
        _exchange(agent_token="b" * 64)


def test_the_token_never_crosses_the_wire():
    challenge, nonce = hs.new_nonce(), hs.new_nonce()
    line = hs.answer_line(TOKEN, challenge, nonce, "node1", 0)
    assert TOKEN.encode() not in line


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"GET / HTTP/1.1",
        b"AGENT node1 0",
        b"AGENT node1 0 " + b"0" * 64 + b" " + b"0" * 63,  # short mac
        b"AGENT no/de 0 " + b"0" * 64 + b" " + b"0" * 64,  # not a node name
        b"AGENT node1 x " + b"0" * 64 + b" " + b"0" * 64,  # not a task id
        b"\xff\xfe" * 100,
    ],
)
def test_garbage_is_not_an_agent_answer(line):
    with pytest.raises(hs.HandshakeError, match="not a zlaunch agent's answer"):
        hs.check_answer(TOKEN, hs.new_nonce(), line)


def test_an_answer_to_another_challenge_is_refused():
    # a recorded answer replayed on a new connection: the new challenge differs
    old = hs.new_nonce()
    line = hs.answer_line(TOKEN, old, hs.new_nonce(), "node1", 0).rstrip(b"\n")
    with pytest.raises(hs.HandshakeError, match="does not hold"):
        hs.check_answer(TOKEN, hs.new_nonce(), line)


def test_an_answer_claiming_another_node_is_refused():
    challenge, nonce = hs.new_nonce(), hs.new_nonce()
    line = hs.answer_line(TOKEN, challenge, nonce, "node1", 0).rstrip(b"\n")
    forged = line.replace(b"AGENT node1", b"AGENT node2")
    with pytest.raises(hs.HandshakeError, match="claiming to be on node2"):
        hs.check_answer(TOKEN, challenge, forged)


def test_the_agent_refuses_a_controller_without_the_token():
    # whoever took the port after the controller died cannot hand the agent a spec
    challenge, nonce = hs.new_nonce(), hs.new_nonce()
    wrong = hs.proof_line("c" * 64, challenge, hs.Answer("node1", 0, nonce)).rstrip(b"\n")
    with pytest.raises(hs.HandshakeError, match="does not hold the token"):
        hs.check_proof(TOKEN, challenge, nonce, "node1", wrong)


def test_the_agent_cannot_pass_its_own_mac_off_as_the_controllers():
    challenge, nonce = hs.new_nonce(), hs.new_nonce()
    answer = hs.answer_line(TOKEN, challenge, nonce, "node1", 0).split()[-1]
    with pytest.raises(hs.HandshakeError, match="does not hold the token"):
        hs.check_proof(TOKEN, challenge, nonce, "node1", b"OK " + answer)


@pytest.mark.parametrize("line", [b"", b"SSH-2.0-OpenSSH_9.6", b"ZLAUNCH-CONNECT 2 " + b"0" * 64])
def test_the_agent_refuses_a_greeting_that_is_not_zlaunchs(line):
    with pytest.raises(hs.HandshakeError, match="not a zlaunch controller's greeting"):
        hs.read_challenge(line)


def test_a_refusal_shows_the_peer_bytes_escaped_and_clipped():
    with pytest.raises(hs.HandshakeError) as err:
        hs.check_answer(TOKEN, hs.new_nonce(), b"\x1b[2J" + b"x" * 200)
    assert "\x1b" not in str(err.value) and str(err.value).endswith("...")


@pytest.mark.parametrize(
    ("text", "address"),
    [("10.0.0.5:4000", ("10.0.0.5", 4000)), ("[fd00::1]:4000", ("fd00::1", 4000)),
     ("login1:65535", ("login1", 65535))],
)  # fmt: skip
def test_connect_addresses(text, address):
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["10.0.0.5", ":4000", "host:0", "host:70000", "host:port"])
def test_bad_connect_addresses_are_refused(text):
    with pytest.raises(ConnectFailed, match="expected HOST:PORT"):
        parse_address(text)


def test_the_agent_names_itself_as_slurm_does():
    assert node_identity({"SLURMD_NODENAME": "gpu-a001", "SLURM_PROCID": "12"}) == ("gpu-a001", 12)
    name, task = node_identity({})
    assert name and task is None
