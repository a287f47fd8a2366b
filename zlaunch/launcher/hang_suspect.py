"""Which rank a hung job waits for, read from the ranks' collective records and stacks (pure).

Every rank's recent collectives (zlaunch/worker/collective_records.py: group, per-group sequence
number, operation, sizes, issued or completed) and whether it answered the stacks request
go in; the suspect ranks and a sentence saying why come out. No clock, no I/O: the table of
cases is in tests/survive/test_hang_suspect.py.

How it reads them, in the group where ranks wait (the one with the most ranks in an issued,
uncompleted collective):

- ranks wait and others do not (their last collective completed, or they did not answer):
  those others are the suspects: the waiting ranks wait for them. A rank stopped with
  SIGSTOP cannot answer, but its file says what it last did, and its peers' say whom they wait
  for.
- every rank waits, in different collectives (operation, sequence number or sizes): the ranks
  disagree on which collective comes next; the ranks apart from the largest group are the
  suspects (when no group is largest, every side is named).
- otherwise the records do not tell ranks apart: a rank that did not answer, then a rank whose
  stack stands apart from all the others', is the suspect; nobody if nothing distinguishes one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zlaunch.text import host_ranges, rank_ranges
from zlaunch.worker import collective_key

__all__ = ["Suspect", "find_suspect", "group_records", "position_words"]


@dataclass(frozen=True)
class Suspect:
    """The ranks a hang is blamed on, and why; ``ranks`` is empty when no rank stands out."""

    ranks: tuple[int, ...]
    message: str
    waiting: tuple[int, ...] = ()
    positions: dict[int, str] = field(default_factory=dict)
    """Each rank's position in words ("all_reduce #57 (waiting)"), for the report."""


def position_words(record: Mapping[str, Any] | None) -> str:
    if record is None:
        return "no collective yet"
    state = "waiting" if record["state"] == "issued" else "completed"
    return f"{record['op']} #{record['seq']} ({state})"


def _and(items: Sequence[Any]) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


SHORT_LIST = 4
"""Up to this many ranks or hosts are named one by one ("ranks 1, 2 and 3 on n1 and n2"); more
are written as ranges ("ranks 0-1019 on node[000-127]"), cut with their count when long: a
hang of a thousand ranks must stay one readable sentence."""
LIST_CHARS = 60


def _who(ranks: Sequence[int], hosts: Mapping[int, str]) -> str:
    where = sorted({hosts.get(r, "?") for r in ranks})
    label = "rank" if len(ranks) == 1 else "ranks"
    if len(ranks) > SHORT_LIST:
        who = rank_ranges(ranks, limit=LIST_CHARS)
    else:
        who = _and(sorted(ranks))
    on = host_ranges(where, limit=LIST_CHARS) if len(where) > SHORT_LIST else _and(where)
    return f"{label} {who} on {on}"


def _positions(ranks: Sequence[int], positions: Mapping[int, str]) -> str:
    """Each rank's position; ranks at the same one together when there are many."""
    if len(ranks) <= SHORT_LIST:
        return "; ".join(f"rank {r}: {positions[r]}" for r in ranks)
    at: dict[str, list[int]] = {}
    for r in ranks:
        at.setdefault(positions[r], []).append(r)
    return "; ".join(
        f"ranks {rank_ranges(rs, limit=LIST_CHARS)}: {where}"
        if len(rs) > 1
        else f"rank {rs[0]}: {where}"
        for where, rs in sorted(at.items(), key=lambda item: item[1][0])
    )


def _latest(records: Sequence[Mapping[str, Any]], group: str) -> Mapping[str, Any] | None:
    mine = [r for r in records if r.get("group") == group]
    return max(mine, key=lambda r: r["seq"]) if mine else None


def _busiest_group(records: Mapping[int, Sequence[Mapping[str, Any]]]) -> str | None:
    """The group in which most ranks wait in a collective (else the latest used)."""
    waiting: Counter[str] = Counter()
    newest: dict[str, float] = {}
    for recs in records.values():
        for group in {r["group"] for r in recs}:
            last = _latest(recs, group)
            if last is not None and last["state"] == "issued":
                waiting[group] += 1
        for r in recs:
            newest[r["group"]] = max(newest.get(r["group"], 0.0), float(r.get("time", 0.0)))
    if waiting:
        return max(waiting, key=lambda g: (waiting[g], g == "0"))
    return max(newest, key=lambda g: newest[g]) if newest else None


def _members(
    records: Mapping[int, Sequence[Mapping[str, Any]]], group: str | None, hosts: Mapping[int, str]
) -> set[int]:
    """The group's ranks as its records name them (every rank when they do not)."""
    named: set[int] = set()
    for recs in records.values():
        for record in recs:
            if record.get("group") == group:
                named.update(record.get("ranks") or ())
    return named or set(hosts)


def _key(record: Mapping[str, Any]) -> tuple:
    return collective_key(dict(record))


def find_suspect(
    hosts: Mapping[int, str],
    records: Mapping[int, Sequence[Mapping[str, Any]]],
    no_answer: Sequence[int] = (),
    stack_outliers: Sequence[int] = (),
) -> Suspect:
    """The suspects among the ranks in ``hosts`` (the live ones). ``no_answer``: ranks asked
    for their stacks that gave none; ``stack_outliers``: ranks whose stack stands apart from
    a strict majority of identical stacks."""
    silent = sorted(set(no_answer))
    group = _busiest_group({r: recs for r, recs in records.items() if r not in silent})
    last = {r: _latest(records.get(r, ()), group) for r in hosts} if group is not None else {}
    positions = {r: position_words(rec) for r, rec in last.items()}
    # A rank that did not answer wrote its file up to half a second before it stopped: what
    # it says is its past, not where it stands, so it never counts as waiting.
    waiting = sorted(
        r
        for r, rec in last.items()
        if rec is not None and rec["state"] == "issued" and r not in silent
    )
    # only the group's members can hold it up (a subgroup's outsiders are elsewhere, rightly)
    others = sorted((set(hosts) & _members(records, group, hosts)) - set(waiting))

    if waiting and others:
        sides = Counter(_key(last[r]) for r in waiting)
        (seq, op, _), _n = sides.most_common(1)[0]
        where = f"{op} #{seq}" + ("" if len(sides) == 1 else " and other collectives")
        parts = []
        stopped = [r for r in others if r in silent]
        idle = [r for r in others if r not in silent]
        if stopped:
            parts.append(
                f"{_who(stopped, hosts)} did not answer (stopped, or stuck outside Python)"
            )
        if idle:
            lasts = _positions(idle, positions)
            parts.append(f"{_who(idle, hosts)} not in a collective (last: {lasts})")
        whom = "it" if len(others) == 1 else "them"
        verb = "waits" if len(waiting) == 1 else "wait"
        message = f"{'; '.join(parts)}; {_who(waiting, hosts)} {verb} for {whom} in {where}"
        return Suspect(tuple(others), message, tuple(waiting), positions)

    if waiting:  # every rank waits: in the same collective, or not
        sides_of: dict[tuple, list[int]] = {}
        for r in waiting:
            sides_of.setdefault(_key(last[r]), []).append(r)
        if len(sides_of) > 1:
            ordered = sorted(sides_of.values(), key=lambda rs: (-len(rs), rs))
            largest_unique = len(ordered[0]) > len(ordered[1])
            apart = [r for rs in ordered[1:] for r in rs] if largest_unique else waiting
            words = "; ".join(
                f"{_who(rs, hosts)} in {last[rs[0]]['op']} #{last[rs[0]]['seq']}"
                + (f" {last[rs[0]].get('sizes')}" if last[rs[0]].get("sizes") else "")
                for rs in ordered
            )
            message = (
                f"the ranks disagree on which collective comes next in group {group}: {words}"
                " (a collective called by some ranks only, or skipped by some)"
            )
            return Suspect(tuple(sorted(apart)), message, tuple(waiting), positions)
    if silent:
        return Suspect(
            tuple(silent),
            f"{_who(silent, hosts)} did not answer (stopped, or stuck outside Python)",
            tuple(waiting),
            positions,
        )
    if stack_outliers:
        return Suspect(
            tuple(sorted(stack_outliers)),
            f"{_who(stack_outliers, hosts)} stand(s) elsewhere than every other rank (stacks)",
            tuple(waiting),
            positions,
        )
    where = f" in {positions[waiting[0]]}" if waiting else ""
    return Suspect(
        (),
        f"nothing sets a rank apart: every rank is at the same place{where}",
        tuple(waiting),
        positions,
    )


def group_records(
    records: Mapping[int, Sequence[Mapping[str, Any]]], hosts: Mapping[int, str], keep: int = 8
) -> list[dict[str, Any]]:
    """The ranks' last ``keep`` records grouped by identical sequence (timestamps aside), the
    largest group first, as the stack groups are."""
    groups: dict[tuple, list[int]] = {}
    for rank in sorted(records):
        recs = list(records[rank])[-keep:]
        key = tuple((r["group"], r["seq"], r["op"], str(r.get("sizes")), r["state"]) for r in recs)
        groups.setdefault(key, []).append(rank)
    out = []
    for ranks in sorted(groups.values(), key=lambda rs: (-len(rs), rs)):
        recs = list(records[ranks[0]])[-keep:]
        out.append(
            {
                "ranks": ranks,
                "hosts": sorted({hosts.get(r, "?") for r in ranks}),
                "records": [
                    {
                        k: r.get(k)
                        for k in ("group", "ranks", "seq", "op", "sizes", "dtypes", "state", "time")
                    }
                    for r in recs
                ],
            }
        )
    return out
