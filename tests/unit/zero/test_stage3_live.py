"""Stage 3's pieces without ranks: which module fetches which units and the hooks registered
(`hooks`), and gathering under the live bound (`live.LiveUnits`), on one rank
with a communicator that only copies."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from runtime.zero.param_offload import ShardStore
from runtime.zero.stage3.fetch import UnitFetch
from runtime.zero.stage3.hooks import install_hooks, tensors_in, unit_owners
from runtime.zero.stage3.live import LiveUnits, SavedInUnit
from runtime.zero.stage3.prefetch import FetchPlanner
from runtime.zero.stage3.units import Unit, UnitState, plan_units


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.each = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x):
        return sum(e(x) for e in self.each)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4, bias=False)
        self.experts = Experts()
        self.b = torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.b(self.experts(self.a(x)))


def _fake_units(model):
    return [
        SimpleNamespace(params=[model.a.weight], leaf=None, persistent=False),
        SimpleNamespace(
            params=list(model.experts.parameters()),
            leaf="experts",
            persistent=False,
        ),
        SimpleNamespace(params=[model.b.weight], leaf=None, persistent=False),
    ]


def test_unit_owners_leaf_fetches_its_subtree_and_its_children_nothing():
    model = Net()
    units = _fake_units(model)
    owners = {id(m): mine for m, mine in unit_owners(model, units)}
    assert owners[id(model)] == []
    assert owners[id(model.a)] == [units[0]]
    assert owners[id(model.experts)] == [units[1]]
    assert owners[id(model.b)] == [units[2]]
    assert id(model.experts.each[0]) not in owners  # inside the leaf: fetched by the leaf


def test_unit_owners_skip_persistent_units():
    model = Net()
    units = _fake_units(model)
    units[0].persistent = True
    owners = {id(m): mine for m, mine in unit_owners(model, units)}
    assert owners[id(model.a)] == []


def test_tensors_in_nested_outputs():
    a, b, c = torch.zeros(1), torch.ones(1), torch.zeros(2)
    found = list(tensors_in({"x": [a, (b,)], "y": c, "n": 3}))
    assert len(found) == 3 and all(t is x for t, x in zip(found, (a, b, c), strict=True))


class Recorder:
    def __init__(self):
        self.calls = []

    def begin_pass(self, module, args):
        self.calls.append(("begin",))

    def end_forward(self, module, args, output):
        self.calls.append(("end",))

    def pre_forward(self, units, module, args):
        self.calls.append(("pre", len(units)))

    def post_forward(self, units, module, args, output):
        self.calls.append(("post", len(units)))

    def grad_arriving(self, u, grad):
        self.calls.append(("arriving", u.leaf))

    def grad_ready(self, u, i, p):
        self.calls.append(("ready", u.leaf, i))


def test_install_hooks_order_and_removal():
    model = Net()
    units = _fake_units(model)
    rec = Recorder()
    hooks = install_hooks(model, units, rec)
    model(torch.ones(1, 4)).sum().backward()
    forward = [c for c in rec.calls if c[0] in ("begin", "pre", "post", "end")]
    assert forward == [
        ("begin",),
        ("pre", 1),
        ("post", 1),
        ("pre", 1),
        ("post", 1),
        ("pre", 1),
        ("post", 1),
        ("end",),
    ]
    ready = [c for c in rec.calls if c[0] == "ready"]
    assert sorted(ready, key=str) == sorted(
        [("ready", None, 0), ("ready", None, 0)] + [("ready", "experts", i) for i in range(4)],
        key=str,
    )
    for h in hooks:
        h.remove()
    rec.calls.clear()
    model(torch.ones(1, 4)).sum().backward()
    assert rec.calls == []


class CopyComm:
    """One rank: the shard is the whole unit; every all-gather is counted."""

    rank = 0
    world_size = 1

    def __init__(self):
        self.gathers = 0

    def all_gather(self, full, own, async_op=False):
        self.gathers += 1
        full.copy_(own)
        return SimpleNamespace(wait=lambda: None) if async_op else None


class NoSequence:
    def record(self, kind, unit):
        pass

    def mark_diverged(self):
        pass


def _live(max_live, n_layers=3):
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8, bias=False) for _ in range(n_layers)])
    layout, plan = plan_units(model, [list(model.parameters())], 1, persistence_threshold=0)
    store = ShardStore(layout, 0, torch.float32, torch.device("cpu"))
    units = []
    for g, p in zip(layout.groups, plan, strict=True):
        u = Unit(g, p.params, p.persistent, store, p.leaf)
        store.write_from(g, u.full)
        u.release()
        units.append(u)
    planner = FetchPlanner([u.numel for u in units], 0, 0)
    comm = CopyComm()
    live = LiveUnits(units, comm, planner, max_live, UnitFetch(comm))
    live.sequence = NoSequence()
    return live, units, comm


def test_fetch_counts_live_elements_and_makes_room_oldest_first():
    live, units, _ = _live(max_live=2 * 64)
    live.planner.begin_pass()
    for u in units[:2]:
        live.fetch(u)
    assert live.numel == 128 and all(u.gathered for u in units[:2])
    live.fetch(units[2])  # over the bound: the least recently fetched idle unit goes
    assert [u.state for u in units] == [
        UnitState.RELEASED,
        UnitState.GATHERED,
        UnitState.GATHERED,
    ]
    assert live.numel == 128 and live.peak_numel == 128


def test_units_in_use_or_held_for_backward_are_not_released_to_make_room():
    live, units, _ = _live(max_live=64)
    live.planner.begin_pass()
    live.fetch(units[0])
    units[0].enter()
    live.fetch(units[1])
    units[1].hold_for_backward()
    live.fetch(units[2])
    assert all(u.gathered for u in units)
    assert live.peak_numel == 3 * 64
    live.release_all()  # only the unused ones
    assert [u.gathered for u in units] == [True, False, False]


def test_after_step_releases_idle_units_and_regathers_stale_ones_in_use():
    live, units, comm = _live(max_live=10**6)
    live.planner.begin_pass()
    live.fetch(units[0])
    live.fetch(units[1])
    units[1].enter()
    live.after_step()
    assert not units[0].gathered and units[1].gathered
    assert not live.is_current(units[1])
    before = comm.gathers
    live.gather(units[1])  # gathered before the step: gathered again, in place
    units[1].wait()
    assert comm.gathers == before + 1 and live.is_current(units[1])


def test_saved_tensors_in_a_gathered_buffer_are_tagged_with_their_unit():
    live, units, _ = _live(max_live=10**6)
    live.planner.begin_pass()
    live.fetch(units[0])
    view = units[0].params[0].t()
    saved = live.tag_saved(view)
    assert type(saved) is SavedInUnit and saved.unit is units[0] and saved.tensor is view
    other = torch.zeros(3)
    assert live.tag_saved(other) is other


def test_a_unit_s_counters_change_only_through_its_methods_and_never_below_zero():
    _, units, _ = _live(max_live=10**6, n_layers=1)
    (u,) = units
    u.enter()
    u.enter()
    assert (u.leave(), u.leave()) == (1, 0)
    with pytest.raises(RuntimeError, match="left by more users than entered it"):
        u.leave()
    trained = u.trainable.index(True)
    assert u.grad_arrived(trained) and not u.grad_arrived(trained)  # the second one adds
    assert u.n_arrived == 1
    u.reset_arrivals()
    assert u.n_arrived == 0 and not any(u.arrived)
    u.hold_for_backward()
    assert u.bwd_hold
    u.hold_for_backward(False)
    assert not u.bwd_hold
