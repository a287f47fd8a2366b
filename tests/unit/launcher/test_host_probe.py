"""zlaunch.launcher.host_probe: when a candidate host is probed (the backoff), which hosts are
candidates (lost, spares, new in the hostfile), and that a probe's wait never blocks the
job's side."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from zlaunch.job import Host
from zlaunch.launcher.host_probe import (
    MAX_PARALLEL_PROBES,
    Backoff,
    HostfileWatch,
    HostProber,
)


def host(name: str, slots: int = 1) -> Host:
    return Host(name, tuple(range(slots)))


# ---- the backoff ------------------------------------------------------------------------------


def test_a_candidate_is_probed_first_after_the_first_wait_then_doubling_to_the_cap():
    backoff = Backoff(first=2.0, cap=10.0)
    backoff.add("node3", now=100.0)
    assert backoff.due(101.9) == []
    assert backoff.due(102.0) == ["node3"]
    probed_at, waits = 102.0, []
    for _ in range(5):
        assert backoff.due(probed_at + 100) == []  # in flight: never due twice
        wait = backoff.failed("node3", probed_at)
        waits.append(wait)
        assert backoff.due(probed_at + wait - 0.01) == []
        assert backoff.due(probed_at + wait) == ["node3"]
        probed_at += wait
    assert waits == [4.0, 8.0, 10.0, 10.0, 10.0]


def test_an_answer_ends_the_probing_and_a_new_loss_starts_the_wait_over():
    backoff = Backoff(first=1.0, cap=30.0)
    backoff.add("node2", now=0.0)
    assert backoff.due(1.0) == ["node2"]
    backoff.failed("node2", 1.0)  # next in 2 s
    assert backoff.due(3.0) == ["node2"]
    assert backoff.answered("node2") is True
    assert backoff.hosts == set() and backoff.due(1e9) == []
    backoff.add("node2", now=50.0)  # lost again later: first wait again, not the grown one
    assert backoff.due(50.99) == [] and backoff.due(51.0) == ["node2"]


def test_a_host_dropped_while_its_probe_runs_is_not_made_ready_nor_rescheduled():
    backoff = Backoff(first=1.0, cap=4.0)
    backoff.add("a", 0.0)
    backoff.add("b", 0.5)
    assert backoff.due(2.0) == ["a", "b"]  # in the order they fell due
    backoff.drop("a")
    backoff.drop("b")
    assert backoff.answered("a") is False
    assert backoff.failed("b", 3.0) is None
    assert backoff.hosts == set()


def test_a_backoff_needs_a_positive_first_wait_under_the_cap():
    with pytest.raises(ValueError):
        Backoff(first=0.0, cap=1.0)
    with pytest.raises(ValueError):
        Backoff(first=5.0, cap=1.0)


# ---- the prober, stepped by hand ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def settle(prober: HostProber, pool, pending) -> None:
    """Step until every submitted probe has ended and been taken in."""
    for _ in range(200):
        prober.step(pool, pending)
        if not pending:
            return
        time.sleep(0.005)
    raise AssertionError("probes did not end")


def test_lost_hosts_and_spares_are_probed_until_they_answer_and_running_hosts_never():
    clock, answers, asked = Clock(), {"node1": None, "node3": "ssh to node3 timed out"}, []

    def probe(h: Host) -> str | None:
        asked.append(h.name)
        return answers.get(h.name, None)

    prober = HostProber(probe, backoff=Backoff(first=1.0, cap=8.0), clock=clock)
    prober.list_hosts([host("node1"), host("node2"), host("node3"), host("node4")])
    prober.running([host("node1"), host("node2")])
    prober.candidate([host("node3")])  # lost: node1 and node2 run, never probed
    pending: dict = {}
    with ThreadPoolExecutor(2) as pool:
        settle(prober, pool, pending)
        assert asked == []  # nothing due before the first wait
        clock.now = 1.0
        settle(prober, pool, pending)
        assert asked == ["node3"] and prober.take_ready() == []
        clock.now = 2.9  # node3's next probe is 2 s after the failed one
        settle(prober, pool, pending)
        assert asked == ["node3"]
        answers["node3"] = None  # the link is back
        clock.now = 3.0
        settle(prober, pool, pending)
        assert asked == ["node3", "node3"]
        assert [h.name for h in prober.take_ready()] == ["node3"]
        clock.now = 100.0
        settle(prober, pool, pending)
        assert asked == ["node3", "node3"]  # ready: not probed again
        assert [h.name for h in prober.take_ready()] == ["node3"]  # stays ready
        prober.running([host("node1"), host("node2"), host("node3")])  # it joined
        assert prober.take_ready() == []
        clock.now = 200.0
        settle(prober, pool, pending)
        assert asked == ["node3", "node3"]  # in the job: not probed


def test_ready_hosts_come_in_hostfile_order():
    clock = Clock()
    prober = HostProber(lambda h: None, backoff=Backoff(first=1.0, cap=1.0), clock=clock)
    prober.list_hosts([host(n) for n in ("a", "b", "c", "d")])
    prober.running([host("a")])
    prober.candidate([host("d")])
    clock.now = 0.5
    prober.candidate([host("b")])
    pending: dict = {}
    with ThreadPoolExecutor(2) as pool:
        clock.now = 2.0
        settle(prober, pool, pending)
    assert [h.name for h in prober.take_ready()] == ["b", "d"]


def test_at_most_a_bounded_number_of_probes_run_at_once_and_the_rest_wait_their_turn():
    clock, gate, running, most = Clock(), threading.Event(), [0], [0]
    lock = threading.Lock()

    def probe(h: Host) -> str | None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(5)
        with lock:
            running[0] -= 1
        return None

    hosts = [host(f"n{i}") for i in range(MAX_PARALLEL_PROBES + 3)]
    prober = HostProber(probe, backoff=Backoff(first=1.0, cap=1.0), clock=clock)
    prober.list_hosts(hosts)
    prober.candidate(hosts)
    clock.now = 1.0
    pending: dict = {}
    with ThreadPoolExecutor(len(hosts)) as pool:
        prober.step(pool, pending)
        assert len(pending) == MAX_PARALLEL_PROBES
        gate.set()
        settle(prober, pool, pending)
    assert most[0] <= MAX_PARALLEL_PROBES
    assert {h.name for h in prober.take_ready()} == {h.name for h in hosts}


def test_a_probe_that_raises_counts_as_no_answer():
    clock = Clock()

    def probe(h: Host) -> str | None:
        raise RuntimeError("boom")

    prober = HostProber(probe, backoff=Backoff(first=1.0, cap=4.0), clock=clock)
    prober.candidate([host("x")])
    clock.now = 1.0
    pending: dict = {}
    with ThreadPoolExecutor(1) as pool:
        settle(prober, pool, pending)
    assert prober.take_ready() == []
    assert prober.backoff.next_at["x"] == pytest.approx(3.0)  # tried again, backing off


def test_the_thread_never_blocks_the_job_side_while_a_probe_hangs():
    gate = threading.Event()
    prober = HostProber(lambda h: (gate.wait(10), None)[1], backoff=Backoff(0.01, 0.01))
    prober.candidate([host("silent")])
    prober.start()
    try:
        time.sleep(0.3)  # the probe is in flight, waiting
        began = time.monotonic()
        for _ in range(100):
            prober.take_ready()
            prober.take_notes()
            prober.running([host("other")])
        assert time.monotonic() - began < 1.0  # the job's side does not wait for the probe
        gate.set()
        for _ in range(100):
            if prober.take_ready():
                break
            time.sleep(0.02)
        assert [h.name for h in prober.take_ready()] == ["silent"]
    finally:
        gate.set()
        prober.close()
    assert not prober.thread.is_alive()


# ---- the hostfile, re-read when it changes -----------------------------------------------------


def write(path, text: str) -> None:
    path.write_text(text)
    stamp = os.stat(path).st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(stamp, stamp))  # a rewrite within the clock's tick still changes


def test_hosts_added_to_the_hostfile_become_candidates_and_removed_ones_stop(tmp_path):
    path = tmp_path / "hosts"
    write(path, "node1 slots=2\nnode2 slots=2\n")
    clock = Clock()
    prober = HostProber(
        lambda h: None, HostfileWatch(str(path), slots=1), Backoff(1.0, 1.0), clock=clock
    )
    prober.list_hosts([host("node1"), host("node2")])
    prober.running([host("node1"), host("node2")])
    pending: dict = {}
    with ThreadPoolExecutor(1) as pool:
        settle(prober, pool, pending)
        assert prober.take_notes() == [] and prober.backoff.hosts == set()
        write(path, "node1 slots=2\nnode9 slots=1\nnode2 slots=2\n")
        clock.now = 10.0
        settle(prober, pool, pending)
        notes = prober.take_notes()
        assert len(notes) == 1 and "new host(s) node9:" in notes[0]
        assert prober.order() == ["node1", "node9", "node2"]  # file order
        clock.now = 11.0
        settle(prober, pool, pending)
        ready = prober.take_ready()
        assert [(h.name, h.slots) for h in ready] == [("node9", (0,))]
        write(path, "node1 slots=2\nnode2 slots=2\n")
        clock.now = 20.0
        settle(prober, pool, pending)
        assert prober.take_ready() == [] and prober.order() == ["node1", "node2"]


def test_a_hostfile_rewritten_wrong_is_said_and_the_hosts_known_stay(tmp_path):
    path = tmp_path / "hosts"
    write(path, "node1 slots=1\n")
    watch = HostfileWatch(str(path), slots=None)
    assert watch.changed() is None
    write(path, "node1 slots=banana\n")
    said = watch.changed()
    assert isinstance(said, str) and str(path) in said and "ignored" in said
    assert watch.changed() is None  # said once
    path.unlink()
    assert "is gone" in watch.changed()
    write(path, "node1 slots=4\nnode2 slots=1\n")
    assert [(h.name, len(h.slots)) for h in watch.changed()] == [("node1", 4), ("node2", 1)]


def test_a_host_with_fewer_slots_than_num_gpus_is_no_candidate(tmp_path):
    path = tmp_path / "hosts"
    write(path, "a slots=1\n")
    watch = HostfileWatch(str(path), slots=2)
    write(path, "a slots=1\nb slots=4\n")
    assert [(h.name, h.slots) for h in watch.changed()] == [("b", (0, 1))]


def test_closing_the_prober_does_not_wait_for_a_probe_still_timing_out():
    gate = threading.Event()
    prober = HostProber(lambda h: (gate.wait(30), None)[1], backoff=Backoff(0.01, 0.01))
    prober.candidate([host("blackholed")])
    prober.start()
    try:
        time.sleep(0.3)  # its probe is in flight
        began = time.monotonic()
        prober.close()
        assert time.monotonic() - began < 2.0 and not prober.thread.is_alive()
        probes = [t for t in threading.enumerate() if t.name == "probe-blackholed"]
        assert probes and all(t.daemon for t in probes)  # never joined at exit
    finally:
        gate.set()
