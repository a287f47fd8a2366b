"""The training engine: a DeepSpeed-compatible wrapper around a torch module (ZeRO 0-2).

Loop contract (DeepSpeed's)::

    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)   # scales by 1/gradient_accumulation_steps (and the loss scale)
        engine.step()           # every micro-batch; updates only at the accumulation boundary

How the pieces fit: trainable parameters are flattened into one buffer laid out by
`zero.partition.plan_layout` (groups = buckets, in reverse registration order, which is the
order backward produces gradients). `zero.buckets.GradReducer` reduces gradients group by
group while backward runs; `zero.optimizer.ZeroOptimizer` owns master weights for what this
rank owns, clips on the global norm, steps, and all-gathers the parameters back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Iterator

import torch

from .comm import Communicator
from .dist_env import DistEnv
from .precision import Precision
from .zero.buckets import GradReducer, ReduceMode
from .zero.flat import FlatBuffer, flatten_params_into
from .zero.optimizer import ZeroOptimizer
from .zero.partition import ParamSpec, plan_layout

__all__ = ["Engine", "AccumulationError", "LiveLossScale"]

log = logging.getLogger("runtime.engine")

# Shard starts are aligned to this many elements (vector loads, NCCL alignment).
_ALIGN = 16
# Buckets are capped at 4M elements (16 MiB in fp32) whatever reduce_bucket_size says:
# DeepSpeed's 5e8 default would make the whole model one bucket (no overlap with backward,
# and staging/receive buffers as large as the model). 4M elements already saturate gloo and
# NCCL bandwidth; measured on the 23M-parameter benchmark model (stage 2, 2 CPU ranks) this
# cut model-state bytes per rank from 398 to 253 MiB at the same step time.
_MAX_BUCKET = 1 << 22


class AccumulationError(RuntimeError):
    """backward() was called again without the step() that must follow it."""


class LiveLossScale(float):
    """The current loss scale. Works as a value (``engine.loss_scale``) and, for scripts written
    for DeepSpeed, as a call (``engine.loss_scale()``). Unlike DeepSpeed, whose
    ``loss_scale()`` returns the *configured* static scale (0 under dynamic scaling), this is
    always the scale the last backward actually used (1.0 without fp16)."""

    def __call__(self) -> float:
        return float(self)


def _cast_floats(obj, dtype):
    if torch.is_tensor(obj):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_floats(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj


class Engine(torch.nn.Module):
    def __init__(
        self,
        *,
        module: torch.nn.Module,
        config,
        env: DistEnv,
        optimizer=None,
        model_parameters=None,
        lr_scheduler=None,
        training_data=None,
        collate_fn=None,
        mpu=None,
    ):
        super().__init__()
        zero = config.zero_optimization
        self.module = module
        self.config = config
        self.env = env
        self.device = env.device
        self.local_rank = env.local_rank
        self.global_rank = env.rank
        self.world_size = env.world_size
        # --- model parallelism (runtime/model_parallel.py): with an mpu, ZeRO partitions and
        # reduces over the data-parallel group only; self.comm is that group ---
        from .model_parallel import ModelParallel

        self.model_parallel = ModelParallel.build(mpu, env, config)
        self.mpu = mpu
        self.comm = self.model_parallel.dp_comm if mpu is not None else Communicator(env.group)
        self.dp_world_size = self.comm.world_size
        self.dp_rank = self.comm.rank
        # --- end model parallelism ---
        self.precision = Precision.from_config(config)
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._backward_calls = 0
        self._reduced_since_step = False
        # --- DeepSpeed's accumulation controls (no_sync, set_gradient_accumulation_boundary) ---
        self._step_applied = False
        self._boundary_override: bool | None = None
        self._in_no_sync = False

        dtype = self.precision.param_dtype
        module.to(device=self.device, dtype=dtype if self.precision.mixed else None)
        # Buffers (BatchNorm statistics, ...) start from rank 0's values, as in DDP; parameters
        # are broadcast below, once flattened.
        for buffer in module.buffers():
            self.comm.broadcast(buffer.data, src=0)

        groups = self._param_groups(module, optimizer, model_parameters)
        if zero.stage == 3:
            # --- stage 3 (runtime/zero/stage3*.py): parameters partitioned into per-module
            # units; sets self.layout, flat_params (the shard store), reducer, optimizer ---
            from .zero.stage3_build import build_stage3

            build_stage3(self, groups, self._optimizer_factory(optimizer, groups))
        else:
            names = {id(p): n for n, p in module.named_parameters()}
            order = {id(p): i for i, p in enumerate(module.parameters())}
            specs, params_by_name = [], {}
            for pg, (_, params) in enumerate(groups):
                for p in sorted(params, key=lambda q: order[id(q)], reverse=True):
                    if id(p) not in names:
                        raise ValueError(
                            "an optimizer parameter is not a parameter of the model; build the "
                            "optimizer from model.parameters()"
                        )
                    specs.append(ParamSpec(names[id(p)], tuple(p.shape), pg))
                    params_by_name[names[id(p)]] = p
            dtypes = {p.dtype for p in params_by_name.values()}
            if len(dtypes) > 1:
                raise TypeError(
                    f"trainable parameters have several dtypes ({sorted(map(str, dtypes))}); "
                    "cast the model to one dtype, or enable fp16/bf16 in the config"
                )
            partitioned = zero.stage in (1, 2)
            bucket = min(zero.reduce_bucket_size, _MAX_BUCKET)
            if bucket < zero.reduce_bucket_size and self.global_rank == 0:
                user_set = "reduce_bucket_size" in (config.raw.get("zero_optimization") or {})
                if user_set:
                    log.warning(
                        "zero_optimization.reduce_bucket_size=%d: buckets are capped at %d "
                        "elements (larger ones only delay overlap with backward and cost memory)",
                        zero.reduce_bucket_size,
                        _MAX_BUCKET,
                    )
            if partitioned:
                bucket = min(bucket, zero.allgather_bucket_size)
            self.layout = plan_layout(
                specs, self.dp_world_size if partitioned else 1, bucket, align=_ALIGN
            )
            params_by_group = [
                [params_by_name[s.name] for s in g.slots] for g in self.layout.groups
            ]
            self.flat_params = FlatBuffer(
                self.layout, dtype if self.precision.mixed else dtypes.pop(), self.device
            )
            flatten_params_into(self.flat_params, params_by_group)
            # Every rank starts from rank 0's weights (as DDP and DeepSpeed do).
            self.comm.broadcast(self.flat_params.data, src=0)

            mode = {
                0: ReduceMode.ALL_REDUCE,
                1: ReduceMode.SCATTER_AT_BOUNDARY,
                2: ReduceMode.SCATTER_EVERY_MICRO_STEP,
            }[zero.stage]
            # zero_optimization.reduce_scatter / allgather_partitions = false pick all-reduce /
            # broadcasts for the stage 1-2 collectives (byte counters stay shared).
            zero_comm = self.comm.with_strategy(
                use_reduce_scatter=zero.reduce_scatter, use_all_gather=zero.allgather_partitions
            )
            self.reducer = GradReducer(
                self.layout,
                params_by_group,
                zero_comm,
                mode,
                self.flat_params.data.dtype,
                self.device,
                overlap=bool(zero.overlap_comm),
            )
            offload = zero.offload_optimizer.enabled
            self.optimizer = ZeroOptimizer(
                layout=self.layout,
                params=self.flat_params,
                reducer=self.reducer,
                comm=zero_comm,
                precision=self.precision,
                partitioned=partitioned,
                offload=offload,
                pin_memory=zero.offload_optimizer.pin_memory,
                clip=float(config.gradient_clipping or 0.0),
                make_optimizer=self._optimizer_factory(optimizer, groups),
                group_options=[opts for opts, _ in groups],
                norm_scope=self.model_parallel.norm_scope(self.layout, params_by_name, partitioned),
            )
        self.lr_scheduler = self._build_scheduler(lr_scheduler)
        self.training_dataloader = None
        if training_data is not None:
            self.training_dataloader = self.deepspeed_io(training_data, collate_fn=collate_fn)
        # --- step metrics (runtime/metrics.py) ---
        from .metrics import StepMetrics

        self.step_metrics = StepMetrics(self)
        # --- end step metrics ---
        # --- step insight: wall clock, comms logger, FLOPs/MFU (runtime/profiling/) ---
        from .profiling import StepInsight

        self.insight = StepInsight(self)

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _param_groups(module, optimizer, model_parameters) -> list[tuple[dict, list]]:
        """(options, params) per optimizer param group, trainable parameters only."""
        if isinstance(optimizer, torch.optim.Optimizer):
            raw = [
                ({k: v for k, v in g.items() if k != "params"}, list(g["params"]))
                for g in optimizer.param_groups
            ]
        elif model_parameters is not None:
            items = list(model_parameters)
            if items and isinstance(items[0], dict):
                raw = [
                    ({k: v for k, v in g.items() if k != "params"}, list(g["params"]))
                    for g in items
                ]
            else:
                raw = [({}, items)]
        else:
            raw = [({}, list(module.parameters()))]
        seen, groups = set(), []
        for opts, params in raw:
            keep = []
            for p in params:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    keep.append(p)
            groups.append((opts, keep))
        if not any(params for _, params in groups):
            raise ValueError("the model has no trainable parameters (none requires grad)")
        return groups

    def _optimizer_factory(self, client, groups):
        def make(param_groups: list[dict]) -> torch.optim.Optimizer:
            if isinstance(client, torch.optim.Optimizer):
                # Keep the client's object (a client scheduler may already hold it) but point
                # it at this rank's master weights.
                for target, new in zip(client.param_groups, param_groups, strict=True):
                    target["params"] = new["params"]
                client.state.clear()
                return client
            if callable(client):
                return client(param_groups)
            if self.config.optimizer is None:
                raise ValueError(
                    'no optimizer: add an "optimizer" block to the config, or pass optimizer= '
                    "to runtime.initialize"
                )
            from .optimizers import build_optimizer

            return build_optimizer(self.config.optimizer, param_groups)

        return make

    def _build_scheduler(self, client):
        inner = self.optimizer.optimizer
        if client is not None:
            # A scheduler object steps; a factory is called with the optimizer.
            return client if hasattr(client, "step") else client(inner)
        if self.config.scheduler is None:
            return None
        from .lr_schedules import build_scheduler

        return build_scheduler(self.config.scheduler, inner)

    def deepspeed_io(self, dataset, *, collate_fn=None, batch_size=None, shuffle=True):
        from .dataloader import build_dataloader

        return build_dataloader(
            dataset,
            micro_batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
            rank=self.dp_rank,
            world_size=self.dp_world_size,
            collate_fn=collate_fn,
            drop_last=getattr(self.config, "dataloader_drop_last", False),
            shuffle=shuffle,
        )

    # ------------------------------------------------------------------ training loop
    def forward(self, *args, **kwargs):
        self.step_metrics.on_forward(args, kwargs)  # step metrics: window start, tokens
        if self.precision.mixed:
            args = _cast_floats(args, self.precision.param_dtype)
            kwargs = _cast_floats(kwargs, self.precision.param_dtype)
        self.insight.forward_begin()
        out = self.module(*args, **kwargs)
        self.insight.forward_end()
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """Backpropagate ``loss / gradient_accumulation_steps`` (times the loss scale).

        Returns the loss divided by the accumulation steps, as DeepSpeed does.
        """
        gas = self.gradient_accumulation_steps()
        # Under no_sync or a boundary the script sets, the script counts micro-batches itself.
        counted = not self._in_no_sync and self._boundary_override is None
        if self._reduced_since_step or (counted and self._backward_calls >= gas):
            raise AccumulationError(
                f"engine.backward() was called {self._backward_calls + 1} times without "
                f"engine.step() (gradient_accumulation_steps={gas}). Call engine.step() after "
                "EVERY engine.backward(loss): the engine counts micro-batches itself and updates "
                "only at the accumulation boundary. Write the loop as\n"
                "    for batch in loader:\n"
                "        loss = engine(batch)\n"
                "        engine.backward(loss)\n"
                "        engine.step()\n"
                "(not `if engine.global_steps % accum == 0: engine.step()`)."
            )
        self.step_metrics.on_backward(loss)  # step metrics: this rank's loss
        boundary = self.is_gradient_accumulation_boundary() and not self._in_no_sync
        self._backward_calls += counted
        self._reduced_since_step = boundary
        scaled = loss / gas if scale_wrt_gas else loss
        # Gradients are summed over data-parallel ranks, so fold the 1/N of the mean in here.
        factor = self.precision.loss_scale / self.dp_world_size
        target = scaled.float() * factor if (factor != 1.0 or self.precision.mixed) else scaled
        self.reducer.prepare(boundary)
        self.insight.backward_begin()
        target.backward(retain_graph=retain_graph)
        self.reducer.finish()
        self.insight.backward_end(boundary)
        return scaled

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether this micro-batch ends an accumulation: counted from the micro-steps, or as
        set by `set_gradient_accumulation_boundary`."""
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def step(self) -> None:
        """Call after every backward; applies the update at the accumulation boundary."""
        if self._in_no_sync:
            raise AccumulationError(
                "engine.step() was called inside engine.no_sync(); leave the no_sync block "
                "first (its backward passes only accumulate gradients locally)"
            )
        self._backward_calls = 0
        self._reduced_since_step = False
        self._step_applied = False
        if self.is_gradient_accumulation_boundary():
            self.insight.step_begin()
            outcome = self.optimizer.step()
            self.precision.update(outcome.skipped, step=self.global_steps, rank=self.global_rank)
            self._step_applied = not outcome.skipped
            if outcome.skipped:
                self.skipped_steps += 1
            elif self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.optimizer.zero_grad()
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self.insight.step_end()
            # --- step metrics: report steps emit one event from rank 0 (runtime/metrics.py) ---
            self.step_metrics.on_boundary(outcome.grad_norm, outcome.skipped)
            self._report_checkpointing_profile()
        self.micro_steps += 1
        if self.save_on_signal is not None:
            self.save_on_signal.at_boundary(self)  # checkpoint on signal (runtime/checkpoint)

    # --- DeepSpeed's accumulation controls ---
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients on this rank (no collective); the
        next backward outside reduces everything accumulated. As in DeepSpeed: stages 0-1 only
        (stages 2-3 reduce every micro-batch to partition gradients), not re-entrant, and
        step() inside raises."""
        if self.zero_stage >= 2:
            raise AccumulationError(
                f"engine.no_sync() cannot be used at ZeRO stage {self.zero_stage}: stages 2 and 3 "
                "reduce gradients every micro-batch to partition them; use stage 0 or 1, or "
                "gradient_accumulation_steps"
            )
        if self._in_no_sync:
            raise AccumulationError("engine.no_sync() is already active; it cannot be nested")
        self._in_no_sync = True
        try:
            yield
        finally:
            self._in_no_sync = False

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Take over the accumulation boundary (DeepSpeed's API): backward passes while it is
        false only accumulate; the one after setting it true reduces, and step() then
        updates. Call it before each forward/backward."""
        if not isinstance(is_boundary, bool):
            raise TypeError(f"is_boundary must be True or False, got {is_boundary!r}")
        self._boundary_override = is_boundary

    def was_step_applied(self) -> bool:
        """Whether the last step() updated the parameters (false between accumulation
        boundaries and for a skipped non-finite step)."""
        return self._step_applied

    def set_train_batch_size(self, train_batch_size: int) -> None:
        """Change the global batch size by changing gradient_accumulation_steps (the micro
        batch stays); it must be a multiple of micro batch * world size."""
        per_step = self.train_micro_batch_size_per_gpu() * self.dp_world_size
        if (
            isinstance(train_batch_size, bool)
            or not isinstance(train_batch_size, int)
            or train_batch_size < 1
            or train_batch_size % per_step
        ):
            raise ValueError(
                f"train_batch_size {train_batch_size!r} must be a positive multiple of "
                f"train_micro_batch_size_per_gpu * world size = {per_step}"
            )
        self.config = dataclasses.replace(
            self.config,
            train_batch_size=train_batch_size,
            gradient_accumulation_steps=train_batch_size // per_step,
        )

    # --- end accumulation controls ---

    # --- step metrics API (runtime/metrics.py) ---
    def log_metrics(self, values: dict, step: int | None = None) -> None:
        """Send the script's own metrics (name -> number) from rank 0, like the step metrics."""
        self.step_metrics.log_metrics(values, step)

    def set_total_steps(self, total: int | None) -> None:
        """The number of optimizer steps of the run, for the progress bar and ETA."""
        self.step_metrics.set_total_steps(total)

    def comms_summary(self, show: bool = True) -> list[dict]:
        """comms_logger: this rank's collectives by kind and message size (count, bytes,
        latency, algbw/busbw); printed on rank 0 when `show` (DeepSpeed's log_summary)."""
        return self.insight.comms_summary(show)

    def _report_checkpointing_profile(self) -> None:
        """activation_checkpointing.profile: forward and recomputation seconds of the
        checkpointed blocks, sent with the step metrics (same steps, rank 0)."""
        every = int(self.config.steps_per_print or 0)
        step = self.global_steps
        if not self.config.activation_checkpointing.profile:
            return
        if step != 1 and not (every > 0 and step % every == 0):
            return
        from . import checkpointing

        timings = checkpointing.take_profile()
        if timings:
            self.step_metrics.log_metrics(timings, step)

    # --- end step metrics API ---

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - torch signature
        self.optimizer.zero_grad()

    # ------------------------------------------------------------------ queries
    def gradient_accumulation_steps(self) -> int:
        return self.config.gradient_accumulation_steps

    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.train_micro_batch_size_per_gpu

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_mom(self) -> list:
        """Per group, the momentum as DeepSpeed reports it: ``betas`` for Adam-like
        optimizers, ``momentum`` for SGD/RMSprop, 0.0 where the group has neither."""
        key = "betas" if "betas" in self.optimizer.param_groups[0] else "momentum"
        return [g.get(key, 0.0) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        """Norm of the last step's gradients over all ranks, before clipping."""
        return self.optimizer.last_grad_norm

    @property
    def loss_scale(self) -> LiveLossScale:
        return LiveLossScale(self.precision.loss_scale)

    @property
    def zero_stage(self) -> int:
        return self.config.zero_optimization.stage

    def zero_optimization_stage(self) -> int:
        return self.zero_stage

    # --- checkpoints (runtime/checkpoint/) ---
    save_on_signal = None
    """Set by runtime.initialize under zlaunch --save-on: saves at the next step boundary."""

    def save_checkpoint(
        self,
        save_dir=None,
        tag=None,
        client_state=None,
        save_latest=True,
        exclude_frozen_parameters=False,
    ):
        """Write a sharded checkpoint (call on every rank); returns its directory.

        ``save_dir`` defaults to $ZLAUNCH_CHECKPOINT_DIR (zlaunch --checkpoint-dir), ``tag`` to
        ``global_step<N>``; ``client_state`` must be JSON-serialisable (nothing is pickled).
        ``exclude_frozen_parameters``: leave out parameters with ``requires_grad`` false (a
        LoRA base model): loading keeps the model's own values for them.
        """
        from .checkpoint import save_checkpoint

        save_dir = self.model_parallel.checkpoint_dir(save_dir)
        return save_checkpoint(
            self, save_dir, tag, client_state, save_latest, exclude_frozen_parameters
        )

    def load_checkpoint(
        self,
        load_dir=None,
        tag=None,
        load_module_strict=True,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
        load_module_only=False,
    ):
        """Load a checkpoint saved at any world size and stage: ``(path, client_state)``, or
        ``(None, None)`` with a warning when ``load_dir`` has no ``latest``."""
        from .checkpoint import load_checkpoint

        load_dir = self.model_parallel.checkpoint_dir(load_dir)
        return load_checkpoint(
            self,
            load_dir,
            tag,
            load_module_strict=load_module_strict,
            load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_lr_scheduler_states,
            load_module_only=load_module_only,
        )

    # --- end checkpoints ---

    # --- consolidated weights (runtime/zero/stage3_save.py) ---
    def save_16bit_model(
        self, save_dir, save_filename: str = "model.safetensors", exclude_frozen_parameters=False
    ) -> bool:
        """Write the full weights (the module's dtype) as safetensors from rank 0 (collective).

        Under stage 3 this needs ``stage3_gather_16bit_weights_on_model_save: true``; without it
        nothing is written and False is returned, as in DeepSpeed.
        """
        if self.mpu is not None:
            raise NotImplementedError(
                "save_16bit_model with an mpu: each model-parallel rank holds a different part "
                "of the weights and there is no merge of tensor-parallel shards here; use "
                "save_checkpoint (one part per model-parallel rank, mp_rank_NN/)"
            )
        from .zero.stage3_save import save_16bit_model

        return save_16bit_model(self, save_dir, save_filename, exclude_frozen_parameters)

    # --- end consolidated weights ---

    def named_master_shards(self) -> Iterable[tuple[int, torch.Tensor]]:
        """(group index, fp32 master tensor) for what this rank owns."""
        return zip(range(len(self.layout.groups)), self.optimizer.master, strict=True)
