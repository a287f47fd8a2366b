"""Side-by-side training benchmark: torch DDP, DeepSpeed, torch FSDP2 and this runtime.

One invocation trains the same GPT model (``examples/gpt.py``) on the same deterministic token
stream under each requested framework, one framework at a time, each in its own set of worker
processes (gloo on CPU, one compute thread per rank), and prints one table:

    python benchmarks/train_bench.py --stage 2 --steps 30 --warmup 5 \\
        --frameworks ddp,deepspeed,zlaunch [--precision fp32|bf16] [--world-size 2] [--json out.json]

Columns: median step time after warm-up and its ratio to DDP, peak RSS per rank, model-state
bytes per rank (measured by walking the objects, see ``bench_utils.reachable_tensor_bytes``)
beside docs/memory-model.md's formula, bytes sent per rank per step (intercepted ``torch.distributed``
collectives, see ``bench_utils.CollectiveCounter``), and the loss sequence compared with DDP's.
See benchmarks/README.md for the method and recorded results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_utils import (  # noqa: E402  (the benchmarks folder is not a package)
    THREAD_ENV,
    format_bytes,
    median,
)

__all__ = ["BenchSpec", "FRAMEWORKS", "main", "run_benchmark"]

REPO_ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("ddp", "deepspeed", "zlaunch", "fsdp2", "zlaunch_compile", "zlaunch_alone")
ALONE = "zlaunch_alone"
"""This runtime in a world of one with the same micro-batch: no communication at all, the
bound the 2-rank runs are measured against (its optimizer steps every parameter, where a
partitioned rank steps 1/N of them; its losses see rank 0's data only, so they are not
compared)."""
# Frameworks sum gradients in different orders, so fp32 losses drift apart by rounding, a little
# more each step (a few 1e-4 relative after 30 steps at lr 1e-3); a real difference in the
# algorithm (a missing average, a skipped clip) shows at 1e-2 or more within a few steps.
LOSS_MATCH_RTOL = {"fp32": 1e-3, "bf16": 5e-2}
CORPUS_CHARS = 400_000
RECORDS_DIR_ENV = "BENCH_COLLECTIVE_RECORDS"
"""Set to a directory: every rank keeps its collective records there, as under zlaunch."""


@dataclass(frozen=True)
class ModelShape:
    """The GPT's size: the benchmark model by default, a tiny one for smoke tests."""

    n_layer: int = 6
    d_model: int = 512
    n_head: int = 8
    seq_len: int = 128
    micro_batch: int = 4
    vocab_size: int = 8192
    """Rows of the (tied) embedding. The data are characters (ids below 97, examples/data.py);
    8192 rows give the benchmark model its ~23.2M parameters (see examples/gpt.py)."""

    @classmethod
    def tiny(cls) -> ModelShape:
        return cls(n_layer=2, d_model=64, n_head=4, seq_len=32, micro_batch=2, vocab_size=97)


@dataclass(frozen=True)
class BenchSpec:
    """Everything a worker needs; written as JSON for the worker processes."""

    stage: int = 2
    steps: int = 30
    warmup: int = 5
    frameworks: tuple[str, ...] = ("ddp", "deepspeed", "zlaunch")
    precision: str = "fp32"
    world_size: int = 2
    shape: ModelShape = field(default_factory=ModelShape)
    model: str = "gpt"
    """Which model (``bench_models.MODELS``): the repository's GPT or third-party code."""
    seed: int = 1234
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    gradient_clipping: float = 1.0
    bucket_size: int | None = None
    checkpoint: bool = False
    profile_dir: str | None = None
    torch_adamw: str = "default"
    """AdamW implementation for DDP and FSDP2: torch's "default" choice (a for-loop on CPU),
    "foreach" or "fused"."""
    timeout_s: float = 900.0
    compile_backend: str = "inductor"
    """torch.compile backend of ``zlaunch_compile`` (this runtime with ``compile.enabled``)."""
    communication_data_type: str | None = None
    """DeepSpeed's ``communication_data_type`` for DeepSpeed and this runtime (None: unset)."""

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"--stage must be 0, 1, 2 or 3, got {self.stage}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(
                f"--precision must be fp32 or bf16, got {self.precision!r} "
                "(DeepSpeed refuses fp16 on CPU)"
            )
        unknown = [name for name in self.frameworks if name not in FRAMEWORKS]
        if unknown or not self.frameworks:
            raise ValueError(
                f"--frameworks takes a comma list of {', '.join(FRAMEWORKS)}; got {unknown or '[]'}"
            )
        if self.steps <= self.warmup:
            raise ValueError(
                f"--steps ({self.steps}) must exceed --warmup ({self.warmup}): "
                "the median is taken over the steps after warm-up"
            )
        if self.torch_adamw not in ("default", "foreach", "fused"):
            raise ValueError(
                f"--torch-adamw must be default, foreach or fused, got {self.torch_adamw!r}"
            )
        if self.world_size < 1:
            raise ValueError(f"--world-size must be at least 1, got {self.world_size}")
        from bench_models import MODELS

        if self.model not in MODELS:
            raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {self.model!r}")

    @classmethod
    def from_json(cls, text: str) -> BenchSpec:
        raw = json.loads(text)
        raw["shape"] = ModelShape(**raw["shape"])
        raw["frameworks"] = tuple(raw["frameworks"])
        raw["betas"] = tuple(raw["betas"])
        return cls(**raw)


# --------------------------------------------------------------------------------------------
# Workers: one adapter per framework, one shared training loop
# --------------------------------------------------------------------------------------------


def build_model(spec: BenchSpec):
    """``spec.model`` (see ``bench_models``) at ``spec.shape``, initialised from ``spec.seed``."""
    from bench_models import build

    return build(spec.model, spec.shape, spec.seed)


def load_tokens(spec: BenchSpec):
    """The character corpus of ``examples/data.py`` (the Python stdlib's own sources)."""
    from examples.data import load_corpus

    return load_corpus(max_chars=CORPUS_CHARS)


def _loss_of(output):
    """The scalar loss from the model's output (a loss, or a (logits, loss) pair)."""
    if isinstance(output, (tuple, list)):
        return output[-1]
    return output


def _optimizer_params(spec: BenchSpec) -> dict[str, Any]:
    return {
        "lr": spec.lr,
        "betas": list(spec.betas),
        "eps": spec.eps,
        "weight_decay": spec.weight_decay,
    }


def _engine_config(spec: BenchSpec, extra_optimizer_params: dict | None = None) -> dict:
    """The DeepSpeed-style config shared by DeepSpeed and this runtime."""
    zero: dict[str, Any] = {"stage": spec.stage}
    if spec.bucket_size is not None:
        zero["reduce_bucket_size"] = spec.bucket_size
        zero["allgather_bucket_size"] = spec.bucket_size
        if spec.stage == 3:
            zero["stage3_prefetch_bucket_size"] = spec.bucket_size
    config = {
        "train_micro_batch_size_per_gpu": spec.shape.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": spec.gradient_clipping,
        "steps_per_print": 10**9,
        "optimizer": {
            "type": "AdamW",
            "params": {**_optimizer_params(spec), **(extra_optimizer_params or {})},
        },
        "bf16": {"enabled": spec.precision == "bf16"},
        "zero_optimization": zero,
    }
    if spec.communication_data_type is not None:
        config["communication_data_type"] = spec.communication_data_type
    return config


class Adapter:
    """How one framework initialises, wraps the model, and runs one training step."""

    def __init__(self, spec: BenchSpec) -> None:
        self.spec = spec

    def init_process_group(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")

    def setup(self, model) -> None:
        raise NotImplementedError

    def forward(self, inputs, targets):
        """The loss of one micro-batch."""
        raise NotImplementedError

    def backward(self, loss) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def state_roots(self) -> tuple:
        raise NotImplementedError

    def own_counter_bytes(self) -> float | None:
        """The framework's own count of bytes sent so far, when it keeps one."""
        return None

    def checkpoint(self, directory: Path) -> tuple[float, float] | None:
        """(save seconds, load seconds) of the framework's checkpoint API, when it has one."""
        return None


class TorchAdapter(Adapter):
    """Plain torch loops: DDP and FSDP2 share the step (clip, AdamW, zero_grad)."""

    def _autocast(self):
        import torch

        if self.spec.precision == "bf16" and self.use_autocast:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    use_autocast = True

    def _make_optimizer(self, params):
        import torch

        kwargs = _optimizer_params(self.spec)
        kwargs["betas"] = tuple(kwargs["betas"])
        if self.spec.torch_adamw != "default":
            kwargs[self.spec.torch_adamw] = True
        return torch.optim.AdamW(params, **kwargs)

    def forward(self, inputs, targets):
        with self._autocast():
            return _loss_of(self.model(inputs, targets))

    def backward(self, loss) -> None:
        loss.backward()

    def step(self) -> None:
        import torch

        if self.spec.gradient_clipping > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.gradient_clipping)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state_roots(self) -> tuple:
        return (self.model, self.optimizer)


class DDPAdapter(TorchAdapter):
    def setup(self, model) -> None:
        from torch.nn.parallel import DistributedDataParallel

        # Gradients as bucket views: the memory-lean setting, and the one whose gradient
        # buckets the object walk can see (otherwise they live only in C++).
        self.model = DistributedDataParallel(model, gradient_as_bucket_view=True)
        # DDP's built-in all-reduce runs in C++, out of reach of the Python-level counter; this
        # hook is torch's own default all-reduce hook (the same collective), in Python.
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.model.register_comm_hook(None, default_hooks.allreduce_hook)
        self.optimizer = self._make_optimizer(self.model.parameters())


class FSDP2Adapter(TorchAdapter):
    use_autocast = False  # FSDP2 casts through its MixedPrecisionPolicy instead

    def setup(self, model) -> None:
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy()
        if self.spec.precision == "bf16":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in _transformer_blocks(model):
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        self.model = model
        self.optimizer = self._make_optimizer(model.parameters())


def _transformer_blocks(model) -> list:
    import torch

    for container in model.modules():
        if isinstance(container, torch.nn.ModuleList) and len(container) > 0:
            return list(container)
    raise RuntimeError("FSDP2 wrapping needs the model's transformer blocks in a ModuleList")


class DeepSpeedAdapter(Adapter):
    def init_process_group(self) -> None:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")

    def setup(self, model) -> None:
        import deepspeed

        # torch_adam: DeepSpeed's own FusedAdam needs a compiled op; torch's AdamW is the same
        # arithmetic and what the other frameworks use.
        config = _engine_config(self.spec, {"torch_adam": True})
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config
        )

    def forward(self, inputs, targets):
        return _loss_of(self.engine(inputs, targets))

    def backward(self, loss) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()

    def state_roots(self) -> tuple:
        return (self.engine,)

    def checkpoint(self, directory: Path) -> tuple[float, float]:
        return _time_checkpoint(self.engine, directory)


class RuntimeAdapter(DeepSpeedAdapter):
    """This project's runtime, driven exactly as a DeepSpeed script drives DeepSpeed."""

    def init_process_group(self) -> None:
        import torch.distributed as dist

        # initialize() would do this itself; doing it here keeps the init timing comparable.
        if not dist.is_initialized():
            dist.init_process_group("gloo")

    def setup(self, model) -> None:
        import runtime

        self.engine, _, _, _ = runtime.initialize(
            model=model, model_parameters=model.parameters(), config=self.config()
        )

    def own_counter_bytes(self) -> float | None:
        return _runtime_sent_bytes(self.engine)

    def config(self) -> dict:
        return _engine_config(self.spec)

    def checkpoint(self, directory: Path) -> tuple[float, float] | None:
        if not hasattr(self.engine, "save_checkpoint"):
            return None
        return _time_checkpoint(self.engine, directory)


class CompiledRuntimeAdapter(RuntimeAdapter):
    """This runtime with ``"compile": {"enabled": true}``: torch.compile of the whole model at
    stages 0-2, of each transformer block at stage 3 (the first step runs eagerly, the second
    compiles: both fall in the warm-up)."""

    def config(self) -> dict:
        return {
            **_engine_config(self.spec),
            "compile": {"enabled": True, "backend": self.spec.compile_backend},
        }


def _runtime_sent_bytes(engine) -> float | None:
    """Total bytes sent so far according to the runtime's own counters (``runtime.distributed.comm``)."""
    stats = getattr(getattr(engine, "comm", None), "stats", None)
    total = getattr(stats, "total_bytes", None)
    return None if total is None else float(total)


def _time_checkpoint(engine, directory: Path) -> tuple[float, float]:
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    engine.save_checkpoint(str(directory), tag="bench")
    dist.barrier()
    saved = time.perf_counter()
    engine.load_checkpoint(str(directory), tag="bench")
    dist.barrier()
    return saved - started, time.perf_counter() - saved


ADAPTERS: dict[str, type[Adapter]] = {
    "ddp": DDPAdapter,
    "deepspeed": DeepSpeedAdapter,
    "zlaunch": RuntimeAdapter,
    "fsdp2": FSDP2Adapter,
    "zlaunch_compile": CompiledRuntimeAdapter,
    ALONE: RuntimeAdapter,
}


def framework_world(framework: str, spec: BenchSpec) -> int:
    return 1 if framework == ALONE else spec.world_size


def run_worker(framework: str, spec: BenchSpec, out: Path) -> None:
    """One rank of one framework: train ``spec.steps`` steps, write the measurements, exit."""
    from bench_utils import (
        CollectiveCounter,
        current_rss_bytes,
        peak_rss_bytes,
        pin_threads,
        reachable_tensor_bytes,
        window_batch,
    )

    pin_threads()
    records = os.environ.get(RECORDS_DIR_ENV)
    if records:  # as zlaunch.worker.boot does for every worker (records_overhead.py)
        from zlaunch.wire.protocol import COLLECTIVES_FILE_ENV
        from zlaunch.worker.collective_records import start_watch

        os.environ[COLLECTIVES_FILE_ENV] = os.path.join(records, f"rank-{os.environ['RANK']}.json")
        start_watch()
    import torch
    import torch.distributed as dist

    # Installed before the framework is imported: DeepSpeed keeps references to the functions.
    counter = CollectiveCounter().install()
    counter.enabled = False
    started = time.perf_counter()
    adapter = ADAPTERS[framework](spec)
    adapter.init_process_group()
    rank = dist.get_rank()
    baseline_rss = current_rss_bytes()
    tokens = load_tokens(spec)
    model = build_model(spec)
    num_params = sum(p.numel() for p in model.parameters())
    adapter.setup(model)
    init_s = time.perf_counter() - started

    shape = spec.shape
    step_times: list[float] = []
    cpu_times: list[float] = []  # all threads of the process: compute and gloo's
    phases: list[tuple[float, float, float]] = []  # forward, backward, step (wall)
    losses: list[float] = []
    own_before = None
    for step in range(spec.steps):
        if step == spec.warmup:
            counter.reset()
            counter.enabled = True
            own_before = adapter.own_counter_bytes()
        inputs, targets = window_batch(
            tokens, step, rank, shape.micro_batch, shape.seq_len, spec.seed
        )
        tick, cpu_tick = time.perf_counter(), time.process_time()
        loss = adapter.forward(inputs, targets)
        forward_done = time.perf_counter()
        adapter.backward(loss)
        backward_done = time.perf_counter()
        adapter.step()
        done = time.perf_counter()
        step_times.append(done - tick)
        cpu_times.append(time.process_time() - cpu_tick)
        phases.append((forward_done - tick, backward_done - forward_done, done - backward_done))
        losses.append(float(loss.detach().float()))
    counter.enabled = False
    own_after = adapter.own_counter_bytes()

    # One extra step, untimed: measure model states between backward and step, when
    # parameters, gradients and optimizer state all exist.
    inputs, targets = window_batch(
        tokens, spec.steps, rank, shape.micro_batch, shape.seq_len, spec.seed
    )
    adapter.backward(adapter.forward(inputs, targets))
    model_state_bytes = reachable_tensor_bytes(*adapter.state_roots())
    adapter.step()
    peak_rss = peak_rss_bytes()
    comm_steps = spec.steps - spec.warmup

    record: dict[str, Any] = {
        "framework": framework,
        "rank": rank,
        "num_params": num_params,
        "init_s": init_s,
        "step_times": step_times,
        "cpu_times": cpu_times,
        "phases": phases,
        "losses": losses,
        "comm": counter.snapshot(),
        "comm_steps": comm_steps,
        "runtime_comm_bytes": (
            (own_after - own_before) / comm_steps
            if own_before is not None and own_after is not None
            else None
        ),
        "model_state_bytes": model_state_bytes,
        "peak_rss_bytes": peak_rss,
        "baseline_rss_bytes": baseline_rss,
        "torch_threads": torch.get_num_threads(),
    }
    if spec.profile_dir:
        inputs, targets = window_batch(
            tokens, spec.steps + 1, rank, shape.micro_batch, shape.seq_len, spec.seed
        )
        _profile_step(adapter, inputs, targets, Path(spec.profile_dir), framework, rank)
    if spec.checkpoint:
        with tempfile.TemporaryDirectory(prefix=f"bench-ckpt-{framework}-") as tmp:
            shared = _shared_dir(tmp)
            timings = adapter.checkpoint(Path(shared))
        if timings is not None:
            record["save_s"], record["load_s"] = timings
    out.write_text(json.dumps(record))
    dist.barrier()
    # Leave without interpreter teardown: the record is written, and a gloo group that some
    # framework object still holds can abort the process at interpreter exit (SIGABRT), which
    # would fail a run that measured everything (runtime/distributed/teardown.py explains why).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _profile_step(adapter, inputs, targets, directory: Path, framework: str, rank: int) -> None:
    """One more untimed step under torch.profiler on rank 0: the operators a step costs."""
    from torch.profiler import ProfilerActivity, profile, record_function

    if rank != 0:
        adapter.backward(adapter.forward(inputs, targets))
        adapter.step()
        return
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("bench.forward"):
            loss = adapter.forward(inputs, targets)
        with record_function("bench.backward"):
            adapter.backward(loss)
        with record_function("bench.step"):
            adapter.step()
    directory.mkdir(parents=True, exist_ok=True)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    (directory / f"{framework}-rank0.txt").write_text(table)


def _shared_dir(local_tmp: str) -> str:
    """One checkpoint directory that every rank agrees on (rank 0's temporary directory)."""
    import torch.distributed as dist

    names = [local_tmp]
    dist.broadcast_object_list(names, src=0)
    return names[0]


# --------------------------------------------------------------------------------------------
# Parent: spawn one framework at a time, gather, print
# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FrameworkFailed(RuntimeError):
    pass


def _run_framework(spec: BenchSpec, framework: str, workdir: Path) -> list[dict[str, Any]]:
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(asdict(spec)))
    port = _free_port()
    procs = []
    logs = []
    world = framework_world(framework, spec)
    for rank in range(world):
        env = dict(os.environ)
        env.update(THREAD_ENV)
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world),
                "DS_ACCELERATOR": "cpu",
                "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
                ),
            }
        )
        log_path = workdir / f"{framework}-rank{rank}.log"
        log = open(log_path, "w")  # noqa: SIM115  (closed below)
        logs.append((log, log_path))
        cmd = [
            sys.executable,
            "-u",
            str(Path(__file__).resolve()),
            "--worker",
            framework,
            "--spec",
            str(spec_path),
            "--out",
            str(workdir / f"{framework}-rank{rank}.json"),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + spec.timeout_s
    failed = None
    try:
        for rank, proc in enumerate(procs):
            remaining = max(1.0, deadline - time.monotonic())
            try:
                code = proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                failed = (rank, f"timed out after {spec.timeout_s:.0f} s")
                break
            if code != 0:
                failed = (rank, f"exited with code {code}")
                break
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log, _ in logs:
            log.close()
    if failed is not None:
        rank, why = failed
        tail = "".join(logs[rank][1].read_text(errors="replace").splitlines(True)[-30:])
        raise FrameworkFailed(f"{framework} rank {rank} {why}; last log lines:\n{tail}")
    return [
        json.loads((workdir / f"{framework}-rank{rank}.json").read_text()) for rank in range(world)
    ]


def _formula_bytes(stage: int, precision: str, params: int, world: int) -> float:
    """docs/memory-model.md's model-state bytes per rank (Adam), without bucket buffers."""
    n, p = world, params
    if precision == "fp32":
        table = {0: 16 * p, 1: 8 * p + 8 * p / n, 2: 4 * p + 12 * p / n, 3: 16 * p / n}
    else:
        table = {0: 16 * p, 1: 4 * p + 12 * p / n, 2: 2 * p + 14 * p / n, 3: 16 * p / n}
    return table[stage]


def _framework_stage(framework: str, spec: BenchSpec) -> int:
    return {"ddp": 0, "fsdp2": 3}.get(framework, spec.stage)


def summarize(spec: BenchSpec, framework: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Reduce the per-rank records of one framework to one table row."""
    steps = len(ranks[0]["step_times"])
    per_step = [max(r["step_times"][i] for r in ranks) for i in range(steps)]
    timed = per_step[spec.warmup :]
    losses = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(steps)]
    comm_steps = ranks[0]["comm_steps"]
    sent = [sum(k["sent_bytes"] for k in r["comm"].values()) / comm_steps for r in ranks]
    kinds: dict[str, dict[str, float]] = {}
    for r in ranks:
        for kind, c in r["comm"].items():
            row = kinds.setdefault(kind, {"calls": 0.0, "payload_bytes": 0.0, "sent_bytes": 0.0})
            for key in row:
                row[key] += c[key] / comm_steps / len(ranks)
    stage = _framework_stage(framework, spec)
    params = ranks[0]["num_params"]
    own_counter = [r.get("runtime_comm_bytes") for r in ranks]
    row = {
        "framework": framework,
        "stage": stage,
        "precision": spec.precision,
        "world_size": framework_world(framework, spec),
        "num_params": params,
        "step_time_s": median(timed),
        "step_times_s": per_step,
        "min_step_time_s": min(timed),
        # Rank 0's median wall time per phase: where a step's time goes.
        "phase_s": {
            name: median(p[k] for p in ranks[0]["phases"][spec.warmup :])
            for k, name in enumerate(("forward", "backward", "step"))
        },
        "cpu_time_s": median(
            max(r["cpu_times"][i] for r in ranks) for i in range(spec.warmup, steps)
        ),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks),
        "baseline_rss_bytes": max(r["baseline_rss_bytes"] for r in ranks),
        "model_state_bytes": max(r["model_state_bytes"] for r in ranks),
        "formula_bytes": _formula_bytes(
            stage, spec.precision, params, framework_world(framework, spec)
        ),
        "sent_bytes_per_step": max(sent),
        "comm_by_kind": kinds,
        "runtime_counter_bytes_per_step": (
            max(own_counter) if all(v is not None for v in own_counter) else None
        ),
        "losses": losses,
        "init_s": max(r["init_s"] for r in ranks),
        "save_s": _max_or_none(r.get("save_s") for r in ranks),
        "load_s": _max_or_none(r.get("load_s") for r in ranks),
    }
    return row


def _max_or_none(values) -> float | None:
    values = list(values)
    if any(v is None for v in values):
        return None
    return max(values)


def _max_rel_diff(row: dict[str, Any], reference: dict[str, Any]) -> float:
    worst = 0.0
    for a, b in zip(row["losses"], reference["losses"], strict=True):
        worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
    return worst


def run_benchmark(spec: BenchSpec, workdir: Path | None = None) -> dict[str, Any]:
    """Run every framework of ``spec`` in turn; return the rows and the comparison."""
    own_tmp = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="train_bench-")) if own_tmp else workdir
    try:
        rows = []
        for framework in spec.frameworks:
            world = framework_world(framework, spec)
            print(f"[train_bench] {framework}: {world} ranks ...", flush=True)
            started = time.monotonic()
            ranks = _run_framework(spec, framework, workdir)
            row = summarize(spec, framework, ranks)
            # Other work on the host inflates wall times: keep the evidence beside the numbers.
            row["load_avg_1min_after"] = os.getloadavg()[0]
            rows.append(row)
            print(
                f"[train_bench] {framework}: done in {time.monotonic() - started:.0f} s",
                flush=True,
            )
    finally:
        if own_tmp:
            shutil.rmtree(workdir, ignore_errors=True)
    reference = next((r for r in rows if r["framework"] == "ddp"), rows[0])
    alone = next((r for r in rows if r["framework"] == ALONE), None)
    for row in rows:
        row["step_time_ratio"] = row["step_time_s"] / reference["step_time_s"]
        # Against the comm-free bound: the runtime alone, same micro-batch.
        row["bound_ratio"] = row["step_time_s"] / alone["step_time_s"] if alone else None
        if row["framework"] == ALONE:  # rank 0's data only: a different loss sequence
            row["loss_max_rel_diff"], row["loss_matches"] = None, None
            continue
        row["loss_max_rel_diff"] = _max_rel_diff(row, reference)
        row["loss_matches"] = row["loss_max_rel_diff"] <= LOSS_MATCH_RTOL[spec.precision]
    return {
        "spec": asdict(spec),
        "command": command_line(spec),
        "environment": environment(),
        "reference": reference["framework"],
        "threads_per_rank": 1,
        "rows": rows,
    }


def command_line(spec: BenchSpec) -> str:
    """The command that reproduces ``spec``."""
    parts = [
        "python benchmarks/train_bench.py",
        f"--stage {spec.stage}",
        f"--steps {spec.steps}",
        f"--warmup {spec.warmup}",
        f"--frameworks {','.join(spec.frameworks)}",
        f"--precision {spec.precision}",
        f"--world-size {spec.world_size}",
    ]
    if spec.shape == ModelShape.tiny():
        parts.append("--tiny")
    if spec.model != "gpt":
        parts.append(f"--model {spec.model}")
    if spec.bucket_size is not None:
        parts.append(f"--bucket-size {spec.bucket_size}")
    if spec.checkpoint:
        parts.append("--checkpoint")
    if spec.torch_adamw != "default":
        parts.append(f"--torch-adamw {spec.torch_adamw}")
    if "zlaunch_compile" in spec.frameworks and spec.compile_backend != "inductor":
        parts.append(f"--compile-backend {spec.compile_backend}")
    if spec.communication_data_type is not None:
        parts.append(f"--communication-data-type {spec.communication_data_type}")
    return " ".join(parts)


def environment() -> dict[str, Any]:
    """Versions and host facts that the numbers depend on (no framework is imported here)."""
    import platform
    from importlib import metadata

    versions = {}
    for package in ("torch", "deepspeed"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "python": platform.python_version(),
        **versions,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }


def _losses_text(losses: list[float], k: int = 3) -> str:
    head = " ".join(f"{v:.4f}" for v in losses[:k])
    tail = " ".join(f"{v:.4f}" for v in losses[-k:])
    return f"{head} .. {tail}"


def format_table(result: dict[str, Any]) -> str:
    """A markdown table of the rows (also readable in a terminal)."""
    ref = result["reference"]
    header = [
        "framework",
        "stage",
        "step ms (median)",
        f"x {ref}",
        "x alone",
        "CPU ms/step",
        "peak RSS/rank",
        "model states/rank",
        "formula",
        "sent/rank/step",
        "losses (first .. last)",
        f"max rel diff vs {ref}",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result["rows"]:
        cells = [
            row["framework"],
            str(row["stage"]),
            f"{row['step_time_s'] * 1e3:.1f}",
            f"{row['step_time_ratio']:.3f}",
            "-" if row.get("bound_ratio") is None else f"{row['bound_ratio']:.3f}",
            f"{row['cpu_time_s'] * 1e3:.1f}",
            format_bytes(row["peak_rss_bytes"]),
            format_bytes(row["model_state_bytes"]),
            format_bytes(row["formula_bytes"]),
            format_bytes(row["sent_bytes_per_step"]),
            _losses_text(row["losses"]),
            (
                "- (rank 0's data alone)"
                if row["loss_matches"] is None
                else f"{row['loss_max_rel_diff']:.1e}"
                + ("" if row["loss_matches"] else " (differs)")
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_details(result: dict[str, Any]) -> str:
    """Per-framework extras: collectives by kind, init time, runtime's own counter, checkpoints."""
    out = []
    for row in result["rows"]:
        kinds = ", ".join(
            f"{kind} {c['calls']:.0f}x {format_bytes(c['sent_bytes'])}"
            for kind, c in row["comm_by_kind"].items()
            if c["calls"]
        )
        phases = row.get("phase_s")
        extra = [
            f"fastest step {row['min_step_time_s'] * 1e3:.1f} ms",
            f"init {row['init_s']:.1f} s",
            f"RSS after imports {format_bytes(row['baseline_rss_bytes'])}",
            f"collectives/step: {kinds or 'none'}",
        ]
        if phases:
            extra.insert(
                1,
                "rank 0 forward/backward/step "
                + "/".join(f"{phases[k] * 1e3:.1f}" for k in ("forward", "backward", "step"))
                + " ms",
            )
        if row["runtime_counter_bytes_per_step"] is not None:
            extra.append(
                f"runtime's own counter {format_bytes(row['runtime_counter_bytes_per_step'])}/step"
            )
        extra.append(f"1-min load average after the run {row['load_avg_1min_after']:.2f}")
        if row["save_s"] is not None:
            extra.append(f"checkpoint save {row['save_s']:.2f} s, load {row['load_s']:.2f} s")
        out.append(f"- {row['framework']}: " + "; ".join(extra))
    return "\n".join(out)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="total steps per framework")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the median")
    parser.add_argument("--frameworks", default="ddp,deepspeed,zlaunch")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="tiny model (smoke tests)")
    parser.add_argument(
        "--model",
        default="gpt",
        help="gpt (examples/gpt.py), torch_encoder (nn.TransformerEncoderLayer) or hf_llama",
    )
    parser.add_argument(
        "--bucket-size",
        type=int,
        default=None,
        help="reduce/allgather bucket size (elements) for DeepSpeed and this runtime "
        "(default: their own default, 5e8)",
    )
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="also time save/load_checkpoint after training",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="also profile one extra step on rank 0 (torch.profiler); write DIR/<framework>-rank0.txt",
    )
    parser.add_argument(
        "--torch-adamw",
        default="default",
        choices=("default", "foreach", "fused"),
        help="AdamW implementation of the DDP and FSDP2 baselines (default: torch's own choice, "
        "a per-parameter loop on CPU)",
    )
    parser.add_argument(
        "--communication-data-type",
        choices=("fp32", "fp16", "bf16"),
        help="the config's communication_data_type (DeepSpeed and this runtime)",
    )
    parser.add_argument("--json", help="write the full result (per-step data) here")
    parser.add_argument("--markdown", help="write a results page (markdown) here")
    parser.add_argument(
        "--render",
        metavar="JSON",
        help="print (and --markdown) a saved result instead of running",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per framework")
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend of the zlaunch_compile framework (default inductor)",
    )
    # worker mode (internal)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.worker:
        spec = BenchSpec.from_json(Path(args.spec).read_text())
        run_worker(args.worker, spec, Path(args.out))
        return 0
    if args.render:
        result = json.loads(Path(args.render).read_text())
        print(format_report(result))
        _write_outputs(result, args)
        return 0
    try:
        spec = BenchSpec(
            stage=args.stage,
            steps=args.steps,
            warmup=args.warmup,
            frameworks=tuple(f.strip() for f in args.frameworks.split(",") if f.strip()),
            precision=args.precision,
            world_size=args.world_size,
            shape=ModelShape.tiny() if args.tiny else ModelShape(),
            model=args.model,
            bucket_size=args.bucket_size,
            checkpoint=args.checkpoint,
            torch_adamw=args.torch_adamw,
            profile_dir=str(Path(args.profile).resolve()) if args.profile else None,
            timeout_s=args.timeout,
            compile_backend=args.compile_backend,
            communication_data_type=args.communication_data_type,
        )
    except ValueError as error:
        print(f"train_bench: {error}", file=sys.stderr)
        return 2
    try:
        result = run_benchmark(spec)
    except FrameworkFailed as error:
        print(f"train_bench: {error}", file=sys.stderr)
        return 1
    print()
    print(format_report(result))
    _write_outputs(result, args)
    return 0


def _write_outputs(result: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(format_markdown(result))


def format_report(result: dict[str, Any]) -> str:
    """Table, per-framework details and the one-line description of the setup."""
    spec = result["spec"]
    shape = spec["shape"]
    summary = (
        f"{spec['world_size']} ranks, gloo on CPU, 1 thread per rank, {spec['precision']}, "
        f"{result['rows'][0]['num_params'] / 1e6:.2f}M parameters, micro-batch "
        f"{shape['micro_batch']} x {shape['seq_len']} tokens; median over steps "
        f"{spec['warmup'] + 1}..{spec['steps']} of the slowest rank's step time."
    )
    return f"{format_table(result)}\n\n{format_details(result)}\n\n{summary}\n"


def format_markdown(result: dict[str, Any]) -> str:
    """A results page: what ran, on what, the table, and the loss sequences in full."""
    spec = result["spec"]
    env = result.get("environment", {})
    title = (
        f"{spec.get('model', 'gpt')}, ZeRO stage {spec['stage']}, {spec['precision']}, "
        f"{spec['world_size']} ranks"
    )
    lines = [f"# Training benchmark: {title}", ""]
    lines.append(
        f"Command: `{result.get('command') or command_line(BenchSpec.from_json(json.dumps(spec)))}`"
    )
    lines.append("")
    if env:
        facts = ", ".join(f"{k} {v}" for k, v in env.items() if v is not None)
        lines += [f"Environment: {facts}.", ""]
    lines += [format_report(result), "## Losses per step (mean over ranks)", ""]
    names = [row["framework"] for row in result["rows"]]
    lines.append("| step | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for i in range(len(result["rows"][0]["losses"])):
        cells = [f"{row['losses'][i]:.6f}" for row in result["rows"]]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
