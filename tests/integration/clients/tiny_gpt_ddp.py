"""A nanoGPT-shaped training script as users write it: plain torch DDP over gloo, no zlaunch.

Environment from the launcher (RANK, WORLD_SIZE, MASTER_ADDR, ...), ``init_process_group``,
a small causal transformer wrapped in ``DistributedDataParallel``, AdamW, a few steps on
synthetic tokens, ``destroy_process_group()`` at the end, as nanoGPT's ``train.py`` does.
Rank 0 prints one line per step: ``step N loss <float.hex()>``, so two launchers' losses can be
compared bit for bit. Runs alone (no RANK in the environment) as a world of one.

    python tiny_gpt_ddp.py [--steps N] [--keep-group] [--width W]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--keep-group", action="store_true", help="skip destroy_process_group")
    args = parser.parse_args()

    ddp = "RANK" in os.environ
    if ddp:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if ddp else 0
    world = dist.get_world_size() if ddp else 1
    torch.manual_seed(1337)
    vocab = 65
    model = TinyGPT(vocab, args.block, args.width, args.layers, heads=4)
    if ddp:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1000 + rank)
    started = time.perf_counter()
    for step in range(args.steps):
        x = torch.randint(vocab, (args.batch, args.block), generator=data)
        y = torch.roll(x, -1, dims=1)
        loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {loss.item().hex()}", flush=True)
    if rank == 0:
        per_step = (time.perf_counter() - started) / args.steps
        print(f"world {world} threads {torch.get_num_threads()} step_ms {per_step * 1e3:.1f}")
    if ddp and not args.keep_group:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
