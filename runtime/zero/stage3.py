"""ZeRO stage 3: fetch parameters around each module, prefetch by trace, reduce gradients.

`Stage3Coordinator` hooks the model:

* forward pre-hook of every module owning (non-persistent) units: fetch them (all-gather, or
  wait for the prefetch already in flight), then launch the prefetch the recorded trace
  suggests (`stage3_prefetch.FetchPlanner`);
* forward post-hook (always called, also when forward raises): release them unless the trace
  says they are used again soon; and hook the module's output tensors so that their gradient
  (which autograd computes just before the module's backward) fetches the units again;
* parameter hooks: a gradient about to be accumulated fetches its unit if it was released; an
  accumulated gradient goes to `stage3_grads.Stage3GradReducer`.

Beyond that:

* a parameter read by forward code without its module being called (``out_proj.weight`` in
  ``nn.MultiheadAttention``) is fetched on the read and released when the module that read it
  returns (`stage3_access`);
* a forward that runs inside backward (activation checkpointing recomputing a block, reentrant
  or not, stopped early or not) never releases what backward still needs;
* a unit gathered before an optimizer step is never used after it: fetching a unit whose
  buffer predates the last step gathers it again;
* leaf modules (`leaf_modules`: mixture-of-experts layers) are one unit each;
* every rank's collectives are checked to pair up (`stage3_sequence`).

The engine builds all this with `stage3_build.build_stage3`.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable

import torch

from ..comm import Communicator
from . import stage3_access
from .partition import FlatLayout
from .stage3_grads import Stage3GradReducer
from .stage3_prefetch import FetchPlanner
from .stage3_sequence import CollectiveSequence
from .stage3_units import Unit, UnitState

__all__ = ["Stage3Coordinator", "Phase"]

log = logging.getLogger("runtime.zero.stage3")


class Phase(enum.Enum):
    IDLE = "idle"
    FORWARD = "forward"
    BACKWARD = "backward"


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _autograd_running() -> bool:
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
        self.comm = comm
        self.max_live = int(zero.stage3_max_live_parameters)
        self.sequence = CollectiveSequence(comm, units)
        self.grads = Stage3GradReducer(
            layout, comm, self.sequence, grad_dtype, device, bool(zero.overlap_comm)
        )
        self.planner = FetchPlanner(
            [u.numel for u in units],
            int(zero.stage3_prefetch_bucket_size),
            int(zero.stage3_max_reuse_distance),
        )
        self.phase = Phase.IDLE
        self.shard_written: list[Callable[[Unit], None]] = []
        """Called when GatheredParameters wrote new values into a unit's shard."""
        self.live_numel = sum(u.numel for u in units if not u.persistent and u.gathered)
        self.peak_live_numel = self.live_numel
        self._version = 0
        """Optimizer steps taken: a gathered unit of an older version is stale."""
        self._warned_divergence = False
        self._bwd_seen: set[int] = set()
        self._frozen_in_backward: list[Unit] = []
        self._ran_leaves: set[int] = set()
        self._frames: list[list[Unit]] = []
        """Per module running forward (innermost last): the units it fetched by reading them."""
        self._by_storage: dict[int, Unit] = {}
        self._saved_hooks: list = []
        for u in units:
            u.coordinator = self
        self._hooks = self._install_hooks()
        stage3_access.install(module, self._on_read)

    def _install_hooks(self) -> list:
        module, hooks = self.module, []
        for m, mine in _unit_owners(module, self.units):
            if m is module:
                hooks.append(m.register_forward_pre_hook(self._begin_pass, prepend=True))
            if mine:
                hooks.append(m.register_forward_pre_hook(functools.partial(self._pre_forward, mine)))
                hooks.append(
                    m.register_forward_hook(
                        functools.partial(self._post_forward, mine), always_call=True
                    )
                )
        hooks.append(module.register_forward_hook(self._end_forward, always_call=True))
        for u in self.units:
            for i, p in enumerate(u.params):
                if p.requires_grad:
                    hooks.append(p.register_hook(functools.partial(self._grad_arriving, u)))
                    hooks.append(
                        p.register_post_accumulate_grad_hook(
                            functools.partial(self._grad_ready, u, i)
                        )
                    )
        return hooks

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
        for u in sorted(idle, key=lambda v: self.planner.last_pos.get(v.index, -1)):
            if self.live_numel + numel <= self.max_live:
                break
            self._release(u)

    def release_all(self) -> None:
        for u in self.units:
            if u.users == 0:
                self._release(u)

    def _fetch(self, u: Unit) -> None:
        if not self.planner.record(u.index):
            self.sequence.mark_diverged()
            if not self._warned_divergence and self.comm.rank == 0:
                log.info(
                    "stage 3: the modules ran in a different order than in the recorded trace "
                    "(fetch %d); fetching parameters on demand until the order is stable again",
                    len(self.planner.events) - 1,
                )
            self._warned_divergence = True
        self._gather(u)
        for i in self.planner.prefetch(
            fits=lambda i: self.live_numel + self.units[i].numel <= self.max_live,
            released=lambda i: self.units[i].state is UnitState.RELEASED,
        ):
            self._gather(self.units[i])
        u.wait()

    def _after_use(self, u: Unit, keep: bool) -> None:
        """A module using ``u`` returned: release it unless something still needs it."""
        if u.users > 0 or u.persistent:
            return
        if self.phase is Phase.BACKWARD or _autograd_running():
            # A forward recomputed inside backward (activation checkpointing): backward is
            # about to use these weights. Trained units go when their gradients are reduced;
            # frozen ones when backward moves on to another module.
            if u.frozen and u not in self._frozen_in_backward:
                self._frozen_in_backward.append(u)
            return
        if keep and self.planner.keep_after_use(u.index) and self.live_numel <= self.max_live:
            return
        self._release(u)

    # ------------------------------------------------------------------ forward hooks
    def _begin_pass(self, module, args) -> None:
        self._saved_hooks.append(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
        self._saved_hooks[-1].__enter__()
        self._frames.append([])
        if self.phase is Phase.BACKWARD or _autograd_running():
            return
        # Units kept by a forward whose backward never came are released here.
        self.release_all()
        self.phase = Phase.FORWARD
        self.planner.begin_pass()
        self._bwd_seen.clear()
        self._ran_leaves.clear()

    def _end_forward(self, module, args, output) -> None:
        if self._saved_hooks:
            self._saved_hooks.pop().__exit__(None, None, None)
        self._return_borrowed()
        if self.phase is Phase.BACKWARD or _autograd_running():
            return
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in _tensors(output)):
            # No backward follows this forward (evaluation): the pass ends here.
            self.release_all()
            self.phase = Phase.IDLE
            self.sequence.end_pass("forward")

    def _pre_forward(self, units: list[Unit], module, args) -> None:
        self._frames.append([])
        for u in units:
            self._fetch(u)
            u.users += 1
            if u.leaf is not None:
                self._ran_leaves.add(u.index)

    def _post_forward(self, units: list[Unit], module, args, output) -> None:
        self._return_borrowed()
        for u in units:
            u.users -= 1
        if torch.is_grad_enabled():
            hook = functools.partial(self._pre_backward, units, id(module))
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(hook)
        keep = self.planner.on_trace and torch.is_grad_enabled()
        for u in units:
            self._after_use(u, keep)

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
        if (self.phase is Phase.BACKWARD or _autograd_running()) and not u.frozen:
            u.bwd_hold = True

    def _return_borrowed(self) -> None:
        if self._frames:
            for u in self._frames.pop():
                u.users -= 1
                self._after_use(u, keep=False)

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

    # ------------------------------------------------------------------ backward
    def _start_backward(self) -> None:
        if self.phase is not Phase.BACKWARD:
            self.phase = Phase.BACKWARD
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

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
        reduced = self.grads.arrived(u, i, grad)
        p.grad = None
        if reduced:
            u.bwd_hold = False
            if u.users == 0:
                self._release(u)

    def _end_backward(self) -> None:
        """After autograd finishes: reduce partial units, wait, release, adopt the trace."""
        if self.phase is not Phase.BACKWARD:
            return
        self.grads.flush(self.units, self._ran_leaves)
        for u in self.units:
            u.bwd_hold = False
        self._frozen_in_backward = []
        self._ran_leaves.clear()
        self.release_all()
        self.planner.end_pass()
        self.phase = Phase.IDLE
        self.sequence.end_pass("backward")

    # ------------------------------------------------------------------ engine interface
    def prepare(self, boundary: bool) -> None:  # noqa: ARG002 - reduced every micro-step
        pass

    def finish(self) -> None:
        self._end_backward()

    def owned_grads(self) -> list[torch.Tensor]:
        return self.grads.owned

    def zero(self) -> None:
        self.grads.zero()

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
            for listener in self.shard_written:
                listener(u)
        u.users -= 1
        if u.users == 0 and self.phase is not Phase.BACKWARD:
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
