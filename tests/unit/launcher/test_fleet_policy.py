"""The next attempt's hosts when the fleet changes (zlaunch/launcher/fleet_policy.py): a table
of fleets, each with the sets the launcher hands in and the hosts that must come out."""

from __future__ import annotations

import pytest

from zlaunch.launcher.fleet_policy import BelowMinimum, Fleet, NodeRange, next_fleet

LISTED = ("n1", "n2", "n3", "n4", "n5")

# (current, range, leaving, ready, swap_out, grow) -> expected
CASES = [
    pytest.param(
        ("n1", "n2", "n3"),
        (2, 3),
        {"n2"},
        (),
        (),
        False,
        Fleet(("n1", "n3"), (), ("n2",)),
        id="lost-host-shrinks",
    ),
    pytest.param(
        ("n1", "n2", "n3"),
        (2, 3),
        {"n2"},
        {"n4"},
        (),
        False,
        Fleet(("n1", "n3", "n4"), ("n4",), ("n2",)),
        id="spare-replaces-lost",
    ),
    pytest.param(
        ("n1", "n3"),
        (2, 3),
        (),
        {"n2"},
        (),
        True,
        Fleet(("n1", "n2", "n3"), ("n2",), ()),
        id="returned-host-grows-back-in-hostfile-order",
    ),
    pytest.param(
        ("n1", "n3"),
        (2, 3),
        (),
        {"n2"},
        (),
        False,
        Fleet(("n1", "n3")),
        id="ready-host-waits-without-grow",
    ),
    pytest.param(
        ("n1", "n3"),
        (2, 3),
        (),
        {"n2", "n4", "n5"},
        (),
        True,
        Fleet(("n1", "n2", "n3"), ("n2",), ()),
        id="grow-stops-at-max",
    ),
    pytest.param(
        ("n1", "n2", "n3"),
        (2, 3),
        {"n3"},
        {"n3"},
        (),
        True,
        Fleet(("n1", "n2"), (), ("n3",)),
        id="leaving-host-never-rejoins-the-same-restart",
    ),
    pytest.param(
        ("n1", "n2", "n3"),
        (2, 3),
        {"n2", "n3"},
        (),
        (),
        False,
        BelowMinimum(("n1",), 2, ("n2", "n3")),
        id="below-min-stops",
    ),
    pytest.param(
        ("n1", "n2", "n3"),
        (1, 3),
        {"n2", "n3"},
        (),
        (),
        False,
        Fleet(("n1",), (), ("n2", "n3")),
        id="down-to-min-goes-on",
    ),
    pytest.param(
        ("n1", "n2", "n3"),
        (2, 3),
        (),
        {"n4"},
        {"n2"},
        False,
        Fleet(("n1", "n3", "n4"), ("n4",), ("n2",)),
        id="slow-host-swapped-for-a-spare",
    ),
    pytest.param(
        ("n1", "n2", "n3"),
        (2, 3),
        (),
        (),
        {"n2"},
        False,
        Fleet(("n1", "n2", "n3")),
        id="slow-host-kept-without-a-spare",
    ),
    pytest.param(
        ("n1", "n2", "n3"),
        (2, 3),
        {"n1"},
        {"n4", "n5"},
        {"n2"},
        False,
        Fleet(("n3", "n4", "n5"), ("n4", "n5"), ("n1", "n2")),
        id="lost-and-slow-both-replaced",
    ),
    pytest.param(
        ("n1", "n2", "n9"),
        (2, 3),
        (),
        {"n4"},
        (),
        False,
        Fleet(("n1", "n2", "n4"), ("n4",), ("n9",)),
        id="host-gone-from-the-hostfile-leaves",
    ),
    pytest.param(
        ("n4", "n5"),
        (1, 2),
        (),
        {"n1"},
        (),
        True,
        Fleet(("n4", "n5")),
        id="already-at-max",
    ),
]


@pytest.mark.parametrize("current,nodes,leaving,ready,swap_out,grow,expected", CASES)
def test_next_fleet(current, nodes, leaving, ready, swap_out, grow, expected):
    got = next_fleet(
        current,
        LISTED,
        NodeRange(*nodes),
        leaving=leaving,
        ready=ready,
        swap_out=swap_out,
        grow=grow,
    )
    assert got == expected


@pytest.mark.parametrize("bad", [(0, 2), (3, 2), (-1, 1)])
def test_a_node_range_needs_one_to_max(bad):
    with pytest.raises(ValueError, match="1 <= MIN <= MAX"):
        NodeRange(*bad)
