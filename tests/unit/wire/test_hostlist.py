"""Slurm's hostlist grammar: expansion (checked against `scontrol show hostnames` where Slurm is
installed), the first host, compression, and malformed lists."""

from __future__ import annotations

import re

import pytest

from zlaunch.wire.hostlist import MAX_HOSTS, HostlistError, compress, expand, first_host

CASES = [
    ("gpu-a[001-004,007],gpu-b12",
     ["gpu-a001", "gpu-a002", "gpu-a003", "gpu-a004", "gpu-a007", "gpu-b12"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node1", ["node1"]),
    ("n[8-10]", ["n8", "n9", "n10"]),  # width of the lower bound: no padding
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[01-3]", ["n01", "n02", "n03"]),
    ("n[1-010]", [f"n{k}" for k in range(1, 11)]),
    ("n[7]", ["n7"]),
    ("n[3,1]", ["n3", "n1"]),  # order kept
    ("n1,n1", ["n1", "n1"]),  # duplicates kept
    ("a,,b", ["a", "b"]),  # empty entries skipped
    ("a b\tc\nd", ["a", "b", "c", "d"]),  # whitespace separates too
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),  # first group slowest
    ("a[1-2],b[01-02],c", ["a1", "a2", "b01", "b02", "c"]),
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ("[1-2]", ["1", "2"]),
    ("", []),
    ("  ", []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "hosts"), CASES)
def test_expand(text, hosts):
    assert expand(text) == hosts


def test_text_after_a_group_is_kept():
    # Slurm 22.05's scontrol refuses this form; real node names like "n1-ib" need it.
    assert expand("n[1-2]-ib,x") == ["n1-ib", "n2-ib", "x"]


@pytest.mark.parametrize(("text", "first"), [
    ("gpu-a[001-004,007],gpu-b12", "gpu-a001"),
    ("gpu-b12,gpu-a[001-004]", "gpu-b12"),
    ("  ,node[3-9]", "node3"),
    ("r[2-3]n[05-06]", "r2n05"),
    ("n[0-999999999]", "n0"),  # not expanded
])  # fmt: skip
def test_first_host(text, first):
    assert first_host(text) == first


def test_first_host_of_an_empty_list_is_an_error():
    with pytest.raises(HostlistError, match="is empty"):
        first_host(" , ")


@pytest.mark.parametrize(("text", "message"), [
    ("x[]", "empty brackets"),
    ("x[1-", "'[' is never closed"),
    ("x[1-2]]", "']' at position 6 has no '['"),
    ("x[[1-2]]", "nested '['"),
    ("x[3-1]", "runs backwards (3 > 1)"),
    ("x[a]", "'a' is not a number"),
    ("x[1-2,]", "'' is not a number"),
    ("x[-2]", "'-2' is not a number"),
    ("x[1-2-3]", "'1-2-3' is not a number"),
    ("x[1:4]", "'1:4' is not a number"),
    ("x[ 1]", "' 1' is not a number"),
])  # fmt: skip
def test_malformed_lists_name_the_problem(text, message):
    with pytest.raises(HostlistError) as info:
        expand(text)
    assert message in str(info.value)
    assert repr(text) in str(info.value)  # the list itself is quoted


def test_huge_ranges_are_refused_before_expanding():
    with pytest.raises(HostlistError, match=f"more than {MAX_HOSTS} hosts"):
        expand("n[0-999999999]")
    with pytest.raises(HostlistError, match=f"more than {MAX_HOSTS} hosts"):
        expand("a[0-2000]b[0-2000]")  # each group is small, the product is not


def test_long_lists_are_shortened_in_messages():
    text = "n" * 500 + "[x]"
    with pytest.raises(HostlistError) as info:
        expand(text)
    assert len(str(info.value)) < 400


def test_non_text_is_refused():
    with pytest.raises(HostlistError, match="must be text"):
        expand(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("hosts", [
    [],
    ["a"],
    ["n1", "n2", "n3"],
    ["gpu-a001", "gpu-a002", "gpu-a003", "gpu-a004", "gpu-a007", "gpu-b12"],
    ["n8", "n9", "n10", "n11"],
    ["n3", "n2", "n1"],
    ["n1", "n1", "x", "n2"],
    ["10.0.0.1", "10.0.0.2"],
    ["n01", "n1", "n02"],
])  # fmt: skip
def test_compress_round_trips(hosts):
    assert expand(compress(hosts)) == hosts


def test_compress_is_short():
    assert compress(["n1", "n2", "n3", "x"]) == "n[1-3],x"
    assert compress([f"gpu{k:03d}" for k in range(1, 1001)]) == "gpu[001-999],gpu1000"
    assert compress(["gpu-a001", "gpu-a002", "gpu-a004"]) == "gpu-a[001-002,004]"


@pytest.mark.parametrize(
    ("hostlist", "words"),
    [
        ("n[" + "9" * 4400 + "]", "has more than 18 digits"),
        ("n[1-" + "9" * 30 + "]", "has more than 18 digits"),
        ("n[1-2]" + "x" * 4300, "makes host names of 4302 characters (at most 255)"),
    ],
)
def test_the_hostlist_bounds_numbers_and_name_lengths(hostlist, words):
    from zlaunch.wire.hostlist import HostlistError, expand

    with pytest.raises(HostlistError, match=re.escape(words)):
        expand(hostlist)
