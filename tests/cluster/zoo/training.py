"""The zoo's two trainings of one model: on gloo ranks through the runtime (every ZeRO stage in
turn, in one process group), and in one process with torch's AdamW (the reference).

Each optimizer step takes a batch of ``WORLD * GAS * MICRO`` rows; on the ranks, micro-step
``m`` of rank ``r`` takes rows ``(m * WORLD + r) * MICRO`` onwards, the reference takes them
all at once. Every micro-batch has the same number of loss terms, so the mean of the ranks'
losses is the reference's loss and the summed gradients are the reference's gradient.
"""

from __future__ import annotations

import torch

__all__ = ["GAS", "LR", "MICRO", "STEPS", "WORLD", "config", "reference", "train_on_ranks"]

WORLD, GAS, MICRO, STEPS, LR = 2, 2, 2, 4, 2e-3


def config(stage: int, lr: float = LR) -> dict:
    zero = {"stage": stage}
    if stage == 3:
        # Everything partitioned (nothing persistent): every parameter takes the fetch path.
        zero["stage3_param_persistence_threshold"] = 0
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}},
        "zero_optimization": zero,
    }


def _rows(batch: dict, lo: int, n: int) -> dict:
    return {k: v[lo : lo + n] for k, v in batch.items()}


def train_on_ranks(name: str, stages: list[int]) -> dict[int, dict]:
    """Rank side: train model ``name`` at each stage; per stage its losses and parameters."""
    from tests.cluster.zoo.models import ZOO

    return {stage: train_model_on_ranks(ZOO[name].build(), name, stage) for stage in stages}


def train_model_on_ranks(model: torch.nn.Module, name: str, stage: int) -> dict:
    """Rank side: train ``model`` (built as zoo entry ``name``) at ``stage``."""
    import torch.distributed as dist

    import runtime
    from tests.cluster.zoo.models import ZOO, make_batches

    entry = ZOO[name]
    engine, *_ = runtime.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config(stage),
    )
    rank = dist.get_rank()
    losses = []
    for batch in make_batches(entry.kind, STEPS, WORLD * GAS * MICRO):
        for m in range(GAS):
            loss = entry.loss(engine, _rows(batch, (m * WORLD + rank) * MICRO, MICRO))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    params = list(engine.module.parameters())
    with runtime.zero.GatheredParameters(params):
        final = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    return {"losses": losses, "params": final}


def reference(name: str, lr: float = LR) -> tuple[list[float], dict, dict]:
    """One process, whole batches: (step losses, final parameters, initial parameters)."""
    from tests.cluster.zoo.models import ZOO, make_batches

    entry = ZOO[name]
    model = entry.build()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=0.01)
    losses = []
    for batch in make_batches(entry.kind, STEPS, WORLD * GAS * MICRO):
        opt.zero_grad()
        loss = entry.loss(model, batch)
        loss.backward()
        for p in trained:  # the engine steps parameters without a gradient with zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, initial


def step_losses(rank_results: list[dict], stage: int) -> list[float]:
    """The mean over ranks and micro-steps of each step's losses (the reference's loss)."""
    per_rank = [r[stage]["losses"] for r in rank_results]
    return [
        sum(per_rank[r][s * GAS + m] for r in range(WORLD) for m in range(GAS)) / (WORLD * GAS)
        for s in range(STEPS)
    ]
