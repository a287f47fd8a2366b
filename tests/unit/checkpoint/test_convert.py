"""`zlaunch convert` of the DeepSpeed fixture to every target, read back by the libraries
that own each format: transformers' ``from_pretrained``, torch DCP (``dcp.load`` and
``format_utils.dcp_to_torch_save``), safetensors, and this runtime's own reader. No process
group; the expected tensors are the fp32 masters DeepSpeed's partitions hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime.checkpoint import CheckpointError
from runtime.checkpoint.export import convert
from runtime.checkpoint.formats.deepspeed import DeepSpeedReader
from runtime.checkpoint.reader import CheckpointReader
from tests.fixtures.deepspeed import ds_case

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed" / "checkpoints"
CASE = "zero3_bf16"


@pytest.fixture(scope="module")
def masters():
    with DeepSpeedReader(str(FIXTURE / CASE / "global_step3")) as r:
        return {n: r.read_full(n).clone() for n in r.shapes}


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    ds_case.build_model().config.save_pretrained(d)
    return d


def _logits(model, state=None):
    if state is not None:
        model.load_state_dict(state)
    ids = ds_case.global_batch(10)
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_to_hf_loads_with_from_pretrained_alone(tmp_path, masters, config_dir):
    from transformers import AutoModelForCausalLM

    dst = tmp_path / "hf"
    result = convert(
        str(FIXTURE / CASE), str(dst), "hf", hf_config=str(config_dir), max_shard_bytes=16_000
    )
    assert result.source_format == "deepspeed"
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and set(index["weight_map"]) == set(masters)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in masters.values())
    model = AutoModelForCausalLM.from_pretrained(str(dst))
    assert model.dtype == torch.float32
    for name, t in masters.items():
        assert torch.equal(model.state_dict()[name], t), name
    assert torch.equal(_logits(model), _logits(ds_case.build_model(seed=5), masters))


def test_to_hf_without_a_config_says_what_to_pass(tmp_path):
    with pytest.raises(CheckpointError, match="pass --hf-config"):
        convert(str(FIXTURE / CASE), str(tmp_path / "hf"), "hf")


def test_to_dcp_is_read_by_torch_distributed_checkpoint(tmp_path, masters):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    convert(str(FIXTURE / CASE), str(tmp_path / "dcp"), "dcp")
    state = {n: torch.zeros_like(t) for n, t in masters.items()}
    dcp.load(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert all(torch.equal(state[n], t) for n, t in masters.items())
    dcp_to_torch_save(str(tmp_path / "dcp"), str(tmp_path / "full.pt"))
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    assert set(full) == set(masters) and all(torch.equal(full[n], t) for n, t in masters.items())


def test_to_safetensors_in_bf16(tmp_path, masters):
    from safetensors.torch import load_file

    convert(str(FIXTURE / CASE), str(tmp_path / "m.safetensors"), "safetensors", dtype="bf16")
    state = load_file(tmp_path / "m.safetensors")
    assert all(torch.equal(state[n], t.to(torch.bfloat16)) for n, t in masters.items())


def test_to_zlaunch_keeps_the_optimizer_scheduler_and_counters(tmp_path):
    out = convert(str(FIXTURE / "zero2_fp32"), str(tmp_path / "native"), "zlaunch")
    with (
        DeepSpeedReader(str(FIXTURE / "zero2_fp32" / "global_step3")) as ds,
        CheckpointReader(out.files[0]) as native,
    ):
        assert native.kinds == ds.kinds and native.world_size == 1
        for name in ds.shapes:
            for kind in ds.kinds:
                assert torch.equal(native.read(name, kind), ds.read(name, kind)), (name, kind)
        assert native.state("counters") == ds.state("counters")
        assert native.state("lr_scheduler") == ds.state("lr_scheduler")
        assert native.state("client_state") == ds.state("client_state")
        step = native.state("optimizer")["scalar_state"][0]["values"]["step"]
        assert torch.equal(step, torch.tensor(3.0))
