"""--include / --exclude / --num-nodes / --num-gpus against a hostfile."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlaunch.errors import UsageError
from zlaunch.job.hostfile import Host
from zlaunch.job.selectors import parse_selector, select_hosts

HOSTS = [Host("node1", (0, 1, 2, 3)), Host("node2", (0, 1, 2, 3)), Host("node3", (0, 1))]


def pick(include=None, exclude=None, num_nodes=None, num_gpus=None, hosts=HOSTS):
    return {h.name: h.slots for h in select_hosts(hosts, include, exclude, num_nodes, num_gpus)}


def usage_error(**kwargs) -> UsageError:
    with pytest.raises(UsageError) as info:
        pick(**kwargs)
    assert info.value.exit_code == 2
    return info.value


def test_no_selector_keeps_everything():
    assert pick() == {"node1": (0, 1, 2, 3), "node2": (0, 1, 2, 3), "node3": (0, 1)}


@pytest.mark.parametrize(
    ("include", "expected"),
    [
        ("node2", {"node2": (0, 1, 2, 3)}),
        ("node1:1", {"node1": (1,)}),
        ("node1:0,2", {"node1": (0, 2)}),
        ("node1:3,0", {"node1": (0, 3)}),
        ("node1:1-3", {"node1": (1, 2, 3)}),
        ("node1:0,2-3", {"node1": (0, 2, 3)}),
        ("node1:2-2", {"node1": (2,)}),
        # Rank order is hostfile order whatever the selector's order.
        ("node3@node1:0", {"node1": (0,), "node3": (0, 1)}),
        ("node2:0@node2:3", {"node2": (0, 3)}),
        ("node2:1@node2", {"node2": (0, 1, 2, 3)}),
        (" node1:0 @ node2:1 ", {"node1": (0,), "node2": (1,)}),
    ],
)
def test_include(include, expected):
    assert pick(include=include) == expected


@pytest.mark.parametrize(
    ("exclude", "expected"),
    [
        ("node2", {"node1": (0, 1, 2, 3), "node3": (0, 1)}),
        # Excluding a slot removes only that slot, never the whole host.
        ("node1:3", {"node1": (0, 1, 2), "node2": (0, 1, 2, 3), "node3": (0, 1)}),
        ("node1:0-2@node3:1", {"node1": (3,), "node2": (0, 1, 2, 3), "node3": (0,)}),
        # All slots of a host excluded: the host is gone.
        ("node3:0,1", {"node1": (0, 1, 2, 3), "node2": (0, 1, 2, 3)}),
    ],
)
def test_exclude(exclude, expected):
    assert pick(exclude=exclude) == expected


def test_ipv6_hosts_in_brackets():
    hosts = [Host("::1", (0, 1)), Host("fe80::2", (0, 1, 2))]
    assert pick(include="[fe80::2]:1-2", hosts=hosts) == {"fe80::2": (1, 2)}
    assert pick(include="[::1]", hosts=hosts) == {"::1": (0, 1)}
    assert pick(exclude="[::1]:0@[fe80::2]", hosts=hosts) == {"::1": (1,)}
    with pytest.raises(UsageError) as info:
        pick(include="fe80::2:1", hosts=hosts)
    assert "IPv6 hosts in brackets" in info.value.hint
    with pytest.raises(UsageError, match="without"):
        pick(include="[::1:0", hosts=hosts)


def test_selected_slots_keep_their_indices():
    hosts = [Host("a", (2, 5, 7))]
    assert pick(include="a:7,5", hosts=hosts) == {"a": (5, 7)}
    assert pick(exclude="a:2", hosts=hosts) == {"a": (5, 7)}
    with pytest.raises(UsageError) as info:
        pick(include="a:6", hosts=hosts)
    assert info.value.message == "--include: a has no slot 6"
    assert info.value.hint == "a has slots 2,5,7"


def test_num_nodes_and_num_gpus():
    assert pick(num_nodes=2) == {"node1": (0, 1, 2, 3), "node2": (0, 1, 2, 3)}
    assert pick(num_gpus=2) == {"node1": (0, 1), "node2": (0, 1), "node3": (0, 1)}
    assert pick(num_nodes=1, num_gpus=3) == {"node1": (0, 1, 2)}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"include": "node1", "exclude": "node2"},
            "--include and --exclude cannot be used together",
        ),
        ({"include": "node1", "num_nodes": 1}, "--num-nodes cannot be combined with --include"),
        ({"include": "node1", "num_gpus": 1}, "--num-gpus cannot be combined with --include"),
        ({"exclude": "node1", "num_gpus": 1}, "--num-gpus cannot be combined with --exclude"),
        ({"include": "node9"}, "--include: host 'node9' is not in the hostfile"),
        ({"exclude": "nodeX"}, "--exclude: host 'nodeX' is not in the hostfile"),
        ({"include": "node1:4"}, "--include: node1 has no slot 4"),
        ({"include": "node3:1-5"}, "--include: node3 has no slot 5"),
        # Slots are checked for --exclude too: a typo must not silently exclude nothing.
        ({"exclude": "node3:2"}, "--exclude: node3 has no slot 2"),
        ({"include": "node1:a"}, "--include: bad slot 'a' in 'node1:a'"),
        ({"include": "node1:"}, "--include: bad slot '' in 'node1:'"),
        ({"include": "node1:1,,2"}, "--include: bad slot '' in 'node1:1,,2'"),
        ({"include": "node1:-1"}, "--include: bad slot '-1' in 'node1:-1'"),
        ({"include": "node1:3-1"}, "--include: empty slot range '3-1' in 'node1:3-1'"),
        ({"include": "node1@@node2"}, "--include 'node1@@node2': empty host between '@'"),
        ({"include": "node1@"}, "--include 'node1@': empty host between '@'"),
        ({"include": " "}, "--include is empty"),
        ({"exclude": "node1@node2@node3"}, "--exclude 'node1@node2@node3' leaves no hosts"),
        ({"exclude": "node1:0-3@node2@node3:0,1"}, "leaves no hosts to run on"),
        ({"num_nodes": 4}, "--num-nodes 4 asks for more hosts than the 3 available"),
        ({"num_nodes": 0}, "--num-nodes must be 1 or more, got 0"),
        ({"num_gpus": 0}, "--num-gpus must be 1 or more, got 0"),
        ({"num_gpus": 3}, "--num-gpus 3 asks for more slots than some hosts have (node3 has 2)"),
    ],
)
def test_errors(kwargs, message):
    err = usage_error(**kwargs)
    assert message in err.message
    assert err.hint


def test_unknown_host_suggests_the_nearest():
    assert usage_error(include="nod1").hint == "did you mean 'node1'?"
    assert usage_error(include="gpu7").hint == "hosts are: node1, node2, node3"


def test_huge_range_fails_fast():
    start = time.perf_counter()
    err = usage_error(include="node1:0-999999999999")
    assert time.perf_counter() - start < 0.5
    assert err.message == "--include: node1 has no slot 999999999999"


def test_parse_selector_mapping():
    assert parse_selector("node1:0-1@node3", HOSTS, "--include") == {
        "node1": frozenset({0, 1}),
        "node3": frozenset({0, 1}),
    }


# ---- properties -----------------------------------------------------------------------------


@st.composite
def hosts_and_choice(draw):
    """A hostfile and a random subset of its (host, slot) pairs, written as a selector."""
    count = draw(st.integers(1, 5))
    hosts = [Host(f"n{i}", tuple(range(draw(st.integers(1, 6))))) for i in range(count)]
    pairs = [(h.name, s) for h in hosts for s in h.slots]
    chosen = draw(st.sets(st.sampled_from(pairs), min_size=1))
    terms = []
    for host in draw(st.permutations(hosts)):
        slots = sorted(s for name, s in chosen if name == host.name)
        if not slots:
            continue
        if slots == list(host.slots) and draw(st.booleans()):
            terms.append(host.name)  # the whole host, by name alone
        else:
            terms.append(f"{host.name}:{','.join(map(str, draw(st.permutations(slots))))}")
    return hosts, chosen, "@".join(terms)


def pairs_of(hosts):
    return {(h.name, s) for h in hosts for s in h.slots}


@settings(max_examples=150, deadline=None)
@given(hosts_and_choice())
def test_include_and_exclude_partition_the_slots(case):
    hosts, chosen, selector = case
    everything = pairs_of(hosts)
    included = select_hosts(hosts, selector, None, None, None)
    assert pairs_of(included) == chosen
    if chosen == everything:
        with pytest.raises(UsageError, match="leaves no hosts"):
            select_hosts(hosts, None, selector, None, None)
        return
    excluded = select_hosts(hosts, None, selector, None, None)
    assert pairs_of(excluded) == everything - chosen
    # Both keep hostfile order and ascending slots: that is the rank order.
    order = [h.name for h in hosts]
    for result in (included, excluded):
        names = [h.name for h in result]
        assert names == sorted(names, key=order.index)
        assert all(list(h.slots) == sorted(h.slots) and h.slots for h in result)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=6), st.data())
def test_num_nodes_num_gpus_take_prefixes(slot_counts, data):
    hosts = [Host(f"h{i}", tuple(range(n))) for i, n in enumerate(slot_counts)]
    nodes = data.draw(st.integers(1, len(hosts)))
    gpus = data.draw(st.integers(1, min(slot_counts[:nodes])))
    result = select_hosts(hosts, None, None, nodes, gpus)
    assert [h.name for h in result] == [h.name for h in hosts[:nodes]]
    assert all(h.slots == tuple(range(gpus)) for h in result)
