"""TRL's SFTTrainer with a peft LoRA adapter on a tiny Llama built from a config. Plain TRL:
the Trainer drives DeepSpeed through ``--deepspeed ds.json``; nothing here knows about zlaunch.

    zlaunch --num-gpus 2 examples/sft_lora.py --deepspeed examples/configs/hf_zero3.json \
        --output_dir out --max_steps 6

The data set is already tokenized (synthetic token ids, equal lengths), and the tokenizer is
built in code (a word-level vocabulary of ``t0`` .. ``t127``), so nothing is downloaded. Add
``--use_cpu --ddp_backend gloo`` without GPUs. ``--log_file F``: rank 0 writes the log history;
``--save_model_dir D``: ``trainer.save_model(D)`` (the adapter).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

VOCAB = 128


@dataclass
class ScriptArguments:
    log_file: str | None = field(default=None, metadata={"help": "write the log history here"})
    save_model_dir: str | None = field(default=None, metadata={"help": "trainer.save_model here"})


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"t{i}": i for i in range(VOCAB - 2)} | {"<pad>": VOCAB - 2, "<eos>": VOCAB - 1}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")),
        pad_token="<pad>",
        eos_token="<eos>",
    )


def main() -> None:
    script, training = HfArgumentParser((ScriptArguments, SFTConfig)).parse_args_into_dataclasses()
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(training.seed)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, VOCAB - 2, (128, 16), generator=torch.Generator().manual_seed(1234))
    data = Dataset.from_dict({"input_ids": ids.tolist()})
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = SFTTrainer(
        model=model,
        args=training,
        train_dataset=data,
        processing_class=tokenizer(),
        peft_config=lora,
    )
    trainer.train()
    if script.save_model_dir:
        trainer.save_model(script.save_model_dir)
    if script.log_file and trainer.is_world_process_zero():
        with open(script.log_file, "w") as f:
            json.dump(trainer.state.log_history, f, indent=1)


if __name__ == "__main__":
    main()
