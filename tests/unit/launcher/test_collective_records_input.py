"""The collective-records file is the rank's to write, so it is input like any other: the agent
reads it within bounds, the controller keeps only well-formed records and says what it left
out (pure: no process, no torch)."""

from __future__ import annotations

import json
import os

import pytest

from zlaunch.launcher.hang import hang_failure
from zlaunch.launcher.hang_records import MAX_RECORDS, decode_records
from zlaunch.wire import events
from zlaunch.worker.collective_records import MAX_FILE_BYTES, normalize, read_records


def _good(seq=1, **over):
    record = {"group": "0", "ranks": [0, 1], "seq": seq, "op": "all_reduce", "sizes": [[4]],
              "dtypes": ["Float"], "state": "issued", "time": 1000.0, "desc": "default_pg"}  # fmt: skip
    return {**record, **over}


def test_a_well_formed_file_is_read(tmp_path):
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"rank": 0, "records": [_good()]}))
    event = read_records(str(path))
    assert isinstance(event, events.Collectives) and event.records == [_good()]
    assert event.unreadable is None and read_records(str(tmp_path / "none.json")) is None


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_text("[" * 100000 + "]" * 100000), "nested deeper than"),
        (lambda p: p.write_text('{"records": ' + "[" * 50 + "]" * 50 + "}"), "nested deeper than"),
        (lambda p: os.mkfifo(p), "not a regular file"),  # a blocking open waits for a writer
        (lambda p: p.symlink_to("/dev/zero"), "cannot open it"),  # a read that never ends
        (lambda p: p.write_bytes(b" " * (MAX_FILE_BYTES + 1)), f"over {MAX_FILE_BYTES}"),
        (lambda p: p.write_text('{"records": {"a": 1}}'), '"records" list'),
        (lambda p: p.write_bytes(b"\xff\xfe"), "not JSON"),
    ],
)
def test_a_hostile_file_costs_the_agent_nothing_and_is_said(tmp_path, make, why):
    path = tmp_path / "rank-0.json"
    make(path)
    event = read_records(str(path))
    assert event.records == [] and why in event.unreadable, event


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ([1], "record 0: not an object but int"),
        ([{"seq": 1}], "record 0: no group"),
        ([_good(seq="x")], "record 0: seq is not a count"),
        ([_good(seq=True)], "record 0: seq is not a count"),  # JSON true is not 1
        ([_good(seq=-1)], "record 0: seq is not a count"),
        ([_good(state="done")], "record 0: state is not issued or completed"),
        ([_good(ranks=[0, "1"])], "record 0: ranks is not a list of ranks"),
        ([_good(sizes=[4])], "record 0: sizes is not a list of tensor shapes"),
        ([_good(time=float("nan"))], "record 0: time is not seconds since the epoch"),
        ([_good(op="x" * 300)], "record 0: op is not a name of at most 256 characters"),
        ("records", "records are not a list but str"),
    ],
)
def test_a_bad_record_is_dropped_and_named(raw, problem):
    decoded = decode_records(raw)
    assert decoded.records == [] and decoded.dropped == 1 and decoded.problems == (problem,)
    assert problem in decoded.note(3) and decoded.note(3).startswith("rank 3 sent 1 ")


def test_good_records_pass_with_exactly_the_known_fields():
    minimal = {"group": "1", "seq": 2, "op": "broadcast", "state": "completed"}
    decoded = decode_records([_good(), {**minimal, "extra": {"deep": [1]}}, 7])
    assert decoded.records == [
        _good(),
        {**minimal, "desc": "", "ranks": [], "sizes": [], "dtypes": [], "time": 0.0},
    ]
    assert decoded.dropped == 1 and decoded.note(0) is not None
    assert decode_records([_good()]).note(0) is None


def test_too_many_records_keep_the_newest():
    decoded = decode_records([_good(seq=s) for s in range(MAX_RECORDS + 5)])
    assert len(decoded.records) == MAX_RECORDS and decoded.records[0]["seq"] == 5
    assert decoded.dropped == 5


def test_the_hang_report_of_garbage_records_is_a_report():
    raw = {0: [1, {"group": "0"}], 1: [_good(seq=3)], 2: "x"}
    decoded = {rank: decode_records(value).records for rank, value in raw.items()}
    records = {rank: kept for rank, kept in decoded.items() if kept}  # as the controller keeps
    failure = hang_failure(10.0, 12.0, {0: "a", 1: "a", 2: "b"}, {}, [], records)
    assert failure.reason == "hang" and failure.exit_code == 124
    groups = failure.hang["collective_groups"]
    assert [g["ranks"] for g in groups] == [[1]] and groups[0]["records"][0]["seq"] == 3
    assert json.dumps(failure.to_json())  # failure.json can be written


def test_the_writer_keeps_fewer_records_per_group_when_asked():
    entries = [
        {
            "process_group": ["0", "default"],
            "collective_seq_id": s,
            "profiling_name": "gloo:all_reduce",
        }
        for s in range(10)
    ]
    assert [r["seq"] for r in normalize(entries, {"0": [0, 1]}, ring=2)] == [8, 9]
