"""An image classifier trained the way DeepSpeedExamples' CIFAR-10 script (training/cifar in
that repository) does it, written for the DeepSpeed API alone (no zlaunch import): DeepSpeed's command-line
arguments, ``deepspeed.init_distributed()``, the accelerator's device calls, the optional MoE
import at the top, the engine's own data loader and its precision queries. Synthetic images
stand in for CIFAR-10 (no download), so the same numbers come out anywhere.

    zlaunch --num-gpus 2 examples/cifar_style_deepspeed.py --stage 2 --steps 8

runs it on the bundled runtime (``--runtime bundled``) or on an installed DeepSpeed (the
default where one is installed; on CPU with ``DS_ACCELERATOR=cpu``). ``--out FILE`` writes the
per-step losses (the mean over ranks) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: F401


def add_argument() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="CIFAR-style training with DeepSpeed")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by DeepSpeed's launcher")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps to train")
    parser.add_argument("--stage", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--out", default=None, help="write the per-step losses here (JSON)")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def synthetic_cifar(n: int = 512) -> torch.utils.data.Dataset:
    """CIFAR-10's shapes (3x32x32 images, 10 classes) with a learnable signal in them."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 3, 32, 32, generator=g) * 0.5
    # A class-dependent patch: one channel's corner, as bright as the label.
    images[torch.arange(n), labels % 3, :4, :4] += labels.view(-1, 1, 1).float() / 5
    return torch.utils.data.TensorDataset(images, labels)


class Net(torch.nn.Module):
    """The tutorial's LeNet-style network."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 6, 5)
        self.pool = torch.nn.MaxPool2d(2, 2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def ds_config(args: argparse.Namespace) -> dict:
    """The example's config, with its ZeRO stage and precision from the command line."""
    return {
        "train_batch_size": 16,
        "steps_per_print": 2000,
        "optimizer": {
            "type": "Adam",
            "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000},
        },
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "bf16": {"enabled": args.dtype == "bf16"},
        "fp16": {"enabled": args.dtype == "fp16", "fp16_master_weights_and_grads": False},
        "wall_clock_breakdown": False,
        "zero_optimization": {
            "stage": args.stage,
            "allgather_partitions": True,
            "reduce_scatter": True,
            "allgather_bucket_size": 50000000,
            "reduce_bucket_size": 50000000,
            "overlap_comm": True,
            "contiguous_gradients": True,
        },
    }


def main() -> None:
    args = add_argument()
    deepspeed.init_distributed()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    get_accelerator().set_device(local_rank)

    torch.manual_seed(0)
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, optimizer, trainloader, _ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=parameters,
        training_data=synthetic_cifar(),
        config=ds_config(args),
    )
    local_device = get_accelerator().device_name(model_engine.local_rank)
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half

    criterion = torch.nn.CrossEntropyLoss()
    losses = []
    batches = iter(trainloader)
    while len(losses) < args.steps:
        inputs, labels = next(batches)
        inputs, labels = inputs.to(local_device), labels.to(local_device)
        if target_dtype is not None:
            inputs = inputs.to(target_dtype)
        outputs = model_engine(inputs)
        loss = criterion(outputs.float(), labels)
        model_engine.backward(loss)
        model_engine.step()
        losses.append(loss.detach().float())

    mean = torch.stack(losses).to(local_device)
    torch.distributed.all_reduce(mean)
    mean /= torch.distributed.get_world_size()
    if torch.distributed.get_rank() == 0:
        print(f"losses: {[round(v, 4) for v in mean.tolist()]}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"losses": mean.tolist(), "global_steps": model_engine.global_steps}, f)


if __name__ == "__main__":
    main()
