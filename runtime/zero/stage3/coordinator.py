"""ZeRO stage 3: fetch parameters around each module, prefetch by trace, reduce gradients.

`Stage3Coordinator` hooks the model:

* forward pre-hook of every module owning (non-persistent) units: fetch them (all-gather, or
  wait for the prefetch already in flight), then launch the prefetch the recorded trace
  suggests (`prefetch.FetchPlanner`);
* forward post-hook (always called, also when forward raises): release them unless the trace
  says they are used again soon; and hook the module's output tensors so that their gradient
  (which autograd computes just before the module's backward) fetches the units again;
* parameter hooks: a gradient about to be accumulated fetches its unit if it was released; an
  accumulated gradient goes to `grads.Stage3GradReducer`.

Beyond that:

* a parameter read by forward code without its module being called (``out_proj.weight`` in
  ``nn.MultiheadAttention``) is fetched on the read and released when the module that read it
  returns (`access`);
* a forward that runs inside backward (activation checkpointing recomputing a block, reentrant
  or not, stopped early or not) never releases what backward still needs;
* a unit gathered before an optimizer step is never used after it: fetching a unit whose
  buffer predates the last step gathers it again;
* leaf modules (`leaf_modules`: mixture-of-experts layers) are one unit each;
* every rank's collectives are checked to pair up (`sequence`).

Which module fetches which units, and the registration of the hooks, is `hooks`; the
gathering and releasing of units under the live bound is `live.LiveUnits`.

`build.build_stage3` builds all this into the `Stage3Strategy` the engine holds (the
engine asks `zero.strategy.build_strategy`, which picks stage 3 or stages 0-2).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable

import torch

from runtime.distributed import Communicator

from ..partition import FlatLayout
from . import access as stage3_access
from .fetch import GRAD_QUANTIZER, UnitFetch
from .grads import Stage3GradReducer
from .hooks import install_hooks, tensors_in
from .live import LiveUnits, SavedInUnit
from .prefetch import FetchPlanner
from .units import Unit

__all__ = ["Stage3Coordinator", "Phase"]


class Phase(enum.Enum):
    """Where the model is in a training pass (a forward inside backward is recomputation)."""

    IDLE = "idle"
    FORWARD = "forward"
    BACKWARD = "backward"


def _autograd_running() -> bool:
    """True while autograd runs a backward on this thread (activation recomputation)."""
    return torch._C._current_graph_task_id() != -1


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
        fetch: UnitFetch | None = None,
        *,
        wire_dtype: torch.dtype | None = None,
    ):
        self.module = module
        self.units = units
        self.comm = comm
        self.planner = FetchPlanner(
            [u.numel for u in units],
            int(zero.stage3_prefetch_bucket_size),
            int(zero.stage3_max_reuse_distance),
        )
        self.fetcher = fetch if fetch is not None else UnitFetch(comm)
        self.live = LiveUnits(
            units,
            comm,
            self.planner,
            int(zero.stage3_max_live_parameters),
            self.fetcher,
        )
        self._ends_accumulation = False  # set by the engine before each backward
        self.sequence = self.live.sequence
        self.grads = Stage3GradReducer(
            layout,
            comm,
            self.sequence,
            grad_dtype,
            device,
            bool(zero.overlap_comm),
            GRAD_QUANTIZER if zero.zero_quantized_gradients else None,
            wire_dtype=wire_dtype,
        )
        self.phase = Phase.IDLE
        self.shard_written: list[Callable[[Unit], None]] = []
        """Called when GatheredParameters wrote new values into a unit's shard."""
        self._bwd_seen: set[int] = set()
        self._frozen_in_backward: list[Unit] = []
        self._ran_leaves: set[int] = set()
        self._frames: list[list[Unit]] = []
        """Per module running forward (innermost last): the units it fetched by reading them."""
        self._saved_hooks: list = []
        for u in units:
            u.coordinator = self
        self._hooks = install_hooks(module, units, self)
        stage3_access.install(module, self._on_read)

    @property
    def peak_live_numel(self) -> int:
        return self.live.peak_numel

    def _in_backward(self) -> bool:
        return self.phase is Phase.BACKWARD or _autograd_running()

    # ------------------------------------------------------------------ after a module ran
    def _after_use(self, u: Unit, keep: bool) -> None:
        """A module using ``u`` returned: release it unless something still needs it."""
        if u.users > 0 or u.persistent:
            return
        if self._in_backward():
            # A forward recomputed inside backward (activation checkpointing): backward is
            # about to use these weights. Trained units go when their gradients are reduced;
            # frozen ones when backward moves on to another module.
            if u.frozen and u not in self._frozen_in_backward:
                self._frozen_in_backward.append(u)
            return
        if keep and self.planner.keep_after_use(u.index) and self.live.fits(0):
            return
        self.live.release(u)

    def release_all(self) -> None:
        self.live.release_all()

    # ------------------------------------------------------------------ forward hooks
    # (`hooks.HookHandlers`: registered by `install_hooks`)
    def begin_pass(self, module, args) -> None:
        self._saved_hooks.append(
            torch.autograd.graph.saved_tensors_hooks(self.live.tag_saved, self._unpack)
        )
        self._saved_hooks[-1].__enter__()
        self._frames.append([])
        if self._in_backward():
            return
        # Units kept by a forward whose backward never came are released here.
        self.live.release_all()
        self.live.begin_pass()
        self.phase = Phase.FORWARD
        self.planner.begin_pass()
        self._bwd_seen.clear()
        self._ran_leaves.clear()

    def end_forward(self, module, args, output) -> None:
        if self._saved_hooks:
            self._saved_hooks.pop().__exit__(None, None, None)
        self._return_borrowed()
        if self._in_backward():
            return
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors_in(output)):
            # No backward follows this forward (evaluation): the pass ends here.
            self.live.release_all()
            self.phase = Phase.IDLE
            self.sequence.end_pass("forward")

    def pre_forward(self, units: list[Unit], module, args) -> None:
        self._frames.append([])
        for u in units:
            self.live.fetch(u)
            u.enter()
            if u.leaf is not None:
                self._ran_leaves.add(u.index)

    def post_forward(self, units: list[Unit], module, args, output) -> None:
        self._return_borrowed()
        for u in units:
            u.leave()
        if torch.is_grad_enabled():
            # The gradient of a module's output arrives just before the module's backward.
            hook = functools.partial(self._pre_backward, units, id(module))
            for t in tensors_in(output):
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
        if not self._frames or type(u) is not Unit or self.live.is_current(u):
            return
        self.live.fetch(u)
        u.enter()
        self._frames[-1].append(u)
        if self._in_backward() and not u.frozen:
            u.hold_for_backward()

    def _return_borrowed(self) -> None:
        if self._frames:
            for u in self._frames.pop():
                u.leave()
                self._after_use(u, keep=False)

    # Tensors autograd saves during forward that live in a unit's gathered buffer are tagged
    # with their unit (`LiveUnits.tag_saved`); unpacking one in backward fetches the unit if it
    # was released. The output-gradient hooks normally fetch first (with prefetch); this makes
    # backward correct even for modules whose outputs those hooks cannot see (outputs wrapped
    # in objects that are not tensors, lists or dicts).
    def _unpack(self, saved):
        if type(saved) is not SavedInUnit:
            return saved
        self._fetch_for_backward(saved.unit)
        return saved.tensor

    # ------------------------------------------------------------------ backward
    def _start_backward(self) -> None:
        if self.phase is not Phase.BACKWARD:
            self.phase = Phase.BACKWARD
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _fetch_for_backward(self, u: Unit) -> None:
        """Backward needs ``u`` whole again (a saved tensor, or a gradient about to be
        accumulated into its full-shaped parameter): fetch it if it was released."""
        if not u.gathered:
            self._start_backward()
            u.hold_for_backward()
            self.live.fetch(u)

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
                u.hold_for_backward(False)
                if u.users == 0:
                    self.live.release(u)
        self._frozen_in_backward = [u for u in units if u.frozen]
        for u in units:
            u.hold_for_backward()
            self.live.fetch(u)

    def grad_arriving(self, u: Unit, grad) -> None:
        self._fetch_for_backward(u)

    def grad_ready(self, u: Unit, i: int, p: torch.Tensor) -> None:
        grad = p.grad
        if grad is None:
            return
        self._start_backward()
        reduced = self.grads.arrived(u, i, grad)
        p.grad = None
        if reduced:
            u.hold_for_backward(False)
            if u.users == 0:
                self.live.release(u)

    def _end_backward(self) -> None:
        """After autograd finishes: reduce partial units, wait, release, adopt the trace."""
        if self.phase is not Phase.BACKWARD:
            return
        self.grads.flush(self.units, self._ran_leaves)
        for u in self.units:
            u.hold_for_backward(False)
        self._frozen_in_backward = []
        self._ran_leaves.clear()
        self.live.release_all()
        self.planner.end_pass()
        self.phase = Phase.IDLE
        self.sequence.end_pass("backward", ends_accumulation=self._ends_accumulation)

    # ------------------------------------------------------------------ engine interface
    def prepare(self, boundary: bool) -> None:
        # Gradients are reduced every micro-step; the boundary only says a step follows, whose
        # all-reduce can carry this pass's collective-sequence check.
        self._ends_accumulation = boundary

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
        self.live.after_step()

    # ------------------------------------------------------------------ GatheredParameters
    def user_gather(self, u: Unit) -> None:
        u.enter()
        self.live.gather(u, exact=True)
        u.wait()

    def user_release(self, u: Unit, modifier_rank: int | None) -> None:
        if modifier_rank is not None:
            u.write_back(self.comm, modifier_rank)
            self.fetcher.forget(u)
            for listener in self.shard_written:
                listener(u)
        u.leave()
        if u.users == 0 and self.phase is not Phase.BACKWARD:
            self.live.release(u)

    def fetch_whole(self, names: list[str]) -> None:
        """Make each named module fetch its whole subtree's units before it runs (and release
        them after), with no hook or parameter-read check inside it: the regions torch.compile
        compiles (`runtime.engine.torch_compile.compile_regions`), whose code must not call back into Python."""
        self.remove_hooks()
        self._hooks = install_hooks(self.module, self.units, self, whole=names)
        stage3_access.install(self.module, self._on_read)
        modules = dict(self.module.named_modules())
        for name in names:
            stage3_access.uninstall(modules[name])

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        stage3_access.uninstall(self.module)
