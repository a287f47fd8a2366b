"""The device check's items, each run by `gpu_check.py` in a process of its own:

    python benchmarks/gpu_check_items.py --item ID --device cuda|cpu --repo REPO --out FILE

with the project installed by the check first on ``PYTHONPATH`` (never this tree's copy: the
script's own folder, benchmarks/, is the only part of the tree on the path). An item returns
``{"status": "ok" | "fail" | "skipped", "figure": one line, "details": {...}}``; an item made
of parts records each part as it finishes (`Progress`), so a timeout keeps what was measured.

This module holds the runner, the shared pieces (the models, the data, the plain-torch
reference) and the torch-version item; the training items are in `gpu_check_train.py`, the
speed and memory items in `gpu_check_perf.py`, the launch items in `gpu_check_launch.py`.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import logging
import math
import os
import platform
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = [
    "Ctx",
    "Progress",
    "REGISTRY",
    "engine_losses",
    "gpt",
    "item",
    "max_rel_dev",
    "reference_losses",
    "token_batches",
]

REGISTRY: dict[str, Callable[[Ctx], dict]] = {}


def item(name: str):
    def register(fn):
        REGISTRY[name] = fn
        return fn

    return register


class Progress:
    """An item's finished parts, one JSON line each, next to its result file."""

    def __init__(self, path: Path):
        self.path = path
        self.parts: list[dict] = []

    def add(self, **part) -> dict:
        self.parts.append(part)
        with open(self.path, "a") as f:
            f.write(json.dumps(part, default=str) + "\n")
        return part


class Ctx:
    """What an item is given: the device, the repository (examples/), a scratch folder."""

    def __init__(self, device: str, repo: Path, work: Path, progress: Progress):
        self.device = torch.device(device)
        self.repo = repo
        self.work = work
        self.progress = progress

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


# ---------------------------------------------------------------------------- shared pieces
def gpt(repo: Path):
    """examples/gpt.py, loaded by path (examples/ is not installed)."""
    spec = importlib.util.spec_from_file_location("gpu_check_gpt", repo / "examples" / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def small_gpt(repo: Path, seed: int = 0, **shape):
    g = gpt(repo)
    config = dict(vocab_size=256, n_layer=2, n_head=4, d_model=128, seq_len=64)
    config.update(shape)
    torch.manual_seed(seed)
    return g.GPT(g.GPTConfig(**config))


def token_batches(steps: int, batch: int, seq: int, vocab: int, seed: int = 1) -> list:
    """Learnable sequences (a shifted ramp per row): the loss falls within a few steps."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 4, (batch, 1), generator=g)
        ids = (start + stride * torch.arange(seq + 1)) % vocab
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def max_rel_dev(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def engine_config(stage: int, precision: str, micro: int, **extra) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {**ADAMW, "betas": list(ADAMW["betas"])}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10_000,
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # A static scale: the reference applies the same one (dynamic scaling is its own item).
        cfg["fp16"] = {"enabled": True, "loss_scale": 128}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def engine_losses(build, config: dict, batches: list, device) -> tuple[list[float], object]:
    import runtime

    engine, *_ = runtime.initialize(model=build(), config=config)
    losses = []
    for x, y in batches:
        _, loss = engine(x.to(device), y.to(device))
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses, engine


def reference_losses(build, precision: str, batches: list, device, *, scale: float = 128.0):
    """Plain torch: fp32 training with `torch.optim.AdamW` and `clip_grad_norm_`; under bf16
    and fp16 the same mixed-precision recipe by hand (16-bit model, fp32 master copy, fp16's
    static loss scale), with the same fused AdamW the runtime picks on CUDA."""
    model = build().to(device)
    fused = {"fused": True} if device.type == "cuda" else {}
    dtype = DTYPES[precision]
    if precision == "fp32":
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, **ADAMW, **fused)
        masters = None
    else:
        masters = [p.detach().clone().float() for p in model.parameters()]
        model.to(dtype)
        params = list(model.parameters())
        opt = torch.optim.AdamW(masters, **ADAMW, **fused)
    losses = []
    loss_scale = scale if precision == "fp16" else 1.0
    for x, y in batches:
        _, loss = model(x.to(device), y.to(device))
        (loss.float() * loss_scale).backward()
        losses.append(float(loss.detach()))
        if masters is None:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        else:
            grads = [p.grad.float() / loss_scale for p in params]
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads])
            )
            coef = min(1.0, 1.0 / (float(norm) + 1e-6))
            for m, g in zip(masters, grads, strict=True):
                m.grad = g * coef
        opt.step()
        opt.zero_grad(set_to_none=True)
        if masters is not None:
            with torch.no_grad():
                for p, m in zip(params, masters, strict=True):
                    p.copy_(m)
                    p.grad = None
    return losses


def quiet_runtime_logs() -> None:
    """Keep the world-of-one note and config notes out of the item's log noise."""
    logging.getLogger("runtime").setLevel(logging.ERROR)


# ---------------------------------------------------------------------------- torch_api
def _has(path: str) -> bool:
    obj = torch
    for part in path.split(".")[1:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


# (what, the torch attribute, what the project does without it)
APIS = (
    ("all_gather_into_tensor", "torch.distributed.all_gather_into_tensor", "required"),
    ("reduce_scatter_tensor", "torch.distributed.reduce_scatter_tensor", "required"),
    ("all_gather_single", "torch.distributed.all_gather_single",
     "all_gather_into_tensor (the same collective, torch's older name)"),
    ("reduce_scatter_single", "torch.distributed.reduce_scatter_single",
     "reduce_scatter_tensor (the same collective, torch's older name)"),
    ("all_to_all_single", "torch.distributed.all_to_all_single", "required: qgZ, gloo's reduce-scatter"),
    ("flight recorder (all backends)", "torch._C._distributed_c10d._dump_fr_trace_json",
     "zlaunch stacks shows no collective records"),
    ("flight recorder (NCCL)", "torch._C._distributed_c10d._dump_nccl_trace_json",
     "NCCL's records are not collected"),
    ("graph task id", "torch._C._current_graph_task_id", "required (stage 3 recomputation)"),
    ("saved-tensor hooks", "torch.autograd.graph.saved_tensors_hooks", "required (stage 3)"),
    ("dynamo recompile limit", "torch._dynamo.config.recompile_limit",
     "compile keeps torch's default recompile limit"),
)  # fmt: skip


@item("torch_api")
def torch_api(ctx: Ctx) -> dict:
    import torch.distributed as dist

    import runtime
    import zlaunch

    missing, found = [], []
    for what, path, without in APIS:
        try:
            ok = _has(path)
        except Exception:  # noqa: BLE001 - a lazy module that fails to import is "missing"
            ok = False
        (found if ok else missing).append({"api": what, "path": path, "without": without})
    init_params = inspect.signature(dist.init_process_group).parameters
    device_id = "device_id" in init_params
    if not device_id:
        missing.append({"api": "init_process_group(device_id=)", "without": "lazy NCCL init"})
    carried = {}
    for name in ("fabric", "hjson"):
        try:
            module = importlib.import_module(name)
            carried[name] = getattr(module, "__version__", "?")
        except Exception as e:  # noqa: BLE001 - reported as the failure it is
            carried[name] = None
            missing.append({"api": f"import {name}", "without": f"required: {e}"})
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.machine()})"
    installed_from = os.path.dirname(os.path.dirname(runtime.__file__))
    details = {
        "torch": torch.__version__,
        "cuda": cuda,
        "cuda_version": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "device": device,
        "device_count": torch.cuda.device_count() if cuda else 0,
        "capability": list(torch.cuda.get_device_capability(0)) if cuda else None,
        "runtime_from": installed_from,
        "zlaunch_from": os.path.dirname(os.path.dirname(zlaunch.__file__)),
        "python": sys.version.split()[0],
        "carried": carried,
        "missing": missing,
        "found": [f["api"] for f in found],
    }
    required = [m for m in missing if m["without"].startswith("required")]
    optional = [m for m in missing if m not in required]
    from_tree = Path(installed_from).resolve() == ctx.repo.resolve()
    status = "fail" if required or from_tree else "ok"
    figure = (
        f"torch {torch.__version__}, {device}"
        + (f", CUDA {torch.version.cuda}, NCCL {details['nccl']}" if cuda else "")
        + (f"; MISSING: {', '.join(m['api'] for m in required)}" if required else "")
        + (f"; absent, fallback used: {', '.join(m['api'] for m in optional)}" if optional else "")
        + ("" if missing else "; all APIs present")
        + ("; the project was imported from the tree, not the install" if from_tree else "")
    )
    return {"status": status, "figure": figure, "details": details}


# ---------------------------------------------------------------------------- runner
def _load_items() -> dict[str, Callable[[Ctx], dict]]:
    """Every item, registered by its module. Run as a script this file is ``__main__``, and
    the item modules register with the module ``gpu_check_items`` they import: its registry."""
    import gpu_check_items
    import gpu_check_launch  # noqa: F401 - registers its items
    import gpu_check_perf  # noqa: F401
    import gpu_check_train  # noqa: F401

    return gpu_check_items.REGISTRY


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--item", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args(argv)
    registry = _load_items()
    out = Path(args.out)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    progress = Progress(out.with_suffix(".partial"))
    quiet_runtime_logs()
    try:
        result = registry[args.item](Ctx(args.device, Path(args.repo), work, progress))
    except Exception as e:  # noqa: BLE001 - an item that breaks is reported, with its traceback
        traceback.print_exc()
        result = {
            "status": "error",
            "figure": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300],
            "details": {"traceback": traceback.format_exc()[-3000:]},
        }
    if progress.parts:
        result.setdefault("details", {})["parts"] = progress.parts
    for key in ("status", "figure"):
        result.setdefault(key, "")
    out.write_text(json.dumps(_finite(result), default=str))
    return 0


def _finite(value):
    """JSON has no inf/nan: they become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
