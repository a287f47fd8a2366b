"""`zero.Init`: partition parameters while the model is built; `GatheredParameters`.

Inside ``with runtime.zero.Init():`` every `torch.nn.Module` is partitioned as soon as its own
``__init__`` returns: each parameter it registered is broadcast from rank 0 (so all ranks start
from the same weights whatever their seeds), padded to a multiple of the world size, and only
this rank's 1/N chunk is kept; the parameter's ``.data`` becomes an empty tensor and its full
shape is in ``param.ds_shape`` (DeepSpeed's attribute). A rank therefore never holds more than
one module's parameters whole during construction. ``runtime.initialize`` regroups these
chunks into the engine's flat layout one parameter at a time.

How the end of a module's ``__init__`` is caught: ``__init__`` of every ``nn.Module`` subclass
is wrapped while the context is open (classes defined inside it too, via
``__init_subclass__``), and restored on exit. The outermost ``__init__`` of an instance (the
most derived class) partitions it when it returns.

Caveat, as in DeepSpeed: a parent whose ``__init__`` re-initialises its children's weights
(``nn.init.normal_(self.fc.weight)`` after ``self.fc = nn.Linear(...)``) writes into an empty
tensor, which changes nothing. Do such writes inside
``GatheredParameters(self.fc.weight, modifier_rank=0)``, or in the child's own ``__init__``.

`GatheredParameters(params, modifier_rank=None)` gathers the given parameters (partitioned by
`Init` or by a stage-3 engine) for the duration of the block, on every rank (it is a
collective). With ``modifier_rank`` set, that rank's values are broadcast on exit and written
back into every rank's shard (and the optimizer's master copy); without it changes are
discarded. The parameters of a stage 0-2 engine are whole on every rank, so entering gathers
nothing, but a write under ``modifier_rank`` is broadcast and copied into the fp32 master all
the same (`flat_writeback`: otherwise the next step would undo it); without a modifier rank
they are left as the block left them. Parameters of no engine pass through untouched, so the
same code runs at every stage.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable

import torch

from runtime.distributed import Communicator

from .param_status import ZeroParamStatus

__all__ = ["Init", "GatheredParameters", "ParamPartition", "is_partitioned"]

_state = threading.local()


def _current() -> Init | None:
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def is_partitioned(p: torch.Tensor) -> bool:
    """Whether ``p`` is held as shards (by `Init` or a stage-3 engine)."""
    return getattr(p, "_zero_owner", None) is not None


class ParamPartition:
    """One parameter split evenly over the ranks (zero.Init's layout, before an engine exists)."""

    def __init__(self, param: torch.nn.Parameter, comm: Communicator, device, dtype=None):
        data = param.data
        self.comm = comm
        self.shape = tuple(data.shape)
        self.numel = data.numel()
        self.dtype = dtype or data.dtype
        n = comm.world_size
        self.chunk = -(-max(self.numel, 1) // n)
        flat = torch.zeros(self.chunk * n, dtype=self.dtype, device=data.device)
        flat[: self.numel].copy_(data.reshape(-1))
        comm.broadcast(flat, src=0)
        lo = comm.rank * self.chunk
        self.shard = flat[lo : lo + self.chunk].to(device, copy=True)
        self.device = data.device
        self.users = 0
        self._flat: torch.Tensor | None = None
        self._param = param
        param.data = torch.empty(0, dtype=self.dtype, device=data.device)
        param.ds_shape = self.shape
        param.ds_numel = self.numel
        param._zero_owner = self
        param.ds_status = ZeroParamStatus.NOT_AVAILABLE

    def full_flat(self) -> torch.Tensor:
        """The whole (padded) parameter, gathered from every rank's chunk."""
        flat = torch.empty(self.chunk * self.comm.world_size, dtype=self.dtype, device=self.device)
        lo = self.comm.rank * self.chunk
        own = flat[lo : lo + self.chunk]
        own.copy_(self.shard)
        self.comm.all_gather(flat, own)
        return flat

    def gather_for_user(self) -> None:
        self.users += 1
        if self.users == 1:
            self._flat = self.full_flat()
            self._param.data = self._flat[: self.numel].view(self.shape)
            self._param.ds_status = ZeroParamStatus.AVAILABLE

    def release_for_user(self, modifier_rank: int | None) -> None:
        if modifier_rank is not None:
            self.comm.broadcast(self._flat, src=modifier_rank)
            lo = self.comm.rank * self.chunk
            self.shard.copy_(self._flat[lo : lo + self.chunk])
        self.users -= 1
        if self.users == 0:
            self._param.data = torch.empty(0, dtype=self.dtype, device=self.device)
            self._param.ds_status = ZeroParamStatus.NOT_AVAILABLE
            self._flat = None

    def detach_from_param(self) -> None:
        """Forget this partition (the engine has taken the parameter over)."""
        if getattr(self._param, "_zero_owner", None) is self:
            self._param._zero_owner = None


def _offloads_params(source) -> bool:
    """Whether the config (a Config, a mapping or a file) offloads parameters. Only its
    ``zero_optimization`` block is read: the Hugging Face integration builds models under Init
    before it has filled the config's other "auto" values (scheduler steps and the like)."""
    import os
    from collections.abc import Mapping

    from ..config import load_config

    if hasattr(source, "zero_optimization"):
        return source.zero_optimization.offload_param.enabled
    if isinstance(source, (str, os.PathLike)):
        from runtime.config import read_file

        source = read_file(source, os.fspath(source))
    zero = source.get("zero_optimization", {}) if isinstance(source, Mapping) else {}
    return load_config({"zero_optimization": zero}).zero_optimization.offload_param.enabled


class Init:
    """Partition parameters as modules are constructed (see the module docstring).

    Accepts DeepSpeed's arguments; ``module`` partitions an already built model,
    ``remote_device="cpu"`` keeps the chunks in CPU memory, ``dtype`` casts them,
    ``data_parallel_group`` chooses the ranks (default: all), ``enabled=False`` makes the
    context do nothing. ``config_dict_or_path``/``config`` are read for ``offload_param``.
    """

    def __init__(
        self,
        module: torch.nn.Module | None = None,
        data_parallel_group=None,
        mem_efficient_linear: bool = True,  # noqa: ARG002 - DeepSpeed signature
        remote_device: str | None = None,
        pin_memory: bool = False,  # noqa: ARG002 - pinning applies to the engine's store
        config_dict_or_path=None,
        config=None,
        enabled: bool = True,
        dtype: torch.dtype | None = None,
        mpu=None,  # noqa: ARG002 - DeepSpeed signature
    ):
        self.enabled = enabled
        self.dtype = dtype
        self._group = data_parallel_group
        source = config_dict_or_path if config_dict_or_path is not None else config
        if remote_device is None and source is not None and _offloads_params(source):
            remote_device = "cpu"
        if remote_device not in (None, "none"):
            # Construction frees each module's full tensors after partitioning: return them
            # to the system, or a memory limit counts them (zero.nvme.host_memory).
            from .nvme import hold_mmap_threshold

            hold_mmap_threshold()
        self._remote = remote_device if remote_device not in (None, "none") else None
        self._comm: Communicator | None = None
        self._patched: list[tuple[type, object]] = []
        self._old_init_subclass = None
        self.constructing: list[torch.nn.Module] = []
        self.partitioned_numel = 0
        if enabled and module is not None:
            for m in module.modules():
                self.partition_module(m)

    # ------------------------------------------------------------------ partitioning
    @property
    def comm(self) -> Communicator:
        if self._comm is None:
            import torch.distributed as dist

            if not dist.is_initialized():
                from runtime.distributed import init_distributed

                init_distributed()
            self._comm = Communicator(self._group)
        return self._comm

    def partition_module(self, module: torch.nn.Module) -> None:
        for p in module._parameters.values():
            if p is None or getattr(p, "_zero_owner", None) is not None:
                continue
            device = torch.device(self._remote) if self._remote else p.device
            ParamPartition(p, self.comm, device, self.dtype)
            self.partitioned_numel += p.ds_numel

    # ------------------------------------------------------------------ the context
    def __enter__(self) -> Init:
        if not self.enabled:
            return self
        stack = getattr(_state, "stack", None)
        if stack is None:
            stack = _state.stack = []
        stack.append(self)
        if len(stack) == 1:
            self._patch_classes()
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        _state.stack.pop()
        if not _state.stack:
            self._unpatch_classes()

    def _patch_classes(self) -> None:
        seen: set[type] = set()
        todo = [torch.nn.Module]
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            self._wrap(cls)
            todo.extend(cls.__subclasses__())
        self._old_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")
        wrap = self._wrap

        def __init_subclass__(cls, **kwargs):
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            wrap(cls)

        torch.nn.Module.__init_subclass__ = classmethod(__init_subclass__)

    def _unpatch_classes(self) -> None:
        for cls, orig in reversed(self._patched):
            cls.__init__ = orig
        self._patched.clear()
        if self._old_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._old_init_subclass

    def _wrap(self, cls: type) -> None:
        orig = cls.__dict__.get("__init__")
        if orig is None or getattr(orig, "_zero_wrapped", False):
            return

        @functools.wraps(orig)
        def __init__(module, *args, **kwargs):
            ctx = _current()
            if ctx is None:
                return orig(module, *args, **kwargs)
            outer = not ctx.constructing or ctx.constructing[-1] is not module
            if outer:
                ctx.constructing.append(module)
            try:
                orig(module, *args, **kwargs)
            finally:
                if outer:
                    ctx.constructing.pop()
            if outer:
                ctx.partition_module(module)

        __init__._zero_wrapped = True
        cls.__init__ = __init__
        self._patched.append((cls, orig))


class GatheredParameters:
    """Temporary full access to partitioned parameters (a collective: enter on every rank)."""

    def __init__(
        self,
        params,
        modifier_rank: int | None = None,
        fwd_module=None,  # noqa: ARG002 - DeepSpeed signature
        enabled: bool = True,
    ):
        if isinstance(params, torch.Tensor):
            params = [params]
        elif params is None:
            params = []
        owners, seen = [], set()
        for p in params if isinstance(params, Iterable) else [params]:
            # Partitioned (zero.Init, stage 3), or whole but written back (stages 0-2).
            owner = getattr(p, "_zero_owner", None) or getattr(p, "_zero_writeback", None)
            if owner is not None and id(owner) not in seen:
                seen.add(id(owner))
                owners.append(owner)
        self._owners = owners if enabled else []
        self.modifier_rank = modifier_rank

    def __enter__(self) -> GatheredParameters:
        for owner in self._owners:
            owner.gather_for_user()
        return self

    def __exit__(self, *exc) -> None:
        # Write back only on a clean exit: after an exception the ranks may not all get here.
        rank = self.modifier_rank if exc[0] is None else None
        for owner in self._owners:
            owner.release_for_user(rank)
