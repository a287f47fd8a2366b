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
from .partition import FlatLayout
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
        self._hooks = []
        unit_of = {id(p): u for u in units for p in u.params}
        for m in module.modules():
            mine: list[Unit] = []
            for p in m._parameters.values():
                u = unit_of.get(id(p)) if p is not None else None
                if u is not None and not u.persistent and u not in mine:
                    mine.append(u)
            if m is module:
                self._hooks.append(m.register_forward_pre_hook(self._begin_pass, prepend=True))
            if mine:
                self._hooks.append(
                    m.register_forward_pre_hook(functools.partial(self._pre_forward, mine))
                )
                self._hooks.append(
                    m.register_forward_hook(functools.partial(self._post_forward, mine))
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

    # ------------------------------------------------------------------ gather / release
    def _gather(self, u: Unit) -> None:
        if u.state is UnitState.RELEASED:
            self._make_room(u.numel)
            u.start_gather(self.comm)
            self._by_storage[u.full.untyped_storage().data_ptr()] = u
            self.live_numel += u.numel
            self.peak_live_numel = max(self.peak_live_numel, self.live_numel)

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
        if self._in_backward:
            return
        # Units kept by a forward whose backward never came are released here.
        self.release_all()
        self._events = []
        self._on_trace = self._trace is not None
        self._bwd_seen.clear()

    def _end_forward(self, module, args, output) -> None:
        if self._saved_hooks:
            self._saved_hooks.pop().__exit__(None, None, None)
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in _tensors(output)):
            self.release_all()

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
        for u in units:
            self._fetch(u)
            u.users += 1

    def _post_forward(self, units: list[Unit], module, args, output) -> None:
        for u in units:
            u.users -= 1
        if torch.is_grad_enabled():
            hook = functools.partial(self._pre_backward, units, id(module))
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(hook)
        keep = self._on_trace and torch.is_grad_enabled()
        for u in units:
            if u.users > 0:
                continue
            if (
                keep
                and u.last_pos < len(self._reuse_distance)
                and self._reuse_distance[u.last_pos] <= self.max_reuse
                and self.live_numel <= self.max_live
            ):
                continue
            self._release(u)

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
        if u.n_arrived < 0:
            raise RuntimeError(
                "stage 3: a gradient arrived for parameters already reduced in this backward; "
                "call engine.backward() once per forward (no retain_graph re-use)"
            )
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
        if u.n_arrived == u.expected_grads:
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
        staging, u.staging = u.staging, None
        u.n_arrived = -1  # reduced; later arrivals in this pass would be a bug, not a gradient
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
            if u.n_arrived > 0 and u.staging is not None:
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
        self.release_all()
        if not self._on_trace or self._trace is None or len(self._events) != len(self._trace):
            self._adopt_trace()
        self._in_backward = False

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
        for u in self.units:
            if u.persistent:
                lo, hi = u.group.shard_range(self.comm.rank)
                own = u.full[lo:hi]
                u.store.load_into(u.group, own)
                self.comm.all_gather(u.full, own)
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
