"""ZeRO stage 3: fetch parameters around each module, prefetch by trace, reduce gradients.

`Stage3Coordinator` hooks the model:

* forward pre-hook of every module owning (non-persistent) units: fetch them (all-gather, or
  wait for the prefetch already in flight), then launch the prefetch of what the recorded
  trace says comes next, within ``stage3_prefetch_bucket_size`` elements and
  ``stage3_max_live_parameters`` gathered elements;
* forward post-hook: release them, unless the trace says they are used again within
  ``stage3_max_reuse_distance`` elements of fetches (and the live bound allows keeping them);
  and hook the module's output tensors so that their gradient (which autograd computes just
  before the module's backward) fetches the units again;
* post-accumulate-grad hook of every parameter: copy the gradient into the unit's staging
  buffer; when the unit has all its gradients, reduce-scatter it asynchronously into this
  rank's gradient shard (at most two reductions in flight with ``overlap_comm``, one without)
  and release the unit.

Beyond that (see the modules named):

* a parameter read by forward code without its module being called (``out_proj.weight`` in
  ``nn.MultiheadAttention``) is fetched on the read and released when the module that read it
  returns (`stage3_access`);
* forward hooks are always-called, and a forward that runs inside backward (activation
  checkpointing recomputing a block, reentrant or not, stopped early or not) never releases
  what backward still needs;
* a unit gathered before an optimizer step is never used after it: fetching a unit whose
  buffer predates the last step gathers it again;
* leaf modules (`leaf_modules`: mixture-of-experts layers) are one unit, reduced at the end
  of backward in the same order on every rank;
* every rank's collectives are checked to pair up (`stage3_sequence`).

The *trace* is the sequence of unit fetches of the last complete forward+backward pass. When
a pass departs from it (data-dependent control flow), prefetching and keeping stop for the rest
of that pass (fetches are on demand, one log line the first time) and that pass becomes the
new trace. Every rank must run the same modules in the same order (as with FSDP and DeepSpeed):
collectives are issued in execution order.

The engine builds all this with `stage3_build.build_stage3`.
"""

from __future__ import annotations

import functools
import logging
import math

import torch

from ..comm import Communicator, Handle
from . import stage3_access
from .partition import FlatLayout
from .stage3_sequence import CollectiveSequence
from .stage3_units import Unit, UnitState

__all__ = ["Stage3Coordinator"]

log = logging.getLogger("runtime.zero.stage3")


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _in_backward_pass() -> bool:
    """True while autograd runs a backward on this thread (activation recomputation)."""
    return torch._C._current_graph_task_id() != -1


class _SavedInUnit:
    __slots__ = ("unit", "tensor")

    def __init__(self, unit: Unit, tensor: torch.Tensor):
        self.unit = unit
        self.tensor = tensor


class Stage3Coordinator:
    def __init__(
        self,
        module: torch.nn.Module,
        units: list[Unit],
        layout: FlatLayout,
        comm: Communicator,
        zero,
        grad_dtype: torch.dtype,
        device: torch.device,
    ):
        self.module = module
        self.units = units
        self.layout = layout
        self.comm = comm
        self.prefetch_numel = int(zero.stage3_prefetch_bucket_size)
        self.max_live = int(zero.stage3_max_live_parameters)
        self.max_reuse = int(zero.stage3_max_reuse_distance)
        self.max_inflight_reductions = 2 if zero.overlap_comm else 0
        self.optimizer = None
        self.grad_shard = torch.zeros(layout.shard_numel, dtype=grad_dtype, device=device)
        self._owned = []
        off = 0
        for g in layout.groups:
            self._owned.append(self.grad_shard.narrow(0, off, g.shard_numel))
            off += g.shard_numel
        self.live_numel = sum(u.numel for u in units if not u.persistent and u.gathered)
        self.peak_live_numel = self.live_numel
        self._trace: list[int] | None = None
        self._reuse_distance: list[float] = []
        self._events: list[int] = []
        self._on_trace = False
        self._warned_divergence = False
        self._in_backward = False
        self._bwd_seen: set[int] = set()
        self._frozen_in_backward: list[Unit] = []
        self._reductions: list[tuple[Handle, list[torch.Tensor]]] = []
        # Staging and receive buffers by size, reused within one backward (units of a repeated
        # layer have the same size) and dropped after it, so nothing stays between steps.
        self._pool: dict[int, list[torch.Tensor]] = {}
        self._by_storage: dict[int, Unit] = {}
        self._saved_hooks: list = []
        for u in units:
            u.coordinator = self
        self._version = 0
        """Optimizer steps taken: a gathered unit of an older version is stale."""
        self._frames: list[list[Unit]] = []
        """Per module running forward (innermost last): the units it fetched by reading them."""
        self._ran_leaves: set[int] = set()
        self.sequence = CollectiveSequence(comm, units)
        self._hooks = []
        for m, mine in _unit_owners(module, units):
            if m is module:
                self._hooks.append(m.register_forward_pre_hook(self._begin_pass, prepend=True))
            if mine:
                self._hooks.append(
                    m.register_forward_pre_hook(functools.partial(self._pre_forward, mine))
                )
                self._hooks.append(
                    m.register_forward_hook(
                        functools.partial(self._post_forward, mine), always_call=True
                    )
                )
        self._hooks.append(module.register_forward_hook(self._end_forward, always_call=True))
        for u in units:
            for i, p in enumerate(u.params):
                if p.requires_grad:
                    self._hooks.append(p.register_hook(functools.partial(self._grad_arriving, u)))
                    self._hooks.append(
                        p.register_post_accumulate_grad_hook(
                            functools.partial(self._grad_ready, u, i)
                        )
                    )
        stage3_access.install(module, self._on_read)

    # ------------------------------------------------------------------ gather / release
    def _gather(self, u: Unit) -> None:
        if u.state is UnitState.RELEASED:
            self._make_room(u.numel)
            self.sequence.record("fetch", u)
            u.start_gather(self.comm)
            u.version = self._version
            self._by_storage[u.full.untyped_storage().data_ptr()] = u
            self.live_numel += u.numel
            self.peak_live_numel = max(self.peak_live_numel, self.live_numel)
        elif u.version != self._version and not u.persistent:
            # Gathered before the last optimizer step (held across it): gather it again in
            # place, so no forward ever computes with the old weights.
            u.wait()
            self.sequence.record("fetch", u)
            u.regather(self.comm)
            u.version = self._version

    def _release(self, u: Unit) -> None:
        if u.persistent or u.state is UnitState.RELEASED:
            return
        self._by_storage.pop(u.full.untyped_storage().data_ptr(), None)
        u.release()
        self.live_numel -= u.numel

    def _make_room(self, numel: int) -> None:
        """Release kept (idle) units, oldest first, until ``numel`` more fits the live bound."""
        if self.live_numel + numel <= self.max_live:
            return
        idle = [
            u
            for u in self.units
            if not u.persistent and u.gathered and u.users == 0 and not u.bwd_hold
        ]
        for u in sorted(idle, key=lambda v: v.last_pos):
            if self.live_numel + numel <= self.max_live:
                break
            self._release(u)

    def release_all(self) -> None:
        for u in self.units:
            if u.users == 0:
                self._release(u)

    # ------------------------------------------------------------------ trace
    def _record(self, u: Unit) -> None:
        pos = len(self._events)
        self._events.append(u.index)
        u.last_pos = pos
        if self._on_trace and (pos >= len(self._trace) or self._trace[pos] != u.index):
            self._on_trace = False
            self.sequence.mark_diverged()
            if not self._warned_divergence and self.comm.rank == 0:
                log.info(
                    "stage 3: the modules ran in a different order than in the recorded trace "
                    "(fetch %d); fetching parameters on demand until the order is stable again",
                    pos,
                )
            self._warned_divergence = True

    def _adopt_trace(self) -> None:
        events = self._events
        if self._trace == events:
            return
        self._trace = list(events)
        numels = [self.units[i].numel for i in events]
        cum = [0]
        for n in numels:
            cum.append(cum[-1] + n)
        nxt: dict[int, int] = {}
        dist = [math.inf] * len(events)
        for pos in range(len(events) - 1, -1, -1):
            j = nxt.get(events[pos])
            if j is not None:
                dist[pos] = cum[j] - cum[pos + 1]
            nxt[events[pos]] = pos
        self._reuse_distance = dist

    def _prefetch(self) -> None:
        if not self._on_trace or self.prefetch_numel <= 0:
            return
        trace, pos, budget = self._trace, len(self._events), self.prefetch_numel
        while pos < len(trace):
            v = self.units[trace[pos]]
            budget -= v.numel
            if budget < 0:
                break
            if v.state is UnitState.RELEASED:
                if self.live_numel + v.numel > self.max_live:
                    break
                self._gather(v)
            pos += 1

    def _fetch(self, u: Unit) -> None:
        self._record(u)
        self._gather(u)
        self._prefetch()
        u.wait()

    # ------------------------------------------------------------------ module hooks
    def _begin_pass(self, module, args) -> None:
        self._saved_hooks.append(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
        self._saved_hooks[-1].__enter__()
        self._frames.append([])
        if self._in_backward or _in_backward_pass():
            return
        # Units kept by a forward whose backward never came are released here.
        self.release_all()
        self._events = []
        self._on_trace = self._trace is not None
        self._bwd_seen.clear()
        self._ran_leaves.clear()

    def _end_forward(self, module, args, output) -> None:
        if self._saved_hooks:
            self._saved_hooks.pop().__exit__(None, None, None)
        self._return_borrowed(in_backward=_in_backward_pass())
        if _in_backward_pass() or self._in_backward:
            return
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in _tensors(output)):
            # No backward follows this forward (evaluation): the pass ends here.
            self.release_all()
            self.sequence.end_pass("forward")

    # Parameters read without their module being called (stage3_access): fetched for the
    # innermost module running forward and released when it returns. Outside forward a
    # released parameter stays empty, as in DeepSpeed: use GatheredParameters there.
    def _on_read(self, p) -> None:
        u = getattr(p, "_zero_owner", None)
        if not self._frames or type(u) is not Unit:
            return
        if u.gathered and (u.version == self._version or u.persistent):
            return
        self._fetch(u)
        u.users += 1
        self._frames[-1].append(u)
        if self._in_backward or _in_backward_pass():
            u.bwd_hold = u.bwd_hold or not u.frozen

    def _return_borrowed(self, in_backward: bool) -> None:
        if not self._frames:
            return
        for u in self._frames.pop():
            u.users -= 1
            self._after_use(u, keep=False, in_backward=in_backward)

    def _after_use(self, u: Unit, keep: bool, in_backward: bool) -> None:
        """A module using ``u`` returned: release it unless something still needs it."""
        if u.users > 0 or u.persistent:
            return
        if in_backward:
            # A forward recomputed inside backward (activation checkpointing): backward is
            # about to use these weights. Trained units go when their gradients are reduced;
            # frozen ones when backward moves on to another module.
            if u.frozen and u not in self._frozen_in_backward:
                self._frozen_in_backward.append(u)
            return
        if (
            keep
            and u.last_pos < len(self._reuse_distance)
            and self._reuse_distance[u.last_pos] <= self.max_reuse
            and self.live_numel <= self.max_live
        ):
            return
        self._release(u)

    # Tensors autograd saves during forward that live in a unit's gathered buffer (weights, or
    # views of them such as ``weight.t()``) are tagged with their unit; unpacking one in
    # backward fetches the unit if it was released. The output-gradient hooks below normally
    # fetch first (with prefetch); this makes backward correct even for modules whose outputs
    # those hooks cannot see (outputs wrapped in objects that are not tensors, lists or dicts).
    def _pack(self, t):
        try:
            unit = self._by_storage.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            return t
        return t if unit is None else _SavedInUnit(unit, t)

    def _unpack(self, saved):
        if type(saved) is not _SavedInUnit:
            return saved
        u = saved.unit
        if not u.gathered:
            self._start_backward()
            u.bwd_hold = True
            self._fetch(u)
        return saved.tensor

    def _pre_forward(self, units: list[Unit], module, args) -> None:
        self._frames.append([])
        for u in units:
            self._fetch(u)
            u.users += 1
            if u.leaf is not None:
                self._ran_leaves.add(u.index)

    def _post_forward(self, units: list[Unit], module, args, output) -> None:
        in_backward = self._in_backward or _in_backward_pass()
        self._return_borrowed(in_backward)
        for u in units:
            u.users -= 1
        if torch.is_grad_enabled():
            hook = functools.partial(self._pre_backward, units, id(module))
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(hook)
        keep = self._on_trace and torch.is_grad_enabled()
        for u in units:
            self._after_use(u, keep, in_backward)

    def _pre_backward(self, units: list[Unit], module_id: int, grad) -> None:
        self._start_backward()
        if module_id in self._bwd_seen:
            return
        self._bwd_seen.add(module_id)
        # Frozen units get no gradient that would say their module's backward is done: the
        # ones fetched for an earlier module are released when backward reaches the next one
        # (should autograd still need one, unpacking its saved tensors fetches it again).
        for u in self._frozen_in_backward:
            if u not in units:
                u.bwd_hold = False
                if u.users == 0:
                    self._release(u)
        self._frozen_in_backward = [u for u in units if u.frozen]
        for u in units:
            u.bwd_hold = True
            self._fetch(u)

    # ------------------------------------------------------------------ gradients
    def _start_backward(self) -> None:
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _grad_arriving(self, u: Unit, grad) -> None:
        """Before a gradient is accumulated: its parameter must have its full shape again."""
        if not u.gathered:
            self._start_backward()
            u.bwd_hold = True
            self._fetch(u)

    def _grad_ready(self, u: Unit, i: int, p: torch.Tensor) -> None:
        grad = p.grad
        if grad is None:
            return
        self._start_backward()
        if u.staging is None:
            u.staging = self._take(u.numel)
            if u.group.numel < u.numel:
                u.staging[u.group.numel :].zero_()
        slot = u.group.slots[i]
        view = u.staging[slot.offset : slot.end]
        if u.arrived[i]:
            view.add_(grad.reshape(-1))
        else:
            view.copy_(grad.reshape(-1))
            u.arrived[i] = True
            u.n_arrived += 1
        p.grad = None
        # A leaf's parameters may get no gradient on some ranks (unused experts): it is
        # reduced at the end of backward, in unit order on every rank, never on arrival.
        if u.n_arrived == u.expected_grads and u.leaf is None:
            self._reduce(u)
            u.bwd_hold = False
            if u.users == 0:
                self._release(u)

    def _take(self, numel: int) -> torch.Tensor:
        free = self._pool.get(numel)
        if free:
            return free.pop()
        return torch.empty(numel, dtype=self.grad_shard.dtype, device=self.grad_shard.device)

    def _wait_oldest_reduction(self) -> None:
        handle, buffers = self._reductions.pop(0)
        handle.wait()
        for b in buffers:
            self._pool.setdefault(b.numel(), []).append(b)

    def _reduce(self, u: Unit) -> None:
        if u.staging is None:  # a leaf that got no gradient on this rank: it adds zeros
            u.staging = self._take(u.numel).zero_()
        staging, u.staging = u.staging, None
        # Gradients arriving later in this backward (a weight used again in a block that
        # reentrant checkpointing recomputes separately) start a new partial sum, reduced
        # with accumulation into the same shard.
        u.arrived = [False] * len(u.params)
        u.n_arrived = 0
        self.sequence.record("reduce", u)
        scratch = self._take(u.numel) if self.comm.needs_reduce_scatter_scratch else None
        handle = self.comm.reduce_scatter(
            self._owned[u.index], staging, scratch=scratch, accumulate=True, async_op=True
        )
        self._reductions.append((handle, [b for b in (staging, scratch) if b is not None]))
        while len(self._reductions) > self.max_inflight_reductions:
            self._wait_oldest_reduction()

    def _end_backward(self) -> None:
        """After autograd finishes: reduce partial units, wait, release, adopt the trace."""
        if not self._in_backward:
            return
        for u in self.units:
            ran_leaf = u.leaf is not None and u.index in self._ran_leaves and not u.frozen
            if (u.n_arrived > 0 and u.staging is not None) or ran_leaf:
                if u.staging is not None:
                    for i, arrived in enumerate(u.arrived):
                        if not arrived:
                            s = u.group.slots[i]
                            u.staging[s.offset : s.end].zero_()
                self._reduce(u)
        while self._reductions:
            self._wait_oldest_reduction()
        self._pool.clear()
        for u in self.units:
            u.reset_grads()
            u.bwd_hold = False
        self._frozen_in_backward = []
        self._ran_leaves.clear()
        self.release_all()
        if not self._on_trace or self._trace is None or len(self._events) != len(self._trace):
            self._adopt_trace()
        self._in_backward = False
        self.sequence.end_pass("backward")

    # ------------------------------------------------------------------ engine interface
    def prepare(self, boundary: bool) -> None:  # noqa: ARG002 - reduced every micro-step
        pass

    def finish(self) -> None:
        self._end_backward()

    def owned_grads(self) -> list[torch.Tensor]:
        return self._owned

    def zero(self) -> None:
        self.grad_shard.zero_()

    def bucket_bytes(self) -> int:
        return 0

    def after_step(self) -> None:
        """The shards changed: drop stale gathered copies, refresh the persistent units."""
        self._version += 1
        for u in self.units:
            if u.persistent:
                lo, hi = u.group.shard_range(self.comm.rank)
                own = u.full[lo:hi]
                u.store.load_into(u.group, own)
                self.comm.all_gather(u.full, own)
                u.version = self._version
            elif u.users == 0:
                self._release(u)

    # ------------------------------------------------------------------ GatheredParameters
    def user_gather(self, u: Unit) -> None:
        u.users += 1
        self._gather(u)
        u.wait()

    def user_release(self, u: Unit, modifier_rank: int | None) -> None:
        if modifier_rank is not None:
            self.comm.broadcast(u.full, src=modifier_rank)
            lo, hi = u.group.shard_range(self.comm.rank)
            u.store.write_from(u.group, u.full[lo:hi])
            opt = self.optimizer
            if opt is not None and not opt.masters_are_views and not u.frozen:
                opt.master[u.index].copy_(u.store.shard(u.group))
        u.users -= 1
        if u.users == 0 and not self._in_backward:
            self._release(u)

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        stage3_access.uninstall(self.module)


def _unit_owners(module: torch.nn.Module, units: list[Unit]):
    """(module, the non-persistent units its forward fetches) for every module, in order.

    A module fetches the units of the parameters it holds directly (a tied weight: every
    module holding it); a leaf module fetches its whole subtree's units, and the modules
    inside a leaf fetch nothing of their own (the leaf did).
    """
    unit_of = {id(p): u for u in units for p in u.params}
    leaves = {u.leaf for u in units if u.leaf is not None}
    inside = tuple(n + "." for n in leaves)
    out = []
    for name, m in module.named_modules():
        if "" in leaves and m is not module:
            continue
        if name in leaves:
            mine = [u for u in units if u.leaf == name and not u.persistent]
        elif inside and name.startswith(inside):
            continue
        else:
            mine = []
            for p in m._parameters.values():
                u = unit_of.get(id(p)) if p is not None else None
                if u is not None and not u.persistent and u not in mine:
                    mine.append(u)
        out.append((m, mine))
    return out
