"""A small GPT: token + position embeddings, pre-LN transformer blocks, a language-model head.

Used by the examples and by the benchmarks; it depends on torch only (no runtime import), so the
same module runs under torch DDP, DeepSpeed and this runtime. Initialisation draws from torch's
global RNG: the same `torch.manual_seed` gives the same weights everywhere.

Parameter count (tied head, biases everywhere):
    12·L·d² + 13·L·d + seq_len·d + 2·d + vocab·d      (+ vocab·d for an untied head)
e.g. the benchmark model, L=6, d=512, seq_len=128, vocab 8192, tied: 23,175,168 parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "GPTConfig", "bench_model", "count_parameters"]


@dataclass
class GPTConfig:
    """Shape of the model."""

    vocab_size: int
    """Number of token ids."""
    n_layer: int
    """Transformer blocks."""
    n_head: int
    """Attention heads per block; must divide d_model."""
    d_model: int
    """Width of the residual stream (the hidden size)."""
    seq_len: int
    """Longest sequence the position embedding covers."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches (0 keeps runs deterministic)."""
    tie_weights: bool = True
    """Share the token embedding with the output head."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"GPTConfig.d_model ({self.d_model}) must be divisible by n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")


def count_parameters(config: GPTConfig) -> int:
    """The model's parameter count, from its shape alone."""
    L, d = config.n_layer, config.d_model
    head = 0 if config.tie_weights else config.vocab_size * d
    return 12 * L * d * d + 13 * L * d + config.seq_len * d + 2 * d + config.vocab_size * d + head


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, time, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(batch, time, width)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.proj = nn.Linear(4 * config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-LN: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """`forward(idx, targets=None) -> (logits, loss)`; loss is None without targets."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_weights:
            self.head.weight = self.tok_emb.weight
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's scheme: N(0, 0.02), and residual output projections scaled down by
        # sqrt(2 * n_layer) so the residual stream's variance does not grow with depth.
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(".proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, time = idx.shape
        if time > self.config.seq_len:
            raise ValueError(
                f"sequence of length {time} is longer than GPTConfig.seq_len {self.config.seq_len}"
            )
        positions = torch.arange(time, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss


def bench_model() -> GPT:
    """The benchmarks' model: 6 layers, d_model 512, 8 heads, seq_len 128, vocab 8192, tied
    head: 23,175,168 parameters (`zlaunch estimate --model examples.gpt:bench_model`)."""
    return GPT(GPTConfig(vocab_size=8192, n_layer=6, n_head=8, d_model=512, seq_len=128))
