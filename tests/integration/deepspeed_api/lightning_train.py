"""A Lightning script with the DeepSpeed strategy, as a user writes it, for the bundled runtime
and real DeepSpeed alike: a tiny MLP on synthetic data, ``strategy=...`` from the command line,
``ModelCheckpoint`` every step, optional ``fit(ckpt_path=...)`` resume. Writes the per-step
losses rank 0 saw to ``--out``.

The one line that is not what a GPU user writes is the CPU workaround: Lightning's DeepSpeed
strategy refuses any accelerator but CUDA (with real DeepSpeed too), so this script skips those
two checks to train on CPU ranks.
"""

from __future__ import annotations

import argparse
import json
import os

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy

# The CPU workaround: Lightning's checks that the accelerator is CUDA and that the device
# indices match the local ranks (CPU devices have no index), skipped.
DeepSpeedStrategy.setup_environment = DDPStrategy.setup_environment
pl.strategies.deepspeed._validate_device_index_selection = lambda devices: None


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.detach().item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.05)


def data(world: int, rank: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    y = torch.randint(0, 4, (64,), generator=g)
    # Each rank its own slice (no sampler: Lightning would add one anyway; kept explicit).
    ds = torch.utils.data.TensorDataset(x[rank::world], y[rank::world])
    return torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--resume", default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.strategy == "config":
        strategy = DeepSpeedStrategy(
            config={
                "train_micro_batch_size_per_gpu": 4,
                "zero_optimization": {"stage": 2},
                "gradient_clipping": 0.0,
            }
        )
    else:
        strategy = args.strategy
    model = Tiny()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_steps=args.steps,
        precision="32-true",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=1, save_top_k=-1)],
    )
    trainer.fit(model, train_dataloaders=data(world, rank), ckpt_path=args.resume)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": model.losses, "global_step": trainer.global_step}, f)


if __name__ == "__main__":
    main()
