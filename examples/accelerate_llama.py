"""A plain accelerate training loop with a DeepSpeed plugin: a tiny Llama built from a config,
synthetic tokens, the script's own AdamW and linear warmup schedule. accelerate drives
DeepSpeed (``accelerator.prepare`` -> ``deepspeed.initialize``); nothing here knows about zlaunch.

    zlaunch --num-gpus 2 examples/accelerate_llama.py --ds-config examples/configs/accelerate_zero2.json

The config names no optimizer: the script's own is used (accelerate refuses both). Without
GPUs, accelerate forms its process group only for ``cpu=True``, and ``Accelerator(cpu=True)``
bypasses DeepSpeed; so the script first forms the group with ``PartialState(cpu=True,
backend="gloo")`` (as the Trainer does for ``--use_cpu``) and then creates the Accelerator with
the plugin, which trains through DeepSpeed on that group. Rank 0 writes the loss of every optimizer step (averaged over
the ranks) to ``--log-file`` and the trained model (``save_pretrained``) to ``--save-dir``.
"""

from __future__ import annotations

import argparse
import json

import torch
from accelerate import Accelerator, DeepSpeedPlugin, PartialState
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ds-config", required=True, help="DeepSpeed config (JSON)")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=2, help="samples per rank per micro step")
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--log-file", default=None)
    parser.add_argument("--save-dir", default=None)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        PartialState(cpu=True, backend="gloo")
    plugin = DeepSpeedPlugin(
        hf_ds_config=args.ds_config, gradient_accumulation_steps=args.grad_accum
    )
    accelerator = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=args.grad_accum)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    tokens = torch.randint(0, 128, (256, 16), generator=torch.Generator().manual_seed(1234))
    data = [{"input_ids": t, "labels": t.clone()} for t in tokens]
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, args.steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    losses, window = [], []
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        window.append(accelerator.gather(loss.detach()).mean().item())
        if accelerator.sync_gradients:
            losses.append(sum(window) / len(window))
            window = []
            if len(losses) == args.steps:
                break

    if args.save_dir:
        state = accelerator.get_state_dict(model)
        accelerator.unwrap_model(model).save_pretrained(
            args.save_dir, state_dict=state, is_main_process=accelerator.is_main_process
        )
    if args.log_file and accelerator.is_main_process:
        with open(args.log_file, "w") as f:
            json.dump({"losses": losses}, f)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
