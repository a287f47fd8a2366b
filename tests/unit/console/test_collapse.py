"""Identical lines of many ranks shown once (zlaunch/console/collapse.py), as tables over an
injected clock; then the console's rendering of them and RankOutput's wiring (rank logs keep
every line, only the console collapses)."""

from __future__ import annotations

import io
import random
import time

import pytest

from zlaunch.console.collapse import LineCollapser, Shown, collapse_wanted
from zlaunch.console.terminal import Console
from zlaunch.text.ranks import rank_ranges
from zlaunch.wire import protocol

OUT, ERR = protocol.STDOUT, protocol.STDERR


def feed(collapser: LineCollapser, events, *, tick: float = 0.05, until: float | None = None):
    """Events (time, rank, stream, text) in time order, with due() every ``tick`` seconds
    between them; returns [(release time, Shown)]."""
    out: list[tuple[float, Shown]] = []
    now = 0.0
    end = until if until is not None else (events[-1][0] if events else 0.0) + 10.0
    pending = list(events)
    while now <= end:
        while pending and pending[0][0] <= now:
            at, rank, stream, text = pending.pop(0)
            out += [(at, s) for s in collapser.add(at, rank, stream, text)]
            out += [(at, s) for s in collapser.due(at)]
        out += [(now, s) for s in collapser.due(now)]
        now = round(now + tick, 9)
    return out


def shown(results):
    """(ranks, stream, text) of each Shown, from feed()'s pairs or a plain list."""
    lines = [r[1] if isinstance(r, tuple) else r for r in results]
    return [(s.ranks, s.stream, s.text) for s in lines]


# ---- the rules, one table row each --------------------------------------------------------


def test_the_lead_prints_at_once_and_the_others_fold_into_one_follow_up():
    c = LineCollapser(lead=0, shown=16)
    assert c.add(0.0, 0, ERR, "UserWarning: x") == [Shown((0,), ERR, "UserWarning: x")]
    for rank in range(1, 15):
        assert c.add(0.01 * rank, rank, ERR, "UserWarning: x") == []
        assert c.due(0.01 * rank) == []  # rank 15 has not said it yet
    c.add(0.2, 15, ERR, "UserWarning: x")
    # every shown rank said it: no reason to wait for the quiet period
    assert c.due(0.2) == [Shown(tuple(range(1, 16)), ERR, "UserWarning: x")]
    assert c.pending == 0


def test_a_line_of_one_other_rank_waits_for_the_quiet_period_then_prints_alone():
    c = LineCollapser(lead=0, shown=16, quiet=0.5, max_hold=2.0)
    assert c.add(1.0, 7, OUT, "only me") == []
    assert c.due(1.49) == []
    assert c.due(1.5) == [Shown((7,), OUT, "only me")]


def test_ranks_still_joining_keep_a_line_held_but_never_past_max_hold():
    c = LineCollapser(lead=0, shown=1024, quiet=0.5, max_hold=2.0)
    # a rank every 0.375 s: never quiet for 0.5 s, so max_hold ends it (binary-exact times)
    events = [(0.375 * i, 1 + i, OUT, "loading checkpoint") for i in range(8)]
    got = feed(c, events, tick=0.125)
    assert [(at, s.ranks) for at, s in got] == [
        (2.0, (1, 2, 3, 4, 5, 6)),  # ranks 1-6 came by 2.0 s (first seen at 0.0)
        (3.125, (7, 8)),  # a new held line from 2.25 s: quiet 0.5 s after rank 8 at 2.625 s
    ]


def test_stdout_and_stderr_are_never_merged():
    c = LineCollapser(lead=0, shown=4)
    events = [(0.0, r, OUT if r % 2 else ERR, "same words") for r in (1, 2, 3)]
    assert sorted(shown(feed(c, events))) == [
        ((1, 3), OUT, "same words"),
        ((2,), ERR, "same words"),
    ]


def test_texts_that_differ_only_in_a_number_are_different_lines():
    c = LineCollapser(lead=0, shown=4)
    events = [(0.0, r, OUT, f"shard {r} missing") for r in (1, 2, 3)]
    assert shown(feed(c, events)) == [((r,), OUT, f"shard {r} missing") for r in (1, 2, 3)]


def test_a_rank_saying_the_same_line_twice_shows_it_twice_in_order():
    c = LineCollapser(lead=0, shown=4)
    events = [(0.0, 1, OUT, "tick"), (0.1, 1, OUT, "tock"), (0.2, 1, OUT, "tick")]
    events += [(0.3, 2, OUT, "tick"), (0.3, 2, OUT, "tock"), (0.3, 2, OUT, "tick")]
    assert shown(feed(c, events)) == [
        ((1, 2), OUT, "tick"),
        ((1, 2), OUT, "tock"),
        ((1, 2), OUT, "tick"),
    ]


def test_a_rank_whose_lines_come_in_another_order_keeps_its_own_order():
    c = LineCollapser(lead=0, shown=4)
    events = [(0.0, 1, OUT, "A"), (0.0, 1, OUT, "B"), (0.1, 2, OUT, "B"), (0.1, 2, OUT, "A")]
    # rank 2 said B first: it cannot join A (held before B), so its A is a line of its own
    assert shown(feed(c, events)) == [((1,), OUT, "A"), ((1, 2), OUT, "B"), ((2,), OUT, "A")]


def test_a_line_of_its_own_before_a_shared_one_does_not_stop_the_rank_joining_it():
    # each rank: a line of its own, then the line every rank says; frames of whole ranks
    # arrive one after the other, so the shared line is first held before rank 2's own
    c = LineCollapser(lead=0, shown=4)
    events = []
    for rank in (1, 2, 3):
        events += [(0.0, rank, OUT, f"rank {rank} step 1"), (0.0, rank, OUT, "epoch tick")]
    assert shown(feed(c, events)) == [
        ((1,), OUT, "rank 1 step 1"),
        ((2,), OUT, "rank 2 step 1"),
        ((3,), OUT, "rank 3 step 1"),
        ((1, 2, 3), OUT, "epoch tick"),
    ]


def test_a_shared_line_held_after_the_rank_s_own_shared_line_is_not_joined_out_of_order():
    c = LineCollapser(lead=0, shown=4)
    events = [(0.0, 1, OUT, "A"), (0.0, 1, OUT, "B"), (0.0, 3, OUT, "B")]
    events += [(0.1, 2, OUT, "B"), (0.1, 2, OUT, "A")]  # B, held with rank 3, then A
    assert shown(feed(c, events)) == [((1,), OUT, "A"), ((1, 2, 3), OUT, "B"), ((2,), OUT, "A")]


def test_the_lead_joins_a_line_other_ranks_said_first_and_is_not_named_again():
    c = LineCollapser(lead=0, shown=3)
    assert c.add(0.0, 2, OUT, "hello") == []
    assert c.add(0.1, 0, OUT, "hello") == [Shown((0,), OUT, "hello")]
    assert c.add(0.2, 1, OUT, "hello") == []
    assert c.due(0.2) == [Shown((1, 2), OUT, "hello")]  # all three said it: no wait


def test_the_lead_repeating_a_line_prints_each_time():
    c = LineCollapser(lead=0, shown=3)
    assert c.add(0.0, 0, OUT, "step") == [Shown((0,), OUT, "step")]
    assert c.add(0.1, 0, OUT, "step") == [Shown((0,), OUT, "step")]
    c.add(0.2, 1, OUT, "step")
    c.add(0.2, 1, OUT, "step")
    assert c.flush() == [Shown((1,), OUT, "step"), Shown((1,), OUT, "step")]


def test_a_newer_line_waits_for_an_older_one_still_held():
    c = LineCollapser(lead=0, shown=3, quiet=0.5, max_hold=2.0)
    c.add(0.0, 1, OUT, "old")
    c.add(0.1, 1, OUT, "new")
    c.add(0.1, 2, OUT, "new")  # every rank but the lead said "new": it need not wait ...
    assert c.due(0.1) == []  # ... but "old" is held before it
    assert c.due(0.5) == [Shown((1,), OUT, "old"), Shown((1, 2), OUT, "new")]


def test_too_many_held_lines_print_the_oldest_at_once():
    c = LineCollapser(lead=0, shown=100, max_pending=2)
    assert c.add(0.0, 1, OUT, "a") == []
    assert c.add(0.0, 1, OUT, "b") == []
    assert c.add(0.0, 1, OUT, "c") == [Shown((1,), OUT, "a")]
    assert c.pending == 2


def test_too_many_held_bytes_print_the_oldest_at_once():
    c = LineCollapser(lead=0, shown=100, max_bytes=1000)
    assert c.add(0.0, 1, OUT, "x" * 600) == []
    assert c.add(0.0, 2, OUT, "y" * 600) == [Shown((1,), OUT, "x" * 600)]
    assert c.add(0.0, 3, OUT, "z" * 5000) == [
        Shown((2,), OUT, "y" * 600),
        Shown((3,), OUT, "z" * 5000),  # alone over the bound: printed, never kept
    ]
    assert c.pending == 0


def test_flush_rank_prints_that_rank_s_held_lines_and_the_older_ones_only():
    c = LineCollapser(lead=0, shown=10)
    c.add(0.0, 3, ERR, "Traceback (most recent call last):")
    c.add(0.0, 4, OUT, "older, of another rank")  # held after rank 3's first line
    c.add(0.0, 3, ERR, "ValueError: bad")
    c.add(0.0, 5, OUT, "newer")
    assert shown(c.flush_rank(3)) == [
        ((3,), ERR, "Traceback (most recent call last):"),
        ((4,), OUT, "older, of another rank"),
        ((3,), ERR, "ValueError: bad"),
    ]
    assert shown(c.flush()) == [((5,), OUT, "newer")]


@pytest.mark.parametrize("seed", range(40))
def test_random_traffic_every_line_once_each_rank_in_order_none_held_past_the_bound(seed):
    rng = random.Random(seed)
    ranks, texts = rng.randint(2, 40), ["w0", "w1", "w2", "w3", "w4"]
    events = []
    for rank in range(ranks):  # each rank: a few lines from a small vocabulary, in time order
        at = rng.uniform(0, 1.5)
        for i in range(rng.randint(1, 8)):
            at += rng.choice([0.0, 0.0, 0.01, 0.2, 0.7])
            text = rng.choice([*texts, f"rank {rank} line {i}"])  # shared, or its own
            events.append((round(at, 3), rank, rng.choice([OUT, ERR]), text))
    events.sort(key=lambda e: e[0])  # stable: a rank's lines keep their order
    c = LineCollapser(lead=0, shown=ranks, max_pending=rng.choice([3, 4096]))
    got = feed(c, events, tick=0.05)
    got += [(99.0, s) for s in c.flush()]
    said = {r: [(at, s, t) for at, rank, s, t in events if rank == r] for r in range(ranks)}
    seen: dict[int, list] = {r: [] for r in range(ranks)}
    for released, line in got:
        for rank in line.ranks:
            seen[rank].append((released, line.stream, line.text))
    # every line exactly once, each rank's in its order ...
    assert {r: [x[1:] for x in v] for r, v in seen.items()} == {
        r: [x[1:] for x in v] for r, v in said.items()
    }
    # ... and none held longer than max_hold (plus the tick that noticed it); the lead's never
    for rank in range(ranks):
        for (at, _, _), (released, _, _) in zip(said[rank], seen[rank], strict=True):
            assert at <= released <= at + (0.0 if rank == 0 else 2.0 + 0.05 + 1e-9)


def check_traffic(c: LineCollapser, events, ranks: int, bound: float) -> list[Shown]:
    """Feed; every line exactly once, each rank's in its order, none held past ``bound``."""
    got = feed(c, events, tick=0.05)
    got += [(99.0, s) for s in c.flush()]
    said = {r: [(at, s, t) for at, rank, s, t in events if rank == r] for r in range(ranks)}
    seen: dict[int, list] = {r: [] for r in range(ranks)}
    for released, line in got:
        for rank in line.ranks:
            seen[rank].append((released, line.stream, line.text))
    assert {r: [x[1:] for x in v] for r, v in seen.items()} == {
        r: [x[1:] for x in v] for r, v in said.items()
    }
    for rank in range(1, ranks):
        for (at, _, _), (released, _, _) in zip(said[rank], seen[rank], strict=True):
            assert at <= released <= at + bound
    return [line for _, line in got]


@pytest.mark.parametrize("seed", range(10))
def test_ranks_repeating_two_lines_fast_stay_correct_and_collapse(seed):
    rng = random.Random(seed)
    events = []
    for rank in range(12):
        for i in range(rng.randint(20, 120)):  # far more repeats than SCAN
            text = rng.choice(["tick", "tock", f"own {rank}"])
            events.append((round(0.001 * i, 3), rank, OUT, text))
    events.sort(key=lambda e: e[0])
    lines = check_traffic(LineCollapser(lead=0, shown=12), events, 12, 2.0 + 0.05 + 1e-9)
    assert any(len(line.ranks) > 1 for line in lines)


def test_many_ranks_moving_their_own_line_before_one_shared_line_renumber_the_order():
    # each of 200 ranks: its own line, then the line every rank says; every own line moves
    # just before the shared one, halving the gap of labels there until it is renumbered
    events = []
    for rank in range(1, 201):
        events += [(0.0, rank, OUT, f"rank {rank} at step 5"), (0.0, rank, OUT, "epoch done")]
    lines = check_traffic(LineCollapser(lead=0, shown=201), events, 201, 2.1)
    assert [(line.ranks, line.text) for line in lines] == [
        ((r,), f"rank {r} at step 5") for r in range(1, 201)
    ] + [(tuple(range(1, 201)), "epoch done")]


def test_collapse_is_on_above_eight_shown_ranks_unless_told():
    assert [collapse_wanted(None, n) for n in (1, 8, 9, 1024)] == [False, False, True, True]
    assert collapse_wanted(False, 1024) is False and collapse_wanted(True, 2) is True


# ---- written compactly ----------------------------------------------------------------------


def test_rank_lists_are_compact_and_a_long_one_is_cut_with_its_count():
    assert rank_ranges([5, 0, 1, 2, 2]) == "0-2,5"
    assert rank_ranges(range(1024), limit=20) == "0-1023"
    evens = rank_ranges(range(0, 1024, 2), limit=40)
    assert evens.startswith("0,2,4,") and evens.endswith(",...,1022 (512 ranks)"), evens
    assert len(evens) <= 40
    assert rank_ranges([1, 100000], limit=3) == "1,...,100000 (2 ranks)"  # the ends stay


# ---- on the console ---------------------------------------------------------------------------


def console(**kw) -> tuple[Console, io.BytesIO]:
    out = io.BytesIO()
    return Console(color=False, out=out, err=io.StringIO(), **kw), out


def test_the_console_tags_a_shared_line_with_its_ranks_and_a_single_one_with_its_host():
    con, out = console()
    hosts = {r: f"node{r // 8}" for r in range(16)}
    con.collapsed(
        [
            Shown(tuple(range(1, 16)), ERR, "UserWarning: x"),
            Shown((9,), OUT, "mine"),
            Shown((1, 2, 3, 5), OUT, "some"),
        ],
        hosts,
    )
    assert out.getvalue().decode().splitlines() == [
        "[ranks 1-15]! UserWarning: x",
        "[node1:9] mine",
        "[ranks 1-3,5] some",
    ]


def test_the_ranks_filter_and_a_gone_reader_apply_to_shared_lines():
    con, out = console(ranks=frozenset({2, 3}))
    lines = [Shown((1, 2, 3), OUT, "a"), Shown((1, 2), OUT, "b"), Shown((1,), OUT, "c")]
    con.collapsed(lines, {2: "n0"})
    assert out.getvalue().decode().splitlines() == ["[ranks 2-3] a", "[n0:2] b"]
    con.ranks = frozenset()  # what a reader gone away (EPIPE) leaves
    con.collapsed(lines, {2: "n0"})
    assert out.getvalue().decode().splitlines() == ["[ranks 2-3] a", "[n0:2] b"]


def test_a_shared_line_in_color_is_bold_with_a_red_stderr_mark():
    out = io.BytesIO()
    con = Console(color=True, out=out, err=io.StringIO())
    con.collapsed([Shown((1, 2), ERR, "w")], {})
    assert out.getvalue() == b"\x1b[1m[ranks 1-2]\x1b[0m\x1b[31m!\x1b[0m w\n"


# ---- RankOutput: the rank logs keep every line, only the console collapses ------------------


class LogList:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        pass


def rank_output(world: int, collapse: bool | None, **console_kw):
    from zlaunch.console.job_view import JobView
    from zlaunch.launcher.rank_output import RankOutput

    con, out = console(**console_kw)
    output = RankOutput(con, JobView(con), collapse)
    logs = {}
    for rank in range(world):
        logs[rank] = LogList()
        output.add_rank(rank, f"node{rank // 8}", logs[rank])
    return output, out, logs


WARNING = "UserWarning: TypedStorage is deprecated"


def test_sixteen_ranks_warning_alike_is_one_follow_up_line_and_every_rank_log_has_it():
    output, out, logs = rank_output(16, None)
    for rank in range(16):
        output.lines(rank, ERR, [WARNING, f"rank {rank} ready"], False)
    output.close()
    lines = out.getvalue().decode().splitlines()
    assert lines[:2] == [f"[node0:0]! {WARNING}", "[node0:0]! rank 0 ready"]  # at once
    assert lines.count(f"[ranks 1-15]! {WARNING}") == 1
    assert sum(WARNING in line for line in lines) == 2
    assert sorted(lines[2:]) == sorted(
        [f"[ranks 1-15]! {WARNING}"] + [f"[node{r // 8}:{r}]! rank {r} ready" for r in range(1, 16)]
    )
    for rank, log in logs.items():
        assert log.data.decode().splitlines() == [WARNING, f"rank {rank} ready"]


def test_eight_ranks_or_no_collapse_show_one_line_per_rank_line_as_before():
    for ranks, collapse in ((8, None), (16, False)):
        output, out, _ = rank_output(ranks, collapse)
        for rank in range(ranks):
            output.lines(rank, protocol.STDOUT, ["same"], False)
        assert output.collapser is None
        lines = out.getvalue().decode().splitlines()  # printed at once, nothing held
        assert lines == [f"[node{r // 8}:{r}] same" for r in range(ranks)]


def test_collapse_forced_on_for_four_ranks_and_the_lead_is_the_first_rank_shown():
    output, out, _ = rank_output(4, True, ranks=frozenset({1, 2, 3}))
    for rank in range(4):
        output.lines(rank, protocol.STDOUT, ["same"], False)
    # rank 0 is not shown: rank 1 leads, at once
    assert out.getvalue().decode().splitlines() == ["[node0:1] same"]
    # every shown rank said it: the controller loop's next look prints the rest, no waiting
    output.tick(time.monotonic())
    assert out.getvalue().decode().splitlines() == ["[node0:1] same", "[ranks 2-3] same"]


def test_a_failed_rank_s_held_lines_print_before_the_note_about_it():
    output, out, _ = rank_output(16, None)
    output.lines(5, ERR, ["Traceback (most recent call last):", "ValueError: bad"], False)
    assert out.getvalue() == b""  # held: other ranks may say the same
    output.rank_failed(5)
    assert out.getvalue().decode().splitlines() == [
        "[node0:5]! Traceback (most recent call last):",
        "[node0:5]! ValueError: bad",
    ]


def test_only_the_first_failure_flushes_and_the_lead_s_flushes_nothing():
    output, out, _ = rank_output(16, None)
    for rank in range(4):
        output.lines(rank, ERR, ["Traceback (most recent call last):", "ImportError: x"], False)
    output.rank_failed(0)  # the lead: its lines printed already, the others' keep waiting
    assert out.getvalue().decode().splitlines() == [
        "[node0:0]! Traceback (most recent call last):",
        "[node0:0]! ImportError: x",
    ]
    output.rank_failed(2)  # failures while stopping: no note follows, nothing is split
    for rank in range(4, 8):
        output.lines(rank, ERR, ["Traceback (most recent call last):", "ImportError: x"], False)
    output.close()
    assert out.getvalue().decode().splitlines()[2:] == [
        "[ranks 1-7]! Traceback (most recent call last):",
        "[ranks 1-7]! ImportError: x",
    ]
