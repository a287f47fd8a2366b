"""Rank side of the gradient-communication tests: third-party models trained on 2 gloo ranks
with and without `communication_data_type` / `gradient_predivide_factor`.

The models are torch's `TransformerEncoder` stack and Hugging Face Llama and GPT-2 built
from tiny configs; every run starts from the same weights and sees the same batches, so the
only difference between two runs of one model is the config under test.
"""

from __future__ import annotations

import torch

__all__ = ["MODELS", "STEPS", "train_case"]

STEPS = 10
MICRO = 4
SEQ = 16
VOCAB = 96
# Bytes of what every step sends besides the gradients: the gradient statistics and the
# step metrics' numbers, 5 float64 values in one all-reduce.
RIDER_VALUES = 5


class EncoderRegressor(torch.nn.Module):
    """torch's TransformerEncoder stack with a linear head (no dropout: runs are comparable)."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(
            d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x, y):
        out = self.head(self.encoder(x))
        return torch.nn.functional.mse_loss(out.float(), y.float())


class CausalLM(torch.nn.Module):
    """A Hugging Face causal LM called as the engine's module: tokens in, loss out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss.float()


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return CausalLM(LlamaForCausalLM(config))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return CausalLM(GPT2LMHeadModel(config))


MODELS = {"encoder": EncoderRegressor, "llama": _llama, "gpt2": _gpt2}


def _batch(model: str, step: int, rank: int):
    # Two batches in turn: the tiny models visibly learn them within STEPS steps.
    g = torch.Generator().manual_seed(100 * (step % 2) + rank)
    if model == "encoder":
        x = torch.randn(MICRO, SEQ, 32, generator=g)
        return (x, torch.tanh(x[..., :4] * 2))
    return (torch.randint(0, VOCAB, (MICRO, SEQ), generator=g),)


def config(stage: int, precision: str = "fp32", **top) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
        # Several buckets per step, so the per-bucket casts and collectives are exercised.
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 4096},
        **top,
    }
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return cfg


def train_case(runtime, rank: int, model: str, cfg: dict) -> dict:
    """Train STEPS steps; each step's loss (mean over ranks) and the bytes of steps 2.. by
    collective kind."""
    torch.manual_seed(1234)
    module = MODELS[model]()
    engine, *_ = runtime.initialize(model=module, config=cfg)
    losses, bytes_per_step = [], None
    for step in range(STEPS):
        if step == 1:
            engine.comm.stats.reset()
        loss = engine(*_batch(model, step, rank))
        engine.backward(loss)
        engine.step()
        both = loss.detach().double().reshape(1)
        torch.distributed.all_reduce(both)  # outside the engine's counters
        losses.append(both.item() / engine.world_size)
    bytes_per_step = {k: v / (STEPS - 1) for k, v in engine.comm.stats.snapshot().items()}
    return {"losses": losses, "bytes": bytes_per_step}


def step_syncs(runtime, rank: int, stage: int, steps: int = 4) -> dict:
    """Per optimizer step after the first: the small all-reduces (statistics, metrics) and
    the host reads (`.item()`, `.tolist()`, `float()`/`bool()`/`int()` of a tensor) made by
    the runtime's own code, counted by wrapping them."""
    import pathlib

    from runtime.distributed.comm import Communicator

    runtime_dir = str(pathlib.Path(runtime.__file__).parent)
    counts = {"small_all_reduce": 0, "host_reads": 0, "where": []}
    counting = [False]
    step_now = [0]

    def from_runtime() -> str | None:
        import sys

        frame = sys._getframe(2)
        name = frame.f_code.co_filename
        return f"{name}:{frame.f_lineno}" if name.startswith(runtime_dir) else None

    def wrap_read(name: str):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            where = from_runtime() if counting[0] else None
            if where is not None:
                counts["host_reads"] += 1
                counts["where"].append(f"{name} {where} step {step_now[0]}")
            return original(self, *args, **kwargs)

        setattr(torch.Tensor, name, read)
        return name, original

    originals = [wrap_read(n) for n in ("item", "tolist", "__float__", "__bool__", "__int__")]
    all_reduce = Communicator.all_reduce

    def counted_all_reduce(self, tensor, async_op=False):
        if counting[0] and tensor.numel() <= 16:  # statistics, metrics, stage 3's check
            counts["small_all_reduce"] += 1
        return all_reduce(self, tensor, async_op=async_op)

    Communicator.all_reduce = counted_all_reduce
    try:
        torch.manual_seed(1234)
        engine, *_ = runtime.initialize(
            model=EncoderRegressor(), config={**config(stage), "steps_per_print": 2}
        )
        for step in range(steps):
            counting[0], step_now[0] = step > 0, step
            loss = engine(*_batch("encoder", step, rank))
            engine.backward(loss)
            engine.step()
        counting[0] = False
    finally:
        Communicator.all_reduce = all_reduce
        for name, original in originals:
            setattr(torch.Tensor, name, original)
    return {**counts, "steps": steps - 1}
