"""A PyTorch Lightning script with the DeepSpeed strategy, as a user writes one: a
LightningModule, a DataLoader of synthetic regression data, ``Trainer(strategy=...)``.

Usage: lightning_fit.py STRATEGY OUT_JSON [STEPS]; STRATEGY is ``deepspeed_stage_2`` or
``deepspeed_stage_3``. Rank 0 writes the per-step losses (the mean over ranks, as logged) to
OUT_JSON. Run it under ``zlaunch --num-gpus 2`` with either runtime: the bundled one (``--runtime
bundled``) or DeepSpeed itself (``DS_ACCELERATOR=cpu``).

What a CPU run needs: Lightning refuses the DeepSpeed strategy on any accelerator but CUDA
(``DeepSpeedStrategy.setup_environment``), real DeepSpeed or not, and both Lightning and
DeepSpeed want an indexed device; on CPU the script skips that check and numbers the CPU
devices, as README.md shows. Nothing else here knows which runtime serves ``import deepspeed``.
"""

from __future__ import annotations

import json
import os
import sys

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy
from torch.utils.data import DataLoader, TensorDataset

# Lightning allows the DeepSpeed strategy on CUDA only: this line skips that check.
DeepSpeedStrategy.setup_environment = DDPStrategy.setup_environment


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
            torch.nn.Linear(32, 4),
        )  # fmt: skip
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.01)


def data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g)
    y = torch.sin(x[:, :4] * 2) + 0.1 * torch.randn(256, 4, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)


def main() -> None:
    strategy, out = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    pl.seed_everything(0, verbose=False)
    model = Regression()
    # What ``strategy="deepspeed_stage_N"`` builds, with the CPU devices numbered by local rank
    # (Lightning and DeepSpeed both want a device index, which a plain "cpu" lacks).
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "2"))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=ranks,
        strategy=DeepSpeedStrategy(
            stage=int(strategy.removeprefix("deepspeed_stage_")),
            parallel_devices=[torch.device("cpu", i) for i in range(ranks)],
        ),
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data())
    losses = torch.tensor(model.losses)
    torch.distributed.all_reduce(losses)
    losses /= torch.distributed.get_world_size()
    if trainer.global_rank == 0:
        with open(out, "w") as f:
            json.dump({"losses": losses.tolist(), "global_step": trainer.global_step}, f)


if __name__ == "__main__":
    main()
