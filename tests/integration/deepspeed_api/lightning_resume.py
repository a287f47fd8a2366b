"""A Lightning script that checkpoints with ``ModelCheckpoint`` and resumes with
``trainer.fit(model, ckpt_path=...)``, on the DeepSpeed strategy, at whatever world size it is
launched with.

Usage: lightning_resume.py STAGE OUT_JSON MAX_STEPS [--save DIR] [--resume CKPT]

The global batch is 16 samples at any world size (each rank takes 16 / world size of it, in
order: no shuffle), so runs at different world sizes see the same batches and, with ZeRO's
gradient mean over ranks, take the same steps to float rounding. An epoch is 4 steps
(``--epoch-batches``);
``--save`` writes a checkpoint at every epoch end (a DeepSpeed checkpoint directory per
epoch), so a resumed run starts at an epoch boundary. Rank 0 writes the losses of the steps
this run took (the mean over ranks) and the trainer's final global step to OUT_JSON.

The CPU bypass is lightning_fit.py's (Lightning refuses the DeepSpeed strategy off CUDA).
"""

from __future__ import annotations

import argparse
import json
import os

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy
from torch.utils.data import DataLoader, TensorDataset

# Lightning allows the DeepSpeed strategy on CUDA only: this line skips that check.
DeepSpeedStrategy.setup_environment = DDPStrategy.setup_environment

GLOBAL_BATCH = 16


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


def data(ranks: int, epoch_batches: int) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(epoch_batches * GLOBAL_BATCH, 16, generator=g)
    y = torch.sin(x[:, :4] * 2) + 0.1 * torch.randn(epoch_batches * GLOBAL_BATCH, 4, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // ranks, shuffle=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("stage", type=int)
    parser.add_argument("out")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--save")
    parser.add_argument("--resume")
    parser.add_argument("--epoch-batches", type=int, default=4)
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    model = Regression()
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    callbacks = []
    if args.save:
        callbacks.append(
            ModelCheckpoint(dirpath=args.save, save_top_k=-1, every_n_epochs=1,
                            save_on_train_epoch_end=True)
        )  # fmt: skip
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=ranks,
        strategy=DeepSpeedStrategy(
            stage=args.stage, parallel_devices=[torch.device("cpu", i) for i in range(ranks)]
        ),
        max_steps=args.max_steps,
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=bool(args.save),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data(ranks, args.epoch_batches), ckpt_path=args.resume)
    losses = torch.tensor(model.losses)
    torch.distributed.all_reduce(losses)
    losses /= torch.distributed.get_world_size()
    if trainer.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses.tolist(), "global_step": trainer.global_step}, f)


if __name__ == "__main__":
    main()
