"""One rank training a tied-embedding Llama (built from a config) with this runtime, then
saving a checkpoint and the 16-bit model (run by mp_utils.run_ranks)."""

from __future__ import annotations

import os

import torch

import runtime
from tests.fixtures.deepspeed import ds_case


def tied_llama():
    from transformers import LlamaForCausalLM

    config = ds_case.build_model().config
    config.tie_word_embeddings = True
    torch.manual_seed(7)
    return LlamaForCausalLM(config)


def train_and_save(stage: int, save_dir: str) -> dict:
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    model = tied_llama()
    config = ds_case.ds_config(f"zero{stage}_fp32", world)
    config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    engine, _, _, _ = runtime.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    for s in range(2):
        ids = ds_case.rank_batch(s, rank, world)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    engine.save_checkpoint(save_dir)
    saved_16bit = engine.save_16bit_model(os.path.join(save_dir, "sixteen"))
    with torch.no_grad():
        logits = engine(input_ids=ds_case.global_batch(10)).logits
    return {"logits": logits, "saved_16bit": saved_16bit}
