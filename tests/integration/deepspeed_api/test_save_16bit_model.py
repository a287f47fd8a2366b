"""``engine.save_16bit_model(dir, name)`` on the bundled ``deepspeed`` writes the format its file
name says: ``torch.save`` of the state dict for ``pytorch_model.bin`` (DeepSpeed's default name
and format, which ``torch.load`` reads) and safetensors for ``*.safetensors``; both load with
``from_pretrained`` into the model the engine trained. One process, world size 1, stages 0 and 3.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch
import torch.distributed as dist

transformers = pytest.importorskip("transformers")

ds = importlib.import_module("runtime.deepspeed_api.deepspeed")


@pytest.fixture(autouse=True, scope="module")
def single_process_group():
    was = dist.is_initialized()
    yield
    if not was and dist.is_initialized():
        dist.destroy_process_group()


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("stage", [0, 3])
def test_bin_is_torch_save_and_safetensors_is_safetensors(tmp_path, stage):
    from safetensors.torch import load_file

    model = tiny_llama()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True},
    }
    engine, *_ = ds.initialize(model=model, config=config)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    assert engine.save_16bit_model(str(tmp_path)) is True  # DeepSpeed's default name
    assert engine.save_16bit_model(str(tmp_path), "model.safetensors") is True
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors", "pytorch_model.bin"]

    with open(tmp_path / "pytorch_model.bin", "rb") as f:
        assert f.read(2) == b"PK"  # torch.save's zip archive, not a safetensors header
    pickled = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    flat = load_file(tmp_path / "model.safetensors")
    assert set(flat) <= set(pickled) and all(torch.equal(flat[k], pickled[k]) for k in flat)
    assert all(t.dtype == torch.bfloat16 for t in pickled.values())
    with ds.zero.GatheredParameters(list(engine.module.parameters())):
        trained = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    assert set(pickled) == set(trained)
    assert all(torch.equal(pickled[k], trained[k]) for k in trained)

    # Each file alone, next to the model's config, loads with from_pretrained.
    with torch.no_grad():
        for name in ("pytorch_model.bin", "model.safetensors"):
            folder = tmp_path / name.split(".")[0]
            folder.mkdir()
            os.link(tmp_path / name, folder / name)
            tiny_llama().config.save_pretrained(folder)
            loaded = transformers.LlamaForCausalLM.from_pretrained(
                folder, torch_dtype=torch.bfloat16
            )
            for key, value in loaded.state_dict().items():
                assert torch.equal(value, trained[key]), (name, key)


def test_a_failed_save_leaves_no_file(tmp_path, monkeypatch):
    from runtime.checkpoint import CheckpointError
    from runtime.checkpoint.consolidate import write_torch_state_dict

    def broken_save(obj, f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(CheckpointError, match="No space left on device"):
        write_torch_state_dict({"w": torch.zeros(2)}, str(tmp_path / "pytorch_model.bin"))
    assert os.listdir(tmp_path) == []
