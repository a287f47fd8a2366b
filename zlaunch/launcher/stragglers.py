"""Which hosts and ranks hold a job back, from plain per-step numbers (pure: no clock, no I/O).

In: one sample per rank and step, ``(rank, step, seconds, waited)``, where the seconds are the
rank's *own* time of the step (not the time it spent waiting for its peers in collectives: in a
synchronous job every rank's wall-clock step is the same, the slow rank's peers spend its extra
time waiting) and ``waited`` is that waiting (None where the rank does not say). Out: scores, and a `Finding` said once when a host (or a lone rank)
stays slow for a sustained window, and once when it recovers; nothing while the fleet is even.

How it scores:

- Steps are cut into windows of ``window`` steps. A window is scored when every rank has
  reported a later step (or, so that a rank that stopped reporting cannot hold the scores
  back, when most ranks are ``lag`` windows past it); a rank is scored by the mean of its samples
  in the window less the largest fifth (`window_figure`), so one or two slow steps of ten (a
  checkpoint, a page fault) move nothing. Not the median: a host throttled by a CPU quota
  (CFS: a share of every 100 ms period) stalls in bursts, in a part of the steps only, and the
  median of ten steps of which four stalled is a healthy step.
- *relative* score: the rank's window figure over the fleet's median of them. A host's is the
  median of its ranks' over the same fleet median: a host of eight slow ranks reads as one
  slow host, not eight findings.
- *corroborated*: a host (or rank) counts as slow in a window only when its peers were seen
  waiting for it: the fleet's median wait per step less its own is at least half its own time
  beyond the fleet's median (``CORROBORATION``). In a synchronous job the two are the same
  time seen from both sides; a rank whose own time is long while its peers did not wait for
  it cannot be told apart from noise (its step boundaries drifted, its clock was disturbed),
  and it is named nobody. Ranks that do not say their waits are scored on their own time.
- *individual* score: the rank's window figure over its own best (lowest) window so far: a
  whole fleet that slows down together (a shared filesystem, thermal limits everywhere) shows
  here and not in the relative score.
- sustained: a host whose relative score is at least ``threshold`` in ``sustain`` windows in a
  row is said once ("slow: node7 at 1.38x the median step, ranks 56-63"); once it is below the
  threshold for ``sustain`` windows in a row, its recovery is said once. A rank that is slow
  on a host that is not (one bad device of eight) is followed the same way, on its own.

The table of cases is tests/unit/launcher/test_stragglers.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from zlaunch.text import host_ranges, rank_ranges

__all__ = [
    "DEFAULT_THRESHOLD",
    "DEFAULT_WINDOW",
    "DEFAULT_SUSTAIN",
    "MAX_CHARS",
    "Finding",
    "HostScore",
    "Scores",
    "StragglerWatch",
    "slow_text",
    "window_figure",
]

DEFAULT_THRESHOLD = 1.25
"""A host is slow at this factor of the fleet's median step or more: above the few percent
ranks differ by on even hardware, well below a throttled device (2x and more)."""
DEFAULT_WINDOW = 10
"""Steps per scored window: the figure of ten steps is not moved by one or two slow steps."""
TRIM = 0.2
"""The largest fifth of a window's samples is left out of its figure (2 of 10 steps)."""
CORROBORATION = 0.5
"""Of a slow rank's own time beyond the median, the part its peers must be seen waiting."""
DEFAULT_SUSTAIN = 3
"""Windows in a row before a host is said to be slow (or recovered): 30 steps by default."""
DEFAULT_LAG = 2
"""Windows open past the oldest before it is scored without the ranks that did not report."""
_LIST_CHARS = 60
MAX_CHARS = 200
"""`slow_text` is at most this long (a metrics row's text field: zlaunch/wire/metrics_check.py)."""


@dataclass(frozen=True)
class HostScore:
    """One host in one window: its ranks, its relative score, its ranks' worst individual one."""

    host: str
    ranks: tuple[int, ...]
    relative: float
    individual: float


@dataclass(frozen=True)
class Scores:
    """One scored window: steps ``first``..``last``, the fleet's median of the ranks' window
    figures (seconds), every rank's relative and individual score, every host's score."""

    first: int
    last: int
    median: float
    relative: Mapping[int, float]
    individual: Mapping[int, float]
    hosts: tuple[HostScore, ...]
    """Slowest first."""
    waited: Mapping[int, float] = field(default_factory=dict)
    """Every rank's window figure of its waits (seconds), where every rank said them."""
    uncorroborated: tuple[str, ...] = ()
    """Hosts (and ``host:rank``) at the threshold whose peers were not seen waiting for them."""

    @property
    def spread(self) -> float:
        """The slowest host's relative score (1.0 on an even fleet)."""
        return self.hosts[0].relative if self.hosts else 1.0


@dataclass(frozen=True)
class Finding:
    """A host (``rank`` None) or a lone rank that became slow (``slow``) or recovered."""

    host: str
    ranks: tuple[int, ...]
    factor: float
    """Its relative score in the window that decided it."""
    step: int
    """The last step of that window."""
    slow: bool
    rank: int | None = None

    @property
    def text(self) -> str:
        if not self.slow:
            who = f"rank {self.rank} on {self.host}" if self.rank is not None else self.host
            return f"{who} no longer slow: {self.factor:.2f}x the median step (step {self.step})"
        return slow_text([self])


def window_figure(values: Sequence[float]) -> float:
    """The mean of a window's samples without the largest fifth of them (`TRIM`)."""
    ordered = sorted(values)
    keep = len(ordered) - int(len(ordered) * TRIM)
    return statistics.fmean(ordered[:keep])


def slow_text(findings: Sequence[Finding]) -> str:
    """The slow hosts and ranks in one line, slowest first, bounded at any fleet size:
    ``slow: node7 at 1.38x the median step, ranks 56-63``."""
    slow = sorted((f for f in findings if f.slow), key=lambda f: -f.factor)
    if not slow:
        return ""
    lone = [f for f in slow if f.rank is not None]
    hosts = [f for f in slow if f.rank is None]
    parts = []
    if hosts:
        parts.append(_group_text(hosts, host_ranges([f.host for f in hosts], limit=_LIST_CHARS)))
    if lone:
        ranks = [f.rank for f in lone if f.rank is not None]
        label = "rank" if len(ranks) == 1 else "ranks"
        on = host_ranges([f.host for f in lone], limit=_LIST_CHARS)
        parts.append(_group_text(lone, f"{label} {rank_ranges(ranks, limit=_LIST_CHARS)} on {on}"))
    text = "slow: " + "; ".join(parts)
    if len(text) > MAX_CHARS and hosts and lone:  # the hosts, and how many ranks besides
        text = f"slow: {parts[0]}; and {len(lone)} ranks on other hosts"
    return text


def _group_text(findings: Sequence[Finding], who: str) -> str:
    top, low = findings[0].factor, findings[-1].factor
    factor = f"{top:.2f}x" if len(findings) == 1 else f"{low:.2f}-{top:.2f}x"
    text = f"{who} at {factor} the median step"
    if findings[0].rank is None:
        ranks = [r for f in findings for r in f.ranks]
        text += f", {'rank' if len(ranks) == 1 else 'ranks'} {rank_ranges(ranks, _LIST_CHARS)}"
    return text


@dataclass
class _Streak:
    """How many windows in a row a subject was on the other side of the threshold."""

    slow: bool = False
    count: int = 0


class StragglerWatch:
    """The scores of one attempt. ``hosts``: each rank's host (every rank of the attempt).

    `add` takes a sample and returns the findings of the windows it closed (usually none);
    `scores` is the last scored window; `slow` what is slow now."""

    def __init__(
        self,
        hosts: Mapping[int, str],
        threshold: float = DEFAULT_THRESHOLD,
        window: int = DEFAULT_WINDOW,
        sustain: int = DEFAULT_SUSTAIN,
        lag: int = DEFAULT_LAG,
    ) -> None:
        if threshold <= 1.0:
            raise ValueError(f"threshold {threshold!r} must be above 1.0 (a factor of the median)")
        if window < 1 or sustain < 1 or lag < 1:
            raise ValueError("window, sustain and lag must be at least 1")
        self.hosts = dict(hosts)
        self.threshold = threshold
        self.window = window
        self.sustain = sustain
        self.lag = lag
        self._by_host: dict[str, tuple[int, ...]] = {}
        for rank, host in sorted(self.hosts.items()):
            self._by_host[host] = (*self._by_host.get(host, ()), rank)
        self._open: dict[int, dict[int, list[float]]] = {}  # window -> rank -> seconds
        self._waits: dict[int, dict[int, list[float]]] = {}  # window -> rank -> seconds waited
        self._latest: dict[int, int] = {}  # rank -> the newest window it reported in
        self._at: dict[int, int] = {}  # window -> how many ranks' newest it is
        self._scored = -1  # windows up to this one are scored (or dropped)
        self._best: dict[int, float] = {}
        self._streaks: dict[tuple[str, int | None], _Streak] = {}
        self._slow: dict[tuple[str, int | None], Finding] = {}
        self._ever_said = False
        self.scores: Scores | None = None

    @property
    def said(self) -> bool:
        """Whether a host or rank was ever said to be slow in this attempt."""
        return self._ever_said

    @property
    def slow(self) -> tuple[Finding, ...]:
        """What is slow now (said and not yet recovered), slowest first."""
        return tuple(sorted(self._slow.values(), key=lambda f: -f.factor))

    def add(
        self, rank: int, step: int, seconds: float, waited: float | None = None
    ) -> list[Finding]:
        """One rank's own time of one step, and the time it waited for its peers in it (None:
        not said; a wait that is not a finite number at least 0 counts as not said). A sample of an unknown rank, of a window already
        scored, or that is not a positive finite number is ignored (it cannot be scored); so
        is one more than ``lag`` windows ahead of where most ranks are (a rank that sends a
        wrong step moves no window of the others)."""
        if rank not in self.hosts or not (0.0 < seconds < float("inf")) or step < 0:
            return []
        index = step // self.window
        fleet = self._fleet_window()
        if index <= self._scored or (fleet is not None and index > fleet + self.lag):
            return []
        self._open.setdefault(index, {}).setdefault(rank, []).append(seconds)
        if waited is not None and 0.0 <= waited < float("inf"):
            self._waits.setdefault(index, {}).setdefault(rank, []).append(waited)
        before = self._latest.get(rank)
        if before is None or index > before:
            self._latest[rank] = index
            self._at[index] = self._at.get(index, 0) + 1
            if before is not None:
                self._at[before] -= 1
                if not self._at[before]:
                    del self._at[before]
        return self._close()

    def _close(self) -> list[Finding]:
        findings: list[Finding] = []
        while self._open:
            oldest = min(self._open)
            # every rank has reported a later window (counted per window: 1,024 ranks)
            everyone_past = len(self._latest) == len(self.hosts) and min(self._at) > oldest
            fleet = self._fleet_window()
            if not everyone_past and (fleet is None or fleet - oldest < self.lag):
                break
            findings += self._score(oldest, self._open.pop(oldest), self._waits.pop(oldest, {}))
            self._scored = oldest
        return findings

    def _fleet_window(self) -> int | None:
        """The newest window at least half the ranks have reached (None before half reported):
        where the fleet is, whatever one rank says."""
        need = (len(self.hosts) + 1) // 2
        count = 0
        for index in sorted(self._at, reverse=True):
            count += self._at[index]
            if count >= need:
                return index
        return None

    def _score(
        self, index: int, samples: dict[int, list[float]], waits: dict[int, list[float]]
    ) -> list[Finding]:
        if not samples:
            return []
        own = {rank: window_figure(values) for rank, values in samples.items()}
        median = statistics.median(own.values())
        # waits count only where every scored rank said one for each of its samples
        said = all(len(waits.get(r, ())) == len(v) for r, v in samples.items())
        waited = {r: window_figure(waits[r]) for r in samples} if said else {}
        median_wait = statistics.median(waited.values()) if waited else 0.0
        uncorroborated: list[str] = []

        def corroborated(name: str, ranks: Sequence[int], figure: float) -> bool:
            """Its peers were seen waiting for it (or nobody said waits: its own time decides)."""
            if not waited or figure < self.threshold * median:
                return True
            wait = statistics.median(waited[r] for r in ranks)
            if median_wait - wait >= CORROBORATION * (figure - median):
                return True
            uncorroborated.append(name)
            return False

        relative = {rank: value / median for rank, value in own.items()}
        individual = {}
        for rank, value in own.items():
            self._best[rank] = min(self._best.get(rank, value), value)
            individual[rank] = value / self._best[rank]
        hosts = []
        for host, ranks in self._by_host.items():
            seen = [r for r in ranks if r in own]
            if seen:
                hosts.append(
                    HostScore(
                        host,
                        tuple(seen),
                        statistics.median(own[r] for r in seen) / median,
                        max(individual[r] for r in seen),
                    )
                )
        hosts.sort(key=lambda h: (-h.relative, h.host))
        last = (index + 1) * self.window - 1
        findings = []
        for score in hosts:
            figure = score.relative * median
            slow = corroborated(score.host, score.ranks, figure)
            findings += self._judge((score.host, None), score.relative, score.ranks, last, slow)
            if score.relative < self.threshold:
                for rank in score.ranks:
                    slow = corroborated(f"{score.host}:{rank}", (rank,), own[rank])
                    findings += self._judge((score.host, rank), relative[rank], (rank,), last, slow)
            else:  # the host is followed as a whole: its ranks are not followed apart
                for rank in score.ranks:
                    self._drop((score.host, rank))
        self.scores = Scores(
            index * self.window, last, median, relative, individual, tuple(hosts),
            waited, tuple(uncorroborated),
        )  # fmt: skip
        return findings

    def _judge(
        self,
        key: tuple[str, int | None],
        factor: float,
        ranks: tuple[int, ...],
        step: int,
        corroborated: bool = True,
    ) -> list[Finding]:
        slow = factor >= self.threshold and corroborated
        streak = self._streaks.setdefault(key, _Streak())
        if slow == streak.slow:
            streak.count += 1
        else:
            streak.slow, streak.count = slow, 1
        said = key in self._slow
        if streak.count < self.sustain or slow == said:
            if said and slow:  # still slow: keep its figure current for the panel
                self._slow[key] = Finding(key[0], ranks, factor, step, True, key[1])
            return []
        finding = Finding(key[0], ranks, factor, step, slow, key[1])
        if slow:
            self._slow[key] = finding
            self._ever_said = True
        else:
            del self._slow[key]
        return [finding]

    def _drop(self, key: tuple[str, int | None]) -> None:
        self._streaks.pop(key, None)
        self._slow.pop(key, None)
