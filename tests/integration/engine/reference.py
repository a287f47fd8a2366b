"""The pieces shared by the multi-rank engine tests: the training setup, the rank-side training
loop, the single-process reference they are compared with, and the measurements.

The ranks each train on their slice of every micro-step; the reference trains the same model
on the concatenated batch of all ranks and micro-steps, in one process, with torch's AdamW and
clip_grad_norm_. The mean of the ranks' losses per step must then match the reference's loss.
"""

from __future__ import annotations

import torch

__all__ = [
    "GAS",
    "LR",
    "MICRO",
    "STEPS",
    "assert_matches_reference",
    "base_config",
    "comm_bytes_per_step",
    "mean_step_losses",
    "micro_slice",
    "model_state_bytes",
    "reference_training",
    "small_model",
    "square_config",
    "square_model",
    "train_steps",
    "train_user_example",
]

STEPS, GAS, MICRO, LR = 20, 2, 3, 1e-2


def small_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 24),
        torch.nn.Tanh(),
        torch.nn.Linear(24, 24),
        torch.nn.Tanh(),
        torch.nn.Linear(24, 3),
    )


def square_model() -> torch.nn.Module:
    torch.manual_seed(7)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(128, 128, bias=False), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def micro_slice(t: torch.Tensor, m: int, rank: int, world: int, micro: int = MICRO):
    """Rows of micro-step ``m`` that belong to ``rank`` in a step's concatenated batch."""
    lo = (m * world + rank) * micro
    return t[lo : lo + micro]


def base_config(zero: dict, **extra) -> dict:
    """The parity runs' config: ``zero`` entries override the zero_optimization defaults."""
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "zero_optimization": {"reduce_bucket_size": 300, **zero},
    }
    cfg.update(extra)
    return cfg


def square_config(zero: dict) -> dict:
    """The measurement runs' config (square_model, one micro-batch of 2 per step)."""
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": zero,
    }


def train_steps(engine, x, y, rank: int, world: int, first: int, last: int) -> list[float]:
    """Steps ``first``..``last - 1`` of GAS micro-steps each; the loss of every micro-step."""
    losses = []
    for s in range(first, last):
        for m in range(GAS):
            out = engine(micro_slice(x[s], m, rank, world))
            loss = torch.nn.functional.mse_loss(out.float(), micro_slice(y[s], m, rank, world))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    return losses


def train_user_example(engine, rank: int) -> list[float]:
    """The user examples' loop: 15 epochs of 4 batches of 16 rows per rank; every loss."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 32, 6, generator=g)
    w = torch.randn(6, 3, generator=g)
    losses = []
    for _epoch in range(15):
        for b in range(4):
            xb = x[b, rank * 16 : rank * 16 + 16]
            loss = torch.nn.functional.mse_loss(engine(xb).float(), torch.tanh(xb @ w))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    return losses


def reference_training(model: torch.nn.Module, x, y):
    """Train ``model`` in this process on each step's whole batch; (losses, parameters).

    Only parameters with ``requires_grad`` are trained (frozen ones never change)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, weight_decay=0.01)
    losses = []
    for s in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(x[s]), y[s])
        opt.zero_grad()
        loss.backward()
        for p in trained:  # the engine steps unused parameters with zero gradients
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def mean_step_losses(per_rank: list[list[float]], world: int) -> list[float]:
    """The mean over ranks and micro-steps of each step's losses: the reference's loss."""
    return [
        sum(per_rank[r][s * GAS + m] for r in range(world) for m in range(GAS)) / (world * GAS)
        for s in range(STEPS)
    ]


def assert_matches_reference(case, step_losses, rank_params, ref_losses, ref_params) -> None:
    """Losses within 1e-5 relative of the reference's, every rank's parameters within 1e-5."""
    for s, (got, want) in enumerate(zip(step_losses, ref_losses, strict=True)):
        assert abs(got - want) <= 1e-5 * abs(want), (case, s, got, want)
    for params in rank_params:
        for name, want in ref_params.items():
            torch.testing.assert_close(params[name], want, rtol=1e-5, atol=1e-5)
    assert ref_losses[-1] < ref_losses[0]  # the run actually trains


def comm_bytes_per_step(runtime, zero: dict) -> dict[str, int]:
    """Bytes per collective kind of the second step (the first one warms up)."""
    engine, *_ = runtime.initialize(model=square_model(), config=square_config(zero))
    x = torch.randn(2, 128)
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    engine.comm.stats.reset()
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    return engine.comm.stats.snapshot()


def model_state_bytes(engine) -> int:
    """Bytes of every distinct tensor storage reachable from the engine (walked generically)."""
    storages: dict[int, int] = {}
    seen: set[int] = set()
    stack = [engine.module, engine.optimizer, engine.optimizer.optimizer, engine.sharding, engine]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if torch.is_tensor(obj):
            st = obj.untyped_storage()
            storages[st.data_ptr()] = max(storages.get(st.data_ptr(), 0), st.nbytes())
            if obj.grad is not None:
                stack.append(obj.grad)
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend(obj.state.values())
            stack.extend(obj.param_groups)
        elif isinstance(obj, torch.nn.Module):
            stack.extend(obj.parameters())
            stack.extend(obj.buffers())
            stack.extend(v for k, v in vars(obj).items() if not k.startswith("_"))
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("runtime"):
            stack.extend(vars(obj).values())
        elif hasattr(type(obj), "__slots__") and type(obj).__module__.startswith("runtime"):
            stack.extend(getattr(obj, s, None) for s in type(obj).__slots__)
    storages.pop(0, None)  # released (zero-size) storages
    return sum(storages.values())
