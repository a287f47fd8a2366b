"""ZeRO inside a model-parallel layout: 4 gloo ranks = 2 model-parallel x 2 data-parallel.

The model is a small tensor-parallel transformer written below (Megatron's column- and
row-parallel linears over the model-parallel group); its blocks run through
runtime.activation_checkpointing with ``partition_activations``. One spawn trains it at ZeRO stages 0, 1
and 2 (`runtime.initialize(mpu=...)`), saves a checkpoint halfway, reloads it into a fresh
engine, measures what partitioned checkpoints hold, and asks for stage 3 (refused). The
reference trains the full model in this process on the concatenated batch with torch's AdamW
and clip_grad_norm_; parameters, losses and gradient norms must agree within 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.integration.engine.mp_utils import run_ranks

pytestmark = pytest.mark.multirank

HERE = "tests/integration/engine/test_model_parallel.py"
MP, DP = 2, 2
STEPS, SAVE_AT, GAS, MICRO, LR, CLIP = 4, 2, 2, 2, 1e-2, 0.5
CASES = {
    0: {"partition_activations": True},
    1: {"partition_activations": True, "cpu_checkpointing": True},
    2: {
        "partition_activations": True,
        "contiguous_memory_optimization": True,
        "number_checkpoints": 2,
    },
}

# --------------------------------------------------------------------------- the model
# A small tensor-parallel transformer (Megatron's layout). TPTransformer(size=1) is the full
# model (the reference); shard(full, rank, size, group) builds model-parallel rank `rank`'s
# part: query/key/value and the first MLP layer are column-parallel, the attention output and
# the second MLP layer row-parallel (partial products summed over the group, bias added once
# after the sum), layer norms and the input/output layers replicated. Sharded parameters carry
# Megatron's `tensor_model_parallel = True`.
HIDDEN, HEADS, FEATURES, OUT, SEQ = 16, 4, 6, 3, 8


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; gradients summed over the group (the input feeds every rank)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromGroup(torch.autograd.Function):
    """Sum of the ranks' partial results forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class Linear(torch.nn.Module):
    """Column-parallel (split outputs), row-parallel (split inputs) or replicated."""

    def __init__(self, n_in, n_out, kind="replicated", size=1, group=None, bias=True):
        super().__init__()
        self.kind, self.group, self.size = kind, group, size
        n_out_here = n_out // size if kind == "column" else n_out
        n_in_here = n_in // size if kind == "row" else n_in
        self.weight = torch.nn.Parameter(torch.empty(n_out_here, n_in_here))
        self.bias = torch.nn.Parameter(torch.empty(n_out_here)) if bias else None
        torch.nn.init.normal_(self.weight, std=0.3)
        if bias:
            torch.nn.init.normal_(self.bias, std=0.1)
        if kind != "replicated" and size > 1:
            self.weight.tensor_model_parallel = True
        if kind == "column" and size > 1 and bias:
            self.bias.tensor_model_parallel = True

    def forward(self, x):
        if self.size == 1:
            return F.linear(x, self.weight, self.bias)
        if self.kind == "column":
            return F.linear(_CopyToGroup.apply(x, self.group), self.weight, self.bias)
        if self.kind == "row":
            return _ReduceFromGroup.apply(F.linear(x, self.weight), self.group) + self.bias
        return F.linear(x, self.weight, self.bias)

    def take_from(self, full: Linear, rank: int) -> None:
        w, b = full.weight.detach(), full.bias
        if self.kind == "column":
            n = self.weight.shape[0]
            w = w[rank * n : (rank + 1) * n]
            b = b[rank * n : (rank + 1) * n] if b is not None else None
        elif self.kind == "row":
            n = self.weight.shape[1]
            w = w[:, rank * n : (rank + 1) * n]
        with torch.no_grad():
            self.weight.copy_(w)
            if b is not None:
                self.bias.copy_(b)


class Block(torch.nn.Module):
    def __init__(self, size=1, group=None):
        super().__init__()
        self.heads = HEADS // size
        self.ln1 = torch.nn.LayerNorm(HIDDEN)
        self.q = Linear(HIDDEN, HIDDEN, "column", size, group)
        # No key bias: its gradient is zero in exact arithmetic (softmax ignores a constant
        # shift), so Adam would turn rounding noise into updates that differ run to run.
        self.k = Linear(HIDDEN, HIDDEN, "column", size, group, bias=False)
        self.v = Linear(HIDDEN, HIDDEN, "column", size, group)
        self.proj = Linear(HIDDEN, HIDDEN, "row", size, group)
        self.ln2 = torch.nn.LayerNorm(HIDDEN)
        self.fc1 = Linear(HIDDEN, 4 * HIDDEN, "column", size, group)
        self.fc2 = Linear(4 * HIDDEN, HIDDEN, "row", size, group)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln1(x)

        def split(z):
            return z.view(b, t, self.heads, -1).transpose(1, 2)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TPTransformer(torch.nn.Module):
    def __init__(self, size=1, group=None, layers=2, checkpoint=None):
        super().__init__()
        self.inp = Linear(FEATURES, HIDDEN)
        self.blocks = torch.nn.ModuleList(Block(size, group) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(HIDDEN)
        self.out = Linear(HIDDEN, OUT)
        self.checkpoint = checkpoint

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = self.checkpoint(block, h) if self.checkpoint is not None else block(h)
        return self.out(self.ln(h))


def full_model(layers=2) -> TPTransformer:
    torch.manual_seed(2024)
    return TPTransformer(layers=layers)


def shard(full: TPTransformer, rank: int, size: int, group, checkpoint=None) -> TPTransformer:
    part = TPTransformer(size, group, len(full.blocks), checkpoint)
    for mine, theirs in zip(part.modules(), full.modules(), strict=True):
        if isinstance(mine, Linear):
            mine.take_from(theirs, rank)
        elif isinstance(mine, torch.nn.LayerNorm):
            mine.load_state_dict(theirs.state_dict())
    return part


def unshard(part: TPTransformer, size: int, group) -> dict[str, torch.Tensor]:
    """The full model's parameters, gathered from every model-parallel rank's part."""
    out = {}
    for name, module in part.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            key = f"{name}.{pname}" if name else pname
            t = p.detach().contiguous()
            kind = getattr(module, "kind", "replicated")
            if size > 1 and kind != "replicated" and not (kind == "row" and pname == "bias"):
                parts = [torch.empty_like(t) for _ in range(size)]
                dist.all_gather(parts, t, group=group)
                dim = 1 if kind == "row" else 0
                t = torch.cat(parts, dim=dim)
            out[key] = t.clone()
    return out


# --------------------------------------------------------------------------- rank side
def batches():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(STEPS, GAS * DP * MICRO, SEQ, FEATURES, generator=g)
    w = torch.randn(FEATURES, OUT, generator=g)
    return x, torch.tanh(x @ w)


def micro(t: torch.Tensor, m: int, dp_rank: int) -> torch.Tensor:
    lo = (m * DP + dp_rank) * MICRO
    return t[lo : lo + MICRO]


def config(stage: int, activation_checkpointing: dict) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": CLIP,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 500},
        "activation_checkpointing": activation_checkpointing,
    }


def _steps(engine, dp_rank: int, first: int, last: int):
    x, y = batches()
    losses, norms = [], []
    for s in range(first, last):
        for m in range(GAS):
            loss = F.mse_loss(engine(micro(x[s], m, dp_rank)), micro(y[s], m, dp_rank))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        norms.append(engine.get_global_grad_norm())
    return losses, norms


def _train(runtime, mpu, stage: int, out_dir: str) -> dict:
    import runtime.activation_checkpointing as ck

    mp_rank, dp_rank = mpu.get_model_parallel_rank(), mpu.get_data_parallel_rank()
    group = mpu.get_model_parallel_group()
    cfg = config(stage, CASES[stage])
    model = shard(full_model(), mp_rank, MP, group, checkpoint=ck.checkpoint)
    engine, *_ = runtime.initialize(model=model, config=cfg, mpu=mpu)
    assert ck.options().partition_activations
    losses, norms = _steps(engine, dp_rank, 0, SAVE_AT)
    engine.save_checkpoint(out_dir, tag="mid")
    more, more_norms = _steps(engine, dp_rank, SAVE_AT, STEPS)
    params = unshard(model, MP, group)

    fresh = shard(full_model(), mp_rank, MP, group, checkpoint=ck.checkpoint)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)  # the load must overwrite every parameter
    engine2, *_ = runtime.initialize(model=fresh, config=cfg, mpu=mpu)
    engine2.load_checkpoint(out_dir, tag="mid")
    resumed, _ = _steps(engine2, dp_rank, SAVE_AT, STEPS)
    return {
        "losses": losses + more,
        "norms": norms + more_norms,
        "params": params,
        "resumed_losses": resumed,
        "resumed_params": unshard(fresh, MP, group),
        "layout_world": engine.sharding.layout.world_size,
        "global_steps": engine2.global_steps,
    }


def _held_bytes(model, x) -> int:
    """Bytes of the distinct storages autograd holds between this forward and its backward
    (saved-tensor hooks see what the checkpoints keep: they save it for backward)."""
    storages: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).square().sum()
    loss.backward()
    return sum(storages.values())


def _partition_effect(mpu) -> dict:
    import runtime.activation_checkpointing as ck

    group = mpu.get_model_parallel_group()
    model = shard(full_model(layers=3), mpu.get_model_parallel_rank(), MP, group, ck.checkpoint)
    x = torch.randn(4, SEQ, FEATURES, generator=torch.Generator().manual_seed(3))
    out = {}
    for partition in (False, True):
        ck.configure(mpu, partition_activations=partition)
        out[partition] = _held_bytes(model, x)
    out["block_input_bytes"] = 4 * SEQ * HIDDEN * 4
    out["blocks"] = 3
    # Gradients through partitioned checkpoints (both variants) equal those without.
    want = _grads(model, x, None)
    out["same_grads"] = {
        name: _grads(model, x, fn) == want
        for name, fn in (
            ("reentrant", ck.checkpoint),
            ("non_reentrant", ck.non_reentrant_checkpoint),
        )
    }
    return out


def _grads(model, x, checkpoint) -> list:
    model.checkpoint = checkpoint
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    return [p.grad.tolist() for p in model.parameters()]


def _stage3_refused(runtime, mpu) -> str:
    from runtime.config import ConfigError

    model = shard(full_model(), mpu.get_model_parallel_rank(), MP, mpu.get_model_parallel_group())
    try:
        runtime.initialize(model=model, config=config(3, {}), mpu=mpu)
    except ConfigError as err:
        return str(err)
    return "not refused"


def worker(out_dir: str) -> dict:
    import runtime
    from runtime.parallel_groups import ModelParallelGroups

    runtime.init_distributed()
    mpu = ModelParallelGroups(MP)
    out = {
        "rank": dist.get_rank(),
        "mp_rank": mpu.get_model_parallel_rank(),
        "dp_rank": mpu.get_data_parallel_rank(),
        "stages": {},
    }
    for stage in CASES:
        out["stages"][stage] = _train(runtime, mpu, stage, f"{out_dir}/stage{stage}")
    out["partition"] = _partition_effect(mpu)
    out["stage3"] = _stage3_refused(runtime, mpu)
    return out


# --------------------------------------------------------------------------- test side
@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("mp")
    return run_ranks(MP * DP, f"{HERE}:worker", {"out_dir": str(out_dir)}, timeout=600), out_dir


@pytest.fixture(scope="module")
def reference():
    model = full_model()
    x, y = batches()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    losses, norms = [], []
    for s in range(STEPS):
        loss = F.mse_loss(model(x[s]), y[s])
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        losses.append(loss.item())
    return losses, norms, {n: p.detach() for n, p in model.named_parameters()}


def test_layout_is_megatrons(ranks):
    results, _ = ranks
    assert [(r["mp_rank"], r["dp_rank"]) for r in results] == [(0, 0), (1, 0), (0, 1), (1, 1)]


@pytest.mark.parametrize("stage", list(CASES))
def test_matches_full_model_reference(ranks, reference, stage):
    results, _ = ranks
    ref_losses, ref_norms, ref_params = reference
    for r in results:
        res = r["stages"][stage]
        assert res["layout_world"] == (DP if stage else 1)  # ZeRO shards over DP ranks only
        assert set(res["params"]) == set(ref_params)
        for name, want in ref_params.items():
            torch.testing.assert_close(res["params"][name], want, atol=1e-5, rtol=0, msg=name)
        # The clipping norm covers the whole model once: TP shards and replicas counted once.
        assert res["norms"] == pytest.approx(ref_norms, rel=1e-5)
        assert max(ref_norms) > CLIP  # clipping was active
    # Each step's loss: the mean over data-parallel ranks and micro-steps (MP ranks agree).
    for s in range(STEPS):
        per_rank = [
            sum(r["stages"][stage]["losses"][s * GAS : (s + 1) * GAS]) / GAS for r in results
        ]
        assert sum(per_rank) / len(per_rank) == pytest.approx(ref_losses[s], rel=1e-5)


@pytest.mark.parametrize("stage", list(CASES))
def test_checkpoint_keeps_each_model_parallel_part_and_reloads(ranks, stage):
    results, out_dir = ranks
    for r in results:
        res = r["stages"][stage]
        assert res["global_steps"] == STEPS
        assert res["resumed_losses"] == res["losses"][SAVE_AT * GAS :]
        for name, want in res["params"].items():
            assert torch.equal(res["resumed_params"][name], want), name
    parts = sorted(p.name for p in (out_dir / f"stage{stage}").iterdir())
    assert parts == ["mp_rank_00", "mp_rank_01"]
    for part in parts:
        assert (out_dir / f"stage{stage}" / part / "mid").is_dir()


def test_partitioned_checkpoints_hold_half_of_each_block_input(ranks):
    results, _ = ranks
    for r in results:
        p = r["partition"]
        saved = p[False] - p[True]
        assert saved == p["blocks"] * p["block_input_bytes"] // MP, p
        assert p["same_grads"] == {"reentrant": True, "non_reentrant": True}


def test_stage3_with_mpu_is_refused(ranks):
    results, _ = ranks
    for r in results:
        assert "zero_optimization.stage = 3 with runtime.initialize(mpu=...)" in r["stage3"]
        assert "use stage 0, 1 or 2" in r["stage3"]
