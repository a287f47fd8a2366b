"""A signal that arrives while a failure is being stopped: the failure stays the root cause,
and a second Ctrl-C kills at once, as the note says (the attempt's state machine)."""

from __future__ import annotations

import signal

import pytest

from tests.unit.launcher.test_job_state import running
from zlaunch.launcher.restart_policy import GiveUp, RestartPolicy
from zlaunch.launcher.state import Ending, Note, RankExited, SignalReceived, StopRanks


def failed_then_signalled(signum: int):
    machine = running()
    machine.handle(RankExited(0, 100, 3, None, ("boom",)), now=1.0)
    return machine, machine.handle(SignalReceived(int(signum)), now=1.5)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_failures_stop_keeps_the_failure_as_the_root_cause(signum):
    machine, _ = failed_then_signalled(signum)
    outcome = machine.outcome()
    assert outcome.ending == Ending.RANKS_FAILED and outcome.exit_code == 3
    assert outcome.failures[0].rank == 0 and outcome.signal_while_stopping == signum
    # the user asked to stop: the failure is reported, no restart follows
    assert isinstance(RestartPolicy(max_restarts=3, min_nodes=None).after(outcome, (), 2.0), GiveUp)


def test_ctrl_c_during_a_failures_stop_kills_at_once():
    _, actions = failed_then_signalled(signal.SIGINT)
    assert actions == [Note("killing all ranks now", error=True), StopRanks(0.0)]


def test_the_first_ctrl_c_after_sigterm_kills_as_the_note_says():
    machine = running()
    first = machine.handle(SignalReceived(int(signal.SIGTERM)), now=1.0)
    assert "Ctrl-C again to kill now" in first[0].text
    assert machine.handle(SignalReceived(int(signal.SIGINT)), now=1.1)[-1] == StopRanks(0.0)
    assert machine.outcome().exit_code == 128 + signal.SIGTERM
