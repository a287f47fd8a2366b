"""What the connect-back listener keeps of connections that have not proven the token
(zlaunch/transport/preauth.py, zlaunch/transport/roster.py), and the agent's tries against a
scripted controller: a deadline from accept, one line of room, the oldest shed first, a tally
instead of a line per stranger, and an agent that is shed trying again while a refused one
gives up."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from zlaunch.agent import connect
from zlaunch.agent.connect import ConnectFailed, connect_back
from zlaunch.job.hostfile import Host
from zlaunch.transport.preauth import PendingPeers, Refusal, RefusalTally
from zlaunch.transport.roster import HostRoster
from zlaunch.wire import handshake as hs
from zlaunch.wire import protocol

TOKEN = "a" * 64


def _peers(cap=3, timeout=10.0, accepted=(0.0, 1.0, 2.0)):
    peers = PendingPeers(cap, timeout)
    for key, at in enumerate(accepted):
        peers.add(key, object(), f"10.0.0.{key}:4000", "c" * 64, at)
    return peers


def test_a_peers_deadline_counts_from_its_accept():
    peers = _peers()
    assert peers.next_deadline() == 10.0
    assert peers.expired(9.999) == []
    # however late the listener looks, each peer had its own ten seconds, no more
    assert [e.key for e in peers.expired(11.0)] == [0, 1]
    assert len(peers) == 1 and peers.next_deadline() == 12.0


def test_the_oldest_peer_is_the_one_shed_and_the_cap_only_shrinks():
    peers = _peers()
    assert peers.full and peers.oldest().key == 0
    peers.remove(0)
    assert not peers.full and peers.oldest().key == 1
    peers.shrink_to(1)
    assert peers.cap == 1 and peers.full
    peers.shrink_to(0)  # never below one: the wait must still take an agent
    assert peers.cap == 1
    peers.shrink_to(50)
    assert peers.cap == 1
    with pytest.raises(ValueError, match="pending already"):
        peers.add(1, object(), "x:1", "c" * 64, 3.0)


def test_an_answer_line_may_arrive_in_pieces():
    peers = _peers()
    entry = peers.oldest()
    assert peers.feed(entry, b"AGENT node1 ") is None
    assert peers.feed(entry, b"0 abc\n") == b"AGENT node1 0 abc"


def test_no_more_than_one_line_is_read_from_a_peer():
    peers = _peers()
    entry = peers.oldest()
    assert peers.room(entry) == hs.MAX_LINE + 1
    assert peers.feed(entry, b"x" * hs.MAX_LINE) is None
    assert peers.room(entry) == 1
    with pytest.raises(hs.HandshakeError, match=f"longer than {hs.MAX_LINE} bytes"):
        peers.feed(entry, b"x")
    other = list(peers)[1]
    assert peers.feed(other, b"AGENT a\nframes") == b"AGENT a"  # the line is judged first
    with pytest.raises(hs.HandshakeError, match="more than its answer"):
        peers.check_alone(other)
    peers.check_alone(list(peers)[2])  # nothing sent: nothing past a line


def test_refusals_are_told_in_full_three_times_then_counted():
    told: list[str] = []
    tally = RefusalTally(told.append)
    for i in range(3):
        tally.refused(Refusal.NOT_AN_AGENT, f"10.0.0.9:{4000 + i}", f"garbage {i}")
    assert tally.summary() is None
    for i in range(5):
        tally.refused(Refusal.SHED, f"10.0.0.{i % 2}:5000", "shed")
    tally.refused(Refusal.WRONG_TOKEN, "[fd00::7]:6000", "token")
    assert told[:3] == ["garbage 0", "garbage 1", "garbage 2"]
    assert len(told) == 4 and "a count follows" in told[3]
    assert tally.summary() == (
        "refused 9 connections on the agents' port while they connected back (5 shed to make "
        "room for newer connections, 3 not a zlaunch agent, 1 without this job's token); from "
        "10.0.0.9 (3), 10.0.0.0 (3), 10.0.0.1 (2) and 1 more address"
    )


def test_a_condition_is_noted_once():
    told: list[str] = []
    tally = RefusalTally(told.append)
    tally.note_once("out of descriptors")
    tally.note_once("out of descriptors")
    assert told == ["out of descriptors"]


def test_the_roster_places_each_host_once_by_name():
    roster = HostRoster([Host("gpu1.example", (0,)), Host("gpu2.example", (0,))])
    answer = hs.Answer("gpu2", 1, "n" * 64)
    assert roster.place(answer) == 1
    assert roster.missing() == [0, 1]  # placing changes nothing until the agent is in
    roster.joined(1)
    assert roster.place(answer) is Refusal.TWICE
    assert roster.place(hs.Answer("gpu9", 0, "n" * 64)) is Refusal.NOT_A_NODE
    assert roster.missing() == [0]


def test_busy_and_refused_in_place_of_the_controllers_lines():
    with pytest.raises(hs.Busy):
        hs.read_challenge(hs.busy_line().rstrip(b"\n"))
    with pytest.raises(hs.Busy):
        hs.check_proof(TOKEN, "c" * 64, "n" * 64, "node1", b"BUSY")
    with pytest.raises(hs.Refused, match="the controller refused this agent: wrong token"):
        hs.check_proof(TOKEN, "c" * 64, "n" * 64, "node1", hs.refusal_line("wrong token")[:-1])
    # a refusal carries a phrase of the controller's, never bytes a peer could have sent
    with pytest.raises(ValueError):
        hs.refusal_line("b'\\x1b[2J'")


# ---- the agent's tries against a scripted controller ----------------------------------------


def _controller(script: list[str]):
    """A listening socket whose n-th connection is handled as ``script[n]`` says: ``busy``
    (BUSY at once), ``shed`` (greeting, then BUSY after the answer), ``drop`` (closed without
    a word), ``refuse`` (greeting, then REFUSED), ``ok`` (the real handshake)."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def serve():
        for step in script:
            try:
                conn, _ = server.accept()
            except OSError:  # the test is over and closed the port
                return
            seen.append(step)
            with conn:
                if step == "busy":
                    conn.sendall(hs.busy_line())
                    continue
                if step == "drop":
                    continue
                challenge = hs.new_nonce()
                try:
                    conn.sendall(hs.challenge_line(challenge))
                    line = hs.recv_line(conn, time.monotonic() + 10)
                except (OSError, hs.HandshakeError):  # the agent ran out of time meanwhile
                    continue
                if step == "shed":
                    conn.sendall(hs.busy_line())
                elif step == "refuse":
                    conn.sendall(hs.refusal_line("not a node of this job"))
                else:
                    answer = hs.check_answer(TOKEN, challenge, line)
                    conn.sendall(hs.proof_line(TOKEN, challenge, answer))
                    conn.sendall(b"frames")
                    conn.recv(1)  # held open until the agent closes its end

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, seen, thread


def _environ():
    return {protocol.CONNECT_TOKEN_ENV: TOKEN, "SLURMD_NODENAME": "node1"}


def test_an_agent_that_finds_no_room_tries_again_until_it_is_in(monkeypatch):
    monkeypatch.setattr(connect, "RETRY_FIRST", 0.001)
    server, seen, thread = _controller(["busy", "shed", "drop", "ok"])
    address = f"127.0.0.1:{server.getsockname()[1]}"
    sock = connect_back(address, _environ(), deadline_s=20)
    assert sock.recv(6) == b"frames"  # the handshake read to its last byte, nothing past it
    sock.close()
    thread.join(5)
    server.close()
    assert seen == ["busy", "shed", "drop", "ok"]


def test_a_refused_agent_gives_up_at_once_saying_why():
    server, seen, thread = _controller(["refuse", "ok"])
    address = f"127.0.0.1:{server.getsockname()[1]}"
    with pytest.raises(ConnectFailed, match="refused this agent: not a node of this job"):
        connect_back(address, _environ(), deadline_s=20)
    server.close()
    assert seen == ["refuse"]


def test_an_agent_stops_trying_at_its_deadline_naming_the_tries(monkeypatch):
    monkeypatch.setattr(connect, "RETRY_FIRST", 0.001)
    monkeypatch.setattr(connect, "RETRY_MAX", 0.001)
    server, seen, _ = _controller(["busy"] * 10_000)
    address = f"127.0.0.1:{server.getsockname()[1]}"
    with pytest.raises(ConnectFailed, match=r"could not get in to the controller at .* in 0 s "
                       r"\([0-9]+ tries; the last: "):  # fmt: skip
        connect_back(address, _environ(), deadline_s=0.3)
    server.close()
    assert len(seen) >= 2


def test_nobody_listening_ends_the_tries_at_once():
    free = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{free.getsockname()[1]}"
    free.close()
    with pytest.raises(ConnectFailed, match="Connection refused"):
        connect_back(address, _environ(), deadline_s=30)
