"""``--slow-node``: what a host that stays slow does to the job (pure: names in, words out).

``warn`` (the default): the live scores name it (zlaunch/launcher/stragglers.py) and nothing
else happens. ``exclude``: once the scores say a host is slow (its ranks' own step time at
``DEFAULT_THRESHOLD`` of the fleet's median or more for ``DEFAULT_SUSTAIN`` windows of
``DEFAULT_WINDOW`` steps), it is taken out as a preempted host is (zlaunch/launcher/fleet_state.py):
every rank saves at its next step boundary, and the next attempt runs without it (a spare in its
place when the hostfile lists one), from that checkpoint, with the global batch kept. It stays
in the job, as with ``warn``, when taking it out would leave fewer hosts than --min-nodes or
when no save is possible: a slow job is better than a lost one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from zlaunch.launcher.fleet_state import NoticeAnswer
from zlaunch.launcher.stragglers import Finding

__all__ = ["SLOW_NODE_MODES", "slow_why", "why_kept", "slow_out_words", "slow_kept_words"]

SLOW_NODE_MODES = ("warn", "exclude")


def slow_why(finding: Finding, steps: int) -> str:
    """The figure a host is taken out for: ``1.38x the median step for 30 steps``."""
    who = f"rank {finding.rank}: " if finding.rank is not None else ""
    return f"{who}{finding.factor:.2f}x the median step for {steps} steps"


def why_kept(
    host: str, hosts: Sequence[str], spares: int, leaving: Collection[str], min_nodes: int
) -> str | None:
    """Why ``host`` of an attempt on ``hosts`` cannot be taken out (None: it can). ``leaving``:
    the hosts the attempt's change takes out already; ``spares``: hosts that may take their
    places (listed beyond --num-nodes and unused)."""
    out = set(leaving) | {host}
    left = sum(1 for h in hosts if h not in out)
    after = left + min(spares, len(out & set(hosts)))
    if after < min_nodes:
        return f"taking it out would leave {after} host(s), fewer than --min-nodes {min_nodes}"
    return None


def slow_out_words(host: str, why: str, answer: NoticeAnswer) -> str:
    """What the console says when a slow host is taken out, by what the attempt does."""
    head = f"{host} stays slow ({why}); --slow-node exclude takes it out"
    if answer is NoticeAnswer.SAVE:
        return head + ": every rank saves at its next step, then the job goes on without it"
    if answer is NoticeAnswer.JOIN_SAVE:
        return head + " with the change under way"
    return head + ": the next attempt runs without it"


def slow_kept_words(host: str, why: str, reason: str) -> str:
    return f"{host} stays slow ({why}) but stays in the job: {reason} (going on as with --slow-node warn)"
