"""First contact judged like liveness (zlaunch/launcher/first_contact.py): the deadline grows
with the hosts and counts from each host's own connection; an agent silent past it is probed,
named as gone only when its process no longer runs, and waited for up to the bound while it
does."""

from __future__ import annotations

import pytest

from zlaunch.launcher.first_contact import (
    FirstContact,
    Judgement,
    Verdict,
    connecting_text,
    hello_bound,
    hello_deadline,
    judge,
    progress_text,
)


@pytest.mark.parametrize(
    ("hosts", "ssh_timeout", "deadline", "bound"),
    [
        (1, 10.0, 15.0, 60.0),  # a small job: today's max(ssh timeout, 10) + 5
        (8, 10.0, 15.0, 60.0),
        (8, 3.0, 15.0, 60.0),  # a short --ssh-timeout does not shorten the start
        (8, 30.0, 35.0, 140.0),
        (9, 10.0, 15.5, 62.0),
        (64, 10.0, 43.0, 172.0),
        (218, 10.0, 120.0, 480.0),  # the deadline's cap
        (1000, 10.0, 120.0, 480.0),
        (8, 200.0, 120.0, 480.0),
        (8, 500.0, 120.0, 480.0),
    ],
)
def test_the_deadline_grows_with_the_hosts_and_is_bounded(hosts, ssh_timeout, deadline, bound):
    assert hello_deadline(hosts, ssh_timeout) == pytest.approx(deadline)
    assert hello_bound(hosts, ssh_timeout) == pytest.approx(bound)


@pytest.mark.parametrize(
    ("silent", "running", "verdict"),
    [
        (0.0, None, Verdict.WAIT),
        (14.9, False, Verdict.WAIT),  # a gone process within its deadline: its EOF says so
        (15.0, None, Verdict.PROBE),
        (15.0, False, Verdict.GONE),
        (15.0, True, Verdict.SLOW),
        (59.9, True, Verdict.SLOW),
        (59.9, False, Verdict.GONE),
        (60.0, True, Verdict.OVERDUE),
        (60.0, None, Verdict.PROBE),
        (600.0, False, Verdict.GONE),
    ],
)
def test_judge(silent, running, verdict):
    assert judge(silent, running, deadline=15.0, bound=60.0) is verdict


def _contact(hosts: int = 4) -> FirstContact:
    return FirstContact([f"h{i}" for i in range(hosts)], deadline=15.0, bound=60.0)


def test_each_host_counts_from_its_own_connection():
    contact = _contact(3)
    contact.opened(0, 100.0)
    contact.opened(1, 110.0)  # h2 has not connected yet: its transport's timeout holds
    probed = []

    def running(node):
        probed.append(node)
        return False

    assert contact.look(114.9, running) == Judgement()
    assert probed == []
    # h0 is past its deadline and gone, h1 (connected 10 s later) is still within its own
    assert contact.look(115.0, running) == Judgement(gone=(0,))
    assert probed == [0]
    assert contact.look(125.0, running) == Judgement(gone=(0, 1))


def test_a_running_agent_is_named_slow_once_then_overdue_at_the_bound():
    contact = _contact(2)
    contact.opened(0, 0.0)
    contact.opened(1, 0.0)
    contact.answered(1)
    assert contact.look(16.0, lambda node: True) == Judgement(newly_slow=(0,))
    assert contact.look(30.0, lambda node: True) == Judgement()  # said once
    # it ends while waited for: every look probes again
    assert contact.look(31.0, lambda node: False) == Judgement(gone=(0,))
    assert contact.look(60.0, lambda node: True) == Judgement(overdue=(0,))


def test_an_answered_agent_is_never_probed():
    contact = _contact(2)
    for node in (0, 1):
        contact.opened(node, 0.0)
        contact.answered(node)
    assert contact.done

    def running(node):
        raise AssertionError(f"probed {node}")

    assert contact.look(1000.0, running) == Judgement()


def test_progress_text_names_the_first_hosts_and_counts_the_rest():
    names = [f"127.0.1.{i}" for i in range(2, 30)]
    assert progress_text(36, 64, names) == (
        "agents: 36/64 answered; starting: 127.0.1.2, 127.0.1.3, 127.0.1.4, 127.0.1.5, "
        "127.0.1.6, 127.0.1.7, 127.0.1.8, 127.0.1.9 (+20)"
    )
    assert progress_text(63, 64, ["b"]) == "agents: 63/64 answered; starting: b"


def test_progress_is_quiet_for_a_fast_start_then_rate_limited():
    contact = _contact(3)
    contact.answered(1)
    assert contact.progress(1.9, started=0.0, interval=5.0) is None
    assert contact.progress(2.0, 0.0, 5.0) == "agents: 1/3 answered; starting: h0, h2"
    assert contact.progress(6.9, 0.0, 5.0) is None
    contact.answered(0)
    assert contact.progress(7.0, 0.0, 5.0) == "agents: 2/3 answered; starting: h2"
    contact.answered(2)
    assert contact.progress(20.0, 0.0, 5.0) is None  # every agent is in: nothing to say


def test_connecting_text_says_how_many_connections_are_open():
    names = [f"node{i:03d}" for i in range(97, 501)]
    assert connecting_text(96, 500, names) == (
        "agents: 96/500 connected; connecting: node097, node098, node099, node100, node101, "
        "node102, node103, node104 (+396)"
    )
