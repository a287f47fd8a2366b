"""Who a hung job waits for, from the ranks' collective records (pure: no process, no torch)."""

from __future__ import annotations

import pytest

from zlaunch.launcher.hang import hang_failure
from zlaunch.launcher.hang_suspect import find_suspect, group_records
from zlaunch.worker.collective_records import RING, collective_mismatch, normalize, peers_to_ask

HOSTS3 = {0: "node1", 1: "node2", 2: "node3"}


def rec(seq, op="all_reduce", state="completed", group="0", sizes=((4,),)):
    return {
        "group": group,
        "ranks": [0, 1, 2] if group == "0" else [0, 2],
        "seq": seq,
        "op": op,
        "sizes": [list(s) for s in sizes],
        "dtypes": ["Float"],
        "state": state,
        "time": 1000.0 + seq,
    }


def history(*last):
    """Collectives 1..55 completed, then ``last``."""
    return [rec(s) for s in range(50, 56)] + list(last)


WAIT57 = history(rec(56), rec(57, state="issued"))
DONE56 = history(rec(56))

CASES = [
    # (name, records, no_answer, stack_outliers, suspects, words in the message)
    (
        "stopped rank: its peers wait for it",
        {0: WAIT57, 1: DONE56, 2: WAIT57},
        [1],
        [],
        (1,),
        [
            "rank 1 on node2 did not answer (stopped, or stuck outside Python)",
            "ranks 0 and 2 on node1 and node3 wait for it in all_reduce #57",
        ],
    ),
    (
        "stopped rank whose file is stale (says it waits in an older collective)",
        {0: WAIT57, 1: history(rec(56, state="issued")), 2: WAIT57},
        [1],
        [],
        (1,),
        ["rank 1 on node2 did not answer", "wait for it in all_reduce #57"],
    ),
    (
        "stopped rank with no records at all",
        {0: WAIT57, 2: WAIT57},
        [1],
        [],
        (1,),
        ["rank 1 on node2 did not answer", "wait for it in all_reduce #57"],
    ),
    (
        "rank sleeping in Python: its last collective completed, the others wait",
        {0: WAIT57, 1: DONE56, 2: WAIT57},
        [],
        [1],
        (1,),
        ["rank 1 on node2 not in a collective (last: rank 1: all_reduce #56 (completed))"],
    ),
    (
        "barrier called by rank 0 only",
        {
            0: history(rec(56, "barrier", "issued", sizes=())),
            1: history(rec(56, state="issued")),
            2: history(rec(56, state="issued")),
        },  # fmt: skip
        [],
        [0],
        (0,),
        [
            "disagree on which collective comes next",
            "ranks 1 and 2 on node2 and node3 in all_reduce #56",
            "rank 0 on node1 in barrier #56",
        ],  # fmt: skip
    ),
    (
        "all_reduce skipped by rank 0: same position, other sizes",
        {
            0: history(rec(56, state="issued", sizes=((8,),))),
            1: history(rec(56, state="issued")),
            2: history(rec(56, state="issued")),
        },  # fmt: skip
        [],
        [],
        (0,),
        ["rank 0 on node1 in all_reduce #56 [[8]]"],
    ),
    (
        "two ranks, two collectives: no side is larger, both are named",
        {0: history(rec(56, "barrier", "issued")), 1: history(rec(56, state="issued"))},
        [],
        [],
        (0, 1),
        ["rank 1 on node2 in all_reduce #56", "rank 0 on node1 in barrier #56"],
    ),
    (
        "everyone waits in the same collective: nothing distinguishes a rank",
        {0: WAIT57, 1: WAIT57, 2: WAIT57},
        [],
        [],
        (),
        ["nothing sets a rank apart", "all_reduce #57 (waiting)"],
    ),
    (
        "a subgroup's outsider is not held against it",
        {
            0: history(rec(3, group="1", state="issued")),
            1: DONE56,
            2: history(rec(2, group="1"), rec(3, group="1", state="issued")),
        },  # fmt: skip
        [],
        [],
        (),
        ["nothing sets a rank apart"],
    ),
    (
        "no records (no process group): the stacks decide",
        {},
        [],
        [2],
        (2,),
        ["rank 2 on node3 stand(s) elsewhere"],
    ),
    (
        "no records, no outlier: nothing",
        {},
        [],
        [],
        (),
        ["nothing sets a rank apart"],
    ),
    (
        "the busiest group is the one where ranks wait, not the last one used",
        {0: WAIT57 + [rec(3, group="1")], 1: DONE56 + [rec(3, group="1")], 2: WAIT57},
        [],
        [],
        (1,),
        ["rank 1 on node2 not in a collective", "wait for it in all_reduce #57"],
    ),
]


@pytest.mark.parametrize(
    "records, no_answer, outliers, suspects, words",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_suspect(records, no_answer, outliers, suspects, words):
    two_ranks = set(records) == {0, 1} and not no_answer
    hosts = {0: "node1", 1: "node2"} if two_ranks else HOSTS3
    suspect = find_suspect(hosts, records, no_answer, outliers)
    assert suspect.ranks == suspects, suspect.message
    for word in words:
        assert word in suspect.message, suspect.message


def test_failure_names_the_suspect_in_its_own_fields():
    waiting = (("main", ("all_reduce",)),)
    failure = hang_failure(
        4.0,
        4.2,
        HOSTS3,
        {0: waiting, 2: waiting},
        [],
        {0: WAIT57, 1: DONE56, 2: WAIT57},
        {0: 10, 1: 11, 2: 12},
    )
    assert (failure.rank, failure.host, failure.pid) == (1, "node2", 11)
    assert failure.hang["no_dump"] == [1]
    assert "rank 1 on node2 did not answer" in failure.message
    data = failure.to_json()
    assert data["hang"]["suspect"]["ranks"] == [1]
    groups = data["hang"]["collective_groups"]
    assert [g["ranks"] for g in groups] == [[0, 2], [1]]
    assert groups[0]["records"][-1]["seq"] == 57 and groups[0]["records"][-1]["state"] == "issued"
    assert groups[1]["records"][-1]["seq"] == 56


def test_several_suspects_are_a_list_and_none_is_all():
    records = {0: history(rec(56, "barrier", "issued")), 1: history(rec(56, state="issued"))}
    hosts = {0: "node1", 1: "node2"}
    dumps = {0: (("main", ("a",)),), 1: (("main", ("b",)),)}
    both = hang_failure(4.0, 4.0, hosts, dumps, [], records, {0: 10, 1: 11})
    assert (both.rank, both.host, both.pid) == ([0, 1], "node1, node2", [10, 11])
    same = {0: WAIT57, 1: WAIT57}
    none = hang_failure(4.0, 4.0, hosts, {0: dumps[0], 1: dumps[0]}, [], same, {0: 10, 1: 11})
    assert (none.rank, none.host, none.pid) == ("all", "node1, node2", None)


def test_group_records_ignores_timestamps():
    a = [rec(1), rec(2, state="issued")]
    b = [dict(r, time=r["time"] + 0.5) for r in a]
    groups = group_records({0: a, 1: b, 2: a[:1]}, HOSTS3)
    assert [g["ranks"] for g in groups] == [[0, 1], [2]]


def test_flight_recorder_entries_become_records():
    # the fields torch 2.13's flight recorder writes (gloo: state stays "scheduled";
    # ``retired`` says the work completed)
    def entry(seq, name, retired, pg="0", sizes=((4,),)):
        return {
            "collective_seq_id": seq,
            "p2p_seq_id": 0,
            "is_p2p": False,
            "profiling_name": f"gloo:{name}",
            "process_group": [pg, "default_pg"],
            "input_sizes": [list(s) for s in sizes],
            "input_dtypes": ["Float"],
            "state": "scheduled",
            "retired": retired,
            "time_created_ns": 1_700_000_000_500_000_000 + seq,
        }

    entries = [entry(s, "all_reduce", True) for s in range(1, 30)] + [entry(30, "barrier", False)]
    entries.append(entry(2, "all_gather_into_tensor", True, pg="1"))
    records = normalize(entries, {"0": [0, 1, 2], "1": [0, 2]})
    main = [r for r in records if r["group"] == "0"]
    assert len(main) == RING and main[-1]["seq"] == 30
    assert main[-1] == {
        "group": "0",
        "desc": "default_pg",
        "ranks": [0, 1, 2],
        "seq": 30,
        "op": "barrier",
        "sizes": [[4]],
        "dtypes": ["Float"],
        "state": "issued",
        "time": 1700000000.5,
    }
    assert main[-2]["state"] == "completed"
    (sub,) = [r for r in records if r["group"] == "1"]
    assert (sub["op"], sub["ranks"]) == ("all_gather_into_tensor", [0, 2])


def test_mismatch_is_same_position_other_collective():
    mine = rec(9, "barrier", "issued", sizes=())
    peers = {1: rec(9, state="issued"), 2: rec(8), 3: rec(9, "barrier", "issued", sizes=())}
    assert collective_mismatch(mine, peers) == {1: peers[1]}
    # sizes count where every rank passes the same (an all_reduce), not where they may differ
    reduce = rec(9, state="issued")
    assert collective_mismatch(reduce, {1: rec(9, sizes=((8,),))}) == {1: rec(9, sizes=((8,),))}
    scatter = rec(9, "scatter", "issued", sizes=((4,), (4,)))
    assert collective_mismatch(scatter, {1: rec(9, "scatter", "issued", sizes=((4,),))}) == {}


def test_a_waiting_rank_reads_a_bounded_set_of_peers_that_covers_the_ring():
    ranks = list(range(1000))
    assert peers_to_ask(ranks, 0) == [1, 2, 3]
    assert peers_to_ask(ranks, 998) == [0, 999, 1]
    assert peers_to_ask([4, 6, 8], 8) == [4, 6]
    assert peers_to_ask([4, 6, 8], 5) == []  # not in the group
    # every neighbour pair of the ring is read by one of its two ranks
    asked = {(me, p) for me in ranks for p in peers_to_ask(ranks, me)}
    assert all((r, (r + 1) % 1000) in asked for r in ranks)
