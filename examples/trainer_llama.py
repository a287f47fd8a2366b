"""A plain Hugging Face Trainer script: a tiny Llama built from a config, trained on synthetic
token sequences. Nothing in it knows about zlaunch: DeepSpeed is driven by the Trainer through
``--deepspeed ds.json``, as in any Trainer script.

    zlaunch --num-gpus 2 examples/trainer_llama.py --deepspeed examples/configs/hf_zero2.json \
        --output_dir out --max_steps 8 --per_device_train_batch_size 2

On a machine without GPUs add ``--use_cpu --ddp_backend gloo``. With ``--log_file F`` rank 0
writes the Trainer's log history (one loss per step with ``--logging_steps 1``) to F as JSON;
``--save_model_dir D`` saves the trained model there with ``trainer.save_model``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoModelForCausalLM,
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)


@dataclass
class ScriptArguments:
    vocab_size: int = field(default=128, metadata={"help": "tokens in the vocabulary"})
    hidden_size: int = field(default=32, metadata={"help": "model width"})
    num_layers: int = field(default=2, metadata={"help": "decoder layers"})
    seq_len: int = field(default=16, metadata={"help": "tokens per sample"})
    num_samples: int = field(default=256, metadata={"help": "samples in the synthetic data set"})
    log_file: str | None = field(default=None, metadata={"help": "write the log history here"})
    save_model_dir: str | None = field(default=None, metadata={"help": "trainer.save_model here"})
    from_config: bool = field(
        default=False,
        metadata={"help": "build with AutoModelForCausalLM.from_config (zero.Init under ZeRO-3)"},
    )


class SyntheticTokens(torch.utils.data.Dataset):
    """Fixed random token sequences (the same on every rank and every run)."""

    def __init__(self, num_samples: int, seq_len: int, vocab_size: int, seed: int = 1234):
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab_size, (num_samples, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def main() -> None:
    script, training = HfArgumentParser(
        (ScriptArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    config = LlamaConfig(
        vocab_size=script.vocab_size,
        hidden_size=script.hidden_size,
        intermediate_size=2 * script.hidden_size,
        num_hidden_layers=script.num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=script.seq_len,
    )
    torch.manual_seed(training.seed)
    # TrainingArguments(deepspeed=...) is created first, so from_config sees ZeRO-3 and builds
    # the model already partitioned (deepspeed.zero.Init), as from_pretrained does.
    model = (
        AutoModelForCausalLM.from_config(config) if script.from_config else LlamaForCausalLM(config)
    )
    data = SyntheticTokens(script.num_samples, script.seq_len, script.vocab_size)
    trainer = Trainer(model=model, args=training, train_dataset=data, eval_dataset=data)
    trainer.train(resume_from_checkpoint=training.resume_from_checkpoint)
    if script.save_model_dir:
        trainer.save_model(script.save_model_dir)
    if script.log_file and trainer.is_world_process_zero():
        with open(script.log_file, "w") as f:
            json.dump(trainer.state.log_history, f, indent=1)


if __name__ == "__main__":
    main()
