"""The training engine: a DeepSpeed-compatible wrapper around a torch module (ZeRO 0-3).

Loop contract (DeepSpeed's)::

    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)   # scales by 1/gradient_accumulation_steps (and the loss scale)
        engine.step()           # every micro-batch; updates only at the accumulation boundary

How the pieces fit: the engine holds one sharding strategy (`zero.strategy`: stages 0-2 flat
buffers, or stage 3 module units) that reduces gradients while backward runs and applies the
optimizer step; `precision` scales losses and decides skipped steps; `accumulation` says
which backward ends an accumulation; step hooks (`step_hooks`: metrics, profiles, save on a
signal) run after every step. Checkpoints (`checkpoint.engine_io`) read the strategy's,
precision's and optimizer's state through their accessors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch

from runtime.distributed import Communicator, DistEnv
from runtime.errors import UnsupportedError
from runtime.optim import (
    Precision,
    StepRiders,
    build_lr_scheduler,
    optimizer_factory,
    param_groups_of,
)
from runtime.zero import GradReduction, ShardingStrategy, StrategyInputs, build_strategy

from .accumulation import Accumulation, AccumulationError
from .queries import EngineQueries, LiveLossScale
from .step_hooks import CheckpointingProfile, RidingStepHook, StepHook
from .torch_compile import CompiledModel, CompileWatch, compile_model, describe_regions, eager
from .train_counters import TrainCounters

__all__ = ["Engine", "AccumulationError", "LiveLossScale"]

log = logging.getLogger("runtime.compile")


class Engine(EngineQueries, torch.nn.Module):
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
        self.module, self.config, self.env, self.mpu = module, config, env, mpu
        self.device, self.local_rank = env.device, env.local_rank
        self.global_rank, self.world_size = env.rank, env.world_size
        from .model_parallel import ModelParallel

        # With an mpu, ZeRO partitions and reduces over the data-parallel group only.
        self.model_parallel = ModelParallel.build(mpu, env, config)
        self.comm = self.model_parallel.dp_comm if mpu is not None else Communicator(env.group)
        self.dp_world_size, self.dp_rank = self.comm.world_size, self.comm.rank
        self.precision = Precision.from_config(config)
        self.grad_pre_divisor = GradReduction.from_config(
            config, self.precision.param_dtype, self.dp_world_size
        ).pre_divisor
        self.counters = TrainCounters()
        from runtime.checkpoint import AsyncSaver

        self.checkpoint_saver = AsyncSaver()
        self._async_save_default = config.checkpoint.async_save
        self.accumulation = Accumulation(self.gradient_accumulation_steps)
        # The step metrics' loss and tokens ride with the gradient-norm all-reduce.
        self.step_riders = StepRiders()
        self._place_module()
        self.sharding: ShardingStrategy = self._build_sharding(optimizer, model_parameters)
        self.optimizer = self.sharding.optimizer
        self.lr_scheduler = build_lr_scheduler(
            lr_scheduler, config.scheduler, self.optimizer.optimizer
        )
        self.training_dataloader = None
        if training_data is not None:
            self.training_dataloader = self.deepspeed_io(training_data, collate_fn=collate_fn)
        self.resumed_from = self.resumed_client_state = None  # set by zlaunch --resume
        self._build_observers()
        self._compiled: CompiledModel | None = None
        if config.compile.enabled:
            self.compile()

    # DeepSpeed's names for the counters, read and set by scripts
    @property
    def global_steps(self) -> int:
        return self.counters.global_steps

    @global_steps.setter
    def global_steps(self, value: int) -> None:
        self.counters.global_steps = value

    @property
    def global_samples(self) -> int:
        return self.counters.global_samples

    @global_samples.setter
    def global_samples(self, value: int) -> None:
        self.counters.global_samples = value

    @property
    def micro_steps(self) -> int:
        return self.counters.micro_steps

    @micro_steps.setter
    def micro_steps(self, value: int) -> None:
        self.counters.micro_steps = value

    @property
    def skipped_steps(self) -> int:
        return self.counters.skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self.counters.skipped_steps = value

    def _place_module(self) -> None:
        """Move the module to this rank's device (and the 16-bit dtype under mixed precision)."""
        mixed = self.precision.mixed
        self.module.to(device=self.device, dtype=self.precision.param_dtype if mixed else None)
        # Buffers (BatchNorm statistics, ...) start from rank 0's values, as in DDP; the
        # strategy broadcasts the parameters once it has laid them out.
        for buffer in self.module.buffers():
            self.comm.broadcast(buffer.data, src=0)

    def _build_sharding(self, optimizer, model_parameters) -> ShardingStrategy:
        inputs = StrategyInputs(
            module=self.module,
            groups=param_groups_of(self.module, optimizer, model_parameters),
            config=self.config,
            comm=self.comm,
            precision=self.precision,
            device=self.device,
            make_optimizer=optimizer_factory(optimizer, self.config.optimizer),
            model_parallel=self.model_parallel,
            global_rank=self.global_rank,
            step_riders=self.step_riders,
        )
        return build_strategy(inputs)

    def _build_observers(self) -> None:
        from runtime.observe import StepMetrics
        from runtime.observe.profiling import StepInsight

        self.step_metrics = StepMetrics(self)
        self.insight = StepInsight(self)  # wall clock, comms logger, FLOPs/MFU
        self._step_hooks: list[StepHook] = [self.step_metrics]
        self._riding_hooks: list[RidingStepHook] = [self.step_metrics]
        if self.config.activation_checkpointing.profile:
            self.add_step_hook(CheckpointingProfile())

    def add_step_hook(self, hook: StepHook) -> None:
        """Run ``hook.after_step(engine, outcome)`` at the end of every `step()` (and
        ``hook.board(riders)`` before each optimizer step, for a `RidingStepHook`)."""
        self._step_hooks.append(hook)
        if isinstance(hook, RidingStepHook):
            self._riding_hooks.append(hook)

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
        self.step_metrics.on_forward(args, kwargs)  # window start, tokens
        args, kwargs = self.precision.cast_inputs(args), self.precision.cast_inputs(kwargs)
        self.insight.forward_begin()
        try:
            if self._compiled is not None and self.insight.counting:
                with eager():  # torch's FLOP counter sees the eager ops only
                    out = self.module(*args, **kwargs)
            else:
                out = self.module(*args, **kwargs)
        finally:  # a forward that raised leaves no FLOP counter on
            self.insight.forward_end()
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """Backpropagate ``loss / gradient_accumulation_steps`` (times the loss scale).

        Returns the loss divided by the accumulation steps, as DeepSpeed does.
        """
        boundary = self.accumulation.begin_backward(self.micro_steps)
        self.step_metrics.on_backward(loss)  # this rank's loss
        scaled = loss / self.gradient_accumulation_steps() if scale_wrt_gas else loss
        # Gradients are summed over data-parallel ranks, so fold the 1/N of the mean in here
        # (or gradient_predivide_factor's part of it: runtime.zero.reduction).
        factor = self.precision.loss_scale / self.grad_pre_divisor
        target = scaled.float() * factor if (factor != 1.0 or self.precision.mixed) else scaled
        self.sharding.begin_backward(boundary)
        self.insight.backward_begin()
        try:
            target.backward(retain_graph=retain_graph)
            self.sharding.end_backward()
        finally:
            self.insight.backward_end(boundary)
        return scaled

    def step(self) -> None:
        """Call after every backward; applies the update at the accumulation boundary."""
        self.accumulation.begin_step()
        outcome = None
        if self.is_gradient_accumulation_boundary():
            self.insight.step_begin()
            for hook in self._riding_hooks:
                hook.board(self.step_riders)
            outcome = self.sharding.step()
            self.precision.update(outcome.skipped, step=self.global_steps, rank=self.global_rank)
            self.accumulation.step_applied = not outcome.skipped
            if outcome.skipped:
                self.skipped_steps += 1
            elif self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.sharding.zero_grad()
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self.insight.step_end()
        self.micro_steps += 1
        for hook in self._step_hooks:
            hook.after_step(self, outcome)

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - torch signature
        self.sharding.zero_grad()

    # ------------------------------------------------------------------ torch.compile
    def compile(
        self,
        backend=None,
        compile_kwargs: dict | None = None,
        schedule=None,
        compiled_autograd_enabled: bool = False,
    ) -> None:
        """Compile the model with torch.compile (DeepSpeed's ``engine.compile``), in place.

        ``backend`` and ``compile_kwargs`` default to the config's ``compile.backend`` and
        ``compile.kwargs``. Stages 0-2 compile the whole model's forward; stage 3 each
        repeated block (a transformer's layers) on its own, fetching its parameters outside
        the compiled code (`runtime.engine.torch_compile`). State-dict keys and checkpoints do not
        change. Calling it again on a compiled engine does nothing, as in DeepSpeed.
        """
        if schedule is not None:
            raise UnsupportedError(
                "engine.compile(schedule=...) is a DeepCompile schedule; DeepCompile is not "
                "implemented here: call engine.compile() without it"
            )
        if compiled_autograd_enabled:
            raise UnsupportedError(
                "engine.compile(compiled_autograd_enabled=True): compiled autograd would trace "
                "the gradient hooks that reduce gradients across ranks; call engine.compile() "
                "without it (backward still runs the compiled regions' backward graphs)"
            )
        block = self.config.compile
        backend = block.backend if backend is None else backend
        kwargs = dict(block.kwargs if compile_kwargs is None else compile_kwargs)
        if self._compiled is not None:
            log.info("engine.compile: the model is already compiled; nothing done")
            return
        fetch_whole = self.sharding.coordinator.fetch_whole if self.zero_stage == 3 else None
        self._compiled = compile_model(self.module, self.zero_stage, backend, kwargs, fetch_whole)
        if self.global_rank == 0:
            self.add_step_hook(CompileWatch(self._compiled.regions))
            log.info(
                "torch.compile (backend %s%s): %s",
                backend if isinstance(backend, str) else getattr(backend, "__name__", backend),
                "".join(f", {k}={v}" for k, v in kwargs.items()),
                describe_regions(self._compiled.regions),
            )

    @property
    def is_compiled(self) -> bool:
        """Whether `compile` (or ``compile.enabled``) compiled the model."""
        return self._compiled is not None

    # ------------------------------------------------------------------ accumulation controls
    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether this micro-batch ends an accumulation: counted from the micro-steps, or as
        set by `set_gradient_accumulation_boundary`."""
        return self.accumulation.is_boundary(self.micro_steps)

    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients on this rank (no collective); the
        next backward outside reduces everything accumulated. As in DeepSpeed: stages 0-1 only
        (stages 2-3 reduce every micro-batch to partition gradients), not re-entrant, and
        step() inside raises."""
        return self.accumulation.no_sync(self.zero_stage)

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Take over the accumulation boundary (DeepSpeed's API): backward passes while it is
        false only accumulate; the one after setting it true reduces, and step() then
        updates. Call it before each forward/backward."""
        self.accumulation.set_boundary(is_boundary)

    def was_step_applied(self) -> bool:
        """Whether the last step() updated the parameters (false between accumulation
        boundaries and for a skipped non-finite step)."""
        return self.accumulation.step_applied

    # ------------------------------------------------------------------ step metrics
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

    def named_master_shards(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(group index, fp32 master tensor) for what this rank owns. Under optimizer NVMe
        offload each is a copy read from the swap files one at a time (the masters there are
        empty placeholders between steps), so going through them holds one in memory."""
        optimizer = self.sharding.optimizer
        for i, r in enumerate(self.sharding.owned_ranges()):
            if optimizer.swap is None:
                yield i, r.master
            else:
                with optimizer.resident([i]):
                    value = r.master.clone()
                yield i, value

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self,
        save_dir=None,
        tag=None,
        client_state=None,
        save_latest=True,
        exclude_frozen_parameters=False,
        async_save=None,
    ):
        """Write a sharded checkpoint (call on every rank); returns its directory.

        ``save_dir`` defaults to $ZLAUNCH_CHECKPOINT_DIR (zlaunch --checkpoint-dir), ``tag`` to
        ``global_step<N>``; ``client_state`` must be JSON-serialisable (nothing is pickled).
        ``exclude_frozen_parameters``: leave out parameters with ``requires_grad`` false (a
        LoRA base model): loading keeps the model's own values for them.
        ``async_save`` (default: the config's ``checkpoint.async_save``, false): return once
        the state is copied; the files are written in the background (``latest`` last), and
        the next save, a load or `wait_for_checkpoint` waits for them.
        """
        from runtime.checkpoint import SaveRequest, save_engine

        if async_save is None:
            async_save = self._async_save_default
        request = SaveRequest(
            client_state or {}, save_latest, exclude_frozen_parameters, bool(async_save)
        )
        return save_engine(self, self.model_parallel.checkpoint_dir(save_dir), tag, request)

    def wait_for_checkpoint(self) -> None:
        """Wait until a background save (``async_save``) is complete on this rank; raises its
        error if it failed (the previous checkpoint then stays ``latest``)."""
        self.checkpoint_saver.wait()

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
        from runtime.checkpoint import LoadRequest, load_engine

        request = LoadRequest(
            load_module_strict, load_optimizer_states, load_lr_scheduler_states, load_module_only
        )
        if self.mpu is not None:
            from runtime.checkpoint.formats import refuse_foreign_under_mpu

            refuse_foreign_under_mpu(load_dir, tag)
        return load_engine(self, self.model_parallel.checkpoint_dir(load_dir), tag, request)

    def save_16bit_model(
        self, save_dir, save_filename: str = "model.safetensors", exclude_frozen_parameters=False
    ) -> bool:
        """Write the full weights (the module's dtype) from rank 0 (collective): safetensors
        when ``save_filename`` ends in ``.safetensors``, else ``torch.save`` of the state dict
        (what DeepSpeed writes, and ``torch.load`` reads).

        Under stage 3 this needs ``stage3_gather_16bit_weights_on_model_save: true``; without it
        nothing is written and False is returned, as in DeepSpeed.
        """
        if self.mpu is not None:
            raise UnsupportedError(
                "save_16bit_model with an mpu: each model-parallel rank holds a different part "
                "of the weights and there is no merge of tensor-parallel shards here; use "
                "save_checkpoint (one part per model-parallel rank, mp_rank_NN/)"
            )
        from runtime.checkpoint import save_16bit_model

        return save_16bit_model(self, save_dir, save_filename, exclude_frozen_parameters)
