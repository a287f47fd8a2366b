"""This runtime's checkpoints of a Hugging Face model (tied embeddings, ZeRO-3 at 2 ranks) as
a folder ``from_pretrained`` loads alone, and ``save_16bit_model``'s file: whole tensors that
give the trained model's logits."""

from __future__ import annotations

import pytest
import torch

from tests.integration.engine.mp_utils import run_ranks

pytestmark = pytest.mark.multirank

WORKER = "tests/integration/checkpoint/hf_export_worker.py"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("stage3")
    out = run_ranks(2, f"{WORKER}:train_and_save", {"stage": 3, "save_dir": str(save_dir)})
    return save_dir, out[0]


def test_stage3_checkpoint_to_hf_gives_the_trained_logits(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    from runtime.checkpoint.export import convert
    from tests.fixtures.deepspeed import ds_case

    save_dir, out = trained
    convert(str(save_dir), str(tmp_path / "hf"), "hf")  # the config comes from the checkpoint
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert all(t.numel() > 0 for t in model.state_dict().values())
    with torch.no_grad():
        logits = model(input_ids=ds_case.global_batch(10)).logits
    torch.testing.assert_close(logits, out["logits"], rtol=1e-5, atol=1e-5)


def test_stage3_save_16bit_model_is_whole(trained):
    from safetensors.torch import load_file

    from tests.fixtures.deepspeed import ds_case
    from tests.integration.checkpoint.hf_export_worker import tied_llama

    save_dir, out = trained
    assert out["saved_16bit"] is True
    state = load_file(save_dir / "sixteen" / "model.safetensors")
    fresh = tied_llama()
    expected = fresh.state_dict()
    for name, t in state.items():
        assert t.shape == expected[name].shape and t.numel() > 0, name
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: written once
    with torch.no_grad():
        logits = fresh(input_ids=ds_case.global_batch(10)).logits
    torch.testing.assert_close(logits, out["logits"], rtol=1e-5, atol=1e-5)
