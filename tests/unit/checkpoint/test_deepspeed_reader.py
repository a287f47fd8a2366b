"""The DeepSpeed reader against the committed fixture (written by DeepSpeed 0.19.8 at 2 ranks,
see tests/fixtures/deepspeed/make_deepspeed_checkpoints.py): no DeepSpeed, no process group.

The expected values come from DeepSpeed itself: the fingerprint of the fp32 weights its own
``get_fp32_state_dict_from_zero_checkpoint`` read at generation time, and the bf16 module
weights DeepSpeed stored beside its fp32 partitions.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from runtime.checkpoint import CheckpointError
from runtime.checkpoint.formats import DEEPSPEED, detect_format, locate, open_checkpoint
from runtime.checkpoint.formats.deepspeed import DeepSpeedReader
from runtime.checkpoint.formats.ds_layout import Span, zero3_places, zero12_places
from runtime.checkpoint.formats.ds_pickle import load_ds_file

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed" / "checkpoints"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
CASES = sorted(EXPECTED["cases"])


def tag_dir(case: str) -> Path:
    return FIXTURE / case / f"global_step{EXPECTED['save_step']}"


def test_fixture_names_the_deepspeed_that_wrote_it():
    assert EXPECTED["deepspeed"] == "0.19.8"
    plain = [f"zero{s}_{p}" for s in (1, 2, 3) for p in ("fp32", "bf16")]
    assert CASES == sorted(plain + ["zero3_fp32_tied", "zero2_bf16_tied"])


@pytest.mark.parametrize("case", CASES)
def test_fp32_weights_are_those_deepspeed_reads(case):
    with open_checkpoint(locate(str(FIXTURE / case))) as reader:
        assert isinstance(reader, DeepSpeedReader)
        assert reader.stage == int(case[4]) and reader.world_size == 2
        fingerprint = EXPECTED["cases"][case]["fp32_fingerprint"]
        aliases = reader.state("aliases")  # DeepSpeed's tool writes a tied name as a copy
        assert sorted([*reader.shapes, *aliases]) == sorted(fingerprint)
        for name, (total, squares) in fingerprint.items():
            w = reader.read_full(aliases.get(name, name)).double()
            assert math.isclose(float(w.sum()), total, rel_tol=1e-12, abs_tol=1e-12), name
            assert math.isclose(float(w.square().sum()), squares, rel_tol=1e-12), name


@pytest.mark.parametrize("case", ["zero1_bf16", "zero2_bf16"])
def test_master_weights_round_to_the_module_weights_deepspeed_saved(case):
    module = load_ds_file(str(tag_dir(case) / "mp_rank_00_model_states.pt"))["module"]
    with DeepSpeedReader(str(tag_dir(case))) as reader:
        for name in reader.shapes:
            assert torch.equal(reader.read_full(name).to(torch.bfloat16), module[name]), name


def test_stage3_moments_map_like_stage2s():
    """The same training at stage 2 and 3 (DeepSpeed's losses are equal): the per-parameter
    stage-3 partitions and the flat stage-2 partitions must give the same Adam moments."""
    with (
        DeepSpeedReader(str(tag_dir("zero2_fp32"))) as z2,
        DeepSpeedReader(str(tag_dir("zero3_fp32"))) as z3,
    ):
        assert z2.kinds == z3.kinds == {k: "float32" for k in ("param", "exp_avg", "exp_avg_sq")}
        for name in z2.shapes:
            for kind in ("param", "exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(
                    z3.read(name, kind), z2.read(name, kind), rtol=1e-5, atol=1e-8
                )
            # a range read is the same elements as the full read
            full = z3.read(name, "exp_avg")
            lo, hi = full.numel() // 3, full.numel() - 1
            assert torch.equal(z3.read(name, "exp_avg", lo, hi), full[lo:hi])


@pytest.mark.parametrize("case", ["zero3_fp32_tied", "zero2_bf16_tied"])
def test_tied_weights_are_one_parameter_with_an_alias(case):
    with DeepSpeedReader(str(tag_dir(case))) as reader:
        assert "lm_head.weight" not in reader.shapes
        assert reader.state("aliases") == {"lm_head.weight": "model.embed_tokens.weight"}


def test_state_scheduler_counters_client_and_optimizer():
    with DeepSpeedReader(str(tag_dir("zero2_bf16"))) as r:
        assert r.state("lr_scheduler") == {"last_batch_iteration": 2}
        assert r.state("counters") == {"global_steps": 3, "global_samples": 36, "skipped_steps": 0}
        assert r.state("client_state") == EXPECTED["client_state"]
        assert r.state("loss_scaler") is None  # bf16: no scaler to restore
        opt = r.state("optimizer")
        assert opt["class"] == "AdamW"
        assert opt["param_groups"][0]["betas"] == (0.9, 0.95)
        assert opt["scalar_state"][0]["values"]["step"]["__tensor__"] == [3.0]
        assert r.rank_state(0) == {}


def test_detected_through_latest_and_by_tag_folder():
    assert detect_format(str(tag_dir("zero1_fp32"))) == DEEPSPEED
    assert locate(str(FIXTURE / "zero1_fp32")) == str(tag_dir("zero1_fp32"))
    assert locate(str(tag_dir("zero1_fp32"))) == str(tag_dir("zero1_fp32"))


# ---------------------------------------------------------------------------- refusals
@pytest.fixture
def copy_of(tmp_path):
    def make(case: str) -> Path:
        dst = tmp_path / case
        shutil.copytree(tag_dir(case), dst)
        return dst

    return make


def _rewrite(path: Path, state) -> None:
    # A new file renamed over the old: the old one may still be memory-mapped by a reader.
    torch.save(state, path.with_suffix(".new"))
    path.with_suffix(".new").replace(path)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_pickled_type_outside_the_allow_list_is_refused_by_name(copy_of, capsys):
    d = copy_of("zero2_fp32")
    state = load_ds_file(str(d / "mp_rank_00_model_states.pt"))
    state["lr_scheduler"] = _Payload()
    _rewrite(d / "mp_rank_00_model_states.pt", state)
    with pytest.raises(
        CheckpointError, match=r"model_states.pt holds a pickled print, which is not one of"
    ):
        DeepSpeedReader(str(d))
    assert "must never run" not in capsys.readouterr().out


def test_a_missing_rank_file_is_refused(copy_of):
    d = copy_of("zero2_fp32")
    (d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(CheckpointError, match=r"saved by \[2\] data-parallel ranks"):
        DeepSpeedReader(str(d))
    (d / "zero_pp_rank_0_mp_rank_00_optim_states.pt").rename(
        d / "zero_pp_rank_2_mp_rank_00_optim_states.pt"
    )
    with pytest.raises(CheckpointError, match=r"rank\(s\) \[0, 1\] are missing"):
        DeepSpeedReader(str(d))


def test_pipeline_and_tensor_parallel_checkpoints_are_refused(copy_of):
    d = copy_of("zero1_fp32")
    (d / "layer_01-model_00-model_states.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="pipeline-parallel"):
        DeepSpeedReader(str(d))
    d = copy_of("zero2_fp32")
    shutil.copy(d / "mp_rank_00_model_states.pt", d / "mp_rank_01_model_states.pt")
    with pytest.raises(CheckpointError, match="2 tensor-parallel parts"):
        DeepSpeedReader(str(d))


def test_a_truncated_file_is_refused_naming_it(copy_of):
    d = copy_of("zero3_bf16")
    f = d / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = f.read_bytes()[:1000]
    f.unlink()
    f.write_bytes(data)
    with pytest.raises(CheckpointError, match="bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        DeepSpeedReader(str(d))


def test_shapes_that_do_not_fit_the_partitions_are_refused(copy_of):
    d = copy_of("zero2_fp32")
    state = load_ds_file(str(d / "mp_rank_00_model_states.pt"))
    state["param_shapes"][0]["model.embed_tokens.weight"] = torch.Size([640, 16])
    _rewrite(d / "mp_rank_00_model_states.pt", dict(state))
    with pytest.raises(CheckpointError, match="beyond the 6736 elements"):
        DeepSpeedReader(str(d))


# ---------------------------------------------------------------------------- layouts
def test_zero12_places_straddle_ranks_and_skip_alignment_padding():
    shapes = [{"a": (3,), "b": (2, 2)}, {"c": (5,)}]
    # group 0: a at 0..3, pad 1, b at 4..8 -> ranks of 5 (rank 1 saved without the end
    # padding: 3): b is [4,5) on rank 0, [5,8) on rank 1; group 1 in ranks of 3 and 2
    places = zero12_places(shapes, [[5, 3], [3, 2]], [[1, 0], [0]], "x")
    assert places["a"].spans == (Span(0, 3, 0, 0),)
    assert places["b"].spans == (Span(0, 1, 0, 4), Span(1, 4, 1, 0))
    assert places["c"].group == 1 and places["c"].spans == (Span(0, 3, 0, 0), Span(3, 5, 1, 0))
    with pytest.raises(CheckpointError, match="beyond"):
        zero12_places([{"a": (11,)}], [[5, 5]], None, "x")
    with pytest.raises(CheckpointError, match="are 8 elements, its ranks' partitions hold 10"):
        zero12_places(shapes[:1], [[5, 5]], [[1, 0]], "x")


def test_zero12_places_skip_ranks_that_hold_only_padding():
    """A group smaller than the world: at 4 ranks DeepSpeed pads 3 elements to 8, ranks of 2;
    rank 1 keeps 1 element, ranks 2 and 3 nothing."""
    places = zero12_places([{"a": (1,), "b": (2,)}], [[2, 1, 0, 0]], None, "x")
    assert places["a"].spans == (Span(0, 1, 0, 0),)
    assert places["b"].spans == (Span(0, 1, 0, 1), Span(1, 2, 1, 0))


def test_zero3_places_split_every_parameter_and_pad_the_last_rank():
    places = zero3_places([{"a": (5,)}, {"b": (2,)}], 3 + 1, 2, "x")
    assert places["a"].spans == (Span(0, 3, 0, 0), Span(3, 5, 1, 0))
    assert places["b"].spans == (Span(0, 1, 0, 3), Span(1, 2, 1, 3))
    with pytest.raises(CheckpointError, match="need 4 elements per rank"):
        zero3_places([{"a": (5,)}, {"b": (2,)}], 5, 2, "x")


def test_under_an_mpu_a_deepspeed_checkpoint_is_refused_not_skipped():
    from runtime.checkpoint.formats import refuse_foreign_under_mpu

    with pytest.raises(CheckpointError, match="with model parallelism"):
        refuse_foreign_under_mpu(str(FIXTURE / "zero2_fp32"), None)
    refuse_foreign_under_mpu(str(FIXTURE / "no-such-dir"), None)  # the load says what is missing


def _plain(content: dict) -> dict:
    """The file's content with the stand-ins of DeepSpeed's types made plain again (the
    reader's stand-ins are not on its allow-list), to be saved back."""
    state = content["optimizer_state_dict"]
    state["zero_stage"], state["loss_scaler"] = int(state["zero_stage"]), None
    return content


@pytest.mark.parametrize("stored", [3, torch.tensor([3.0]), torch.tensor(3.0)])
def test_step_becomes_the_singleton_tensor_torchs_adam_steps_with(copy_of, stored):
    """DeepSpeed's FusedAdam and CPUAdam keep ``step`` as a plain int; a one-element tensor
    of another shape is the same count. Loaded into torch's AdamW, each must train."""
    from runtime.checkpoint import jsonable

    d = copy_of("zero3_fp32")
    for rank in (0, 1):
        f = d / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        content = _plain(load_ds_file(str(f)))
        for entry in content["optimizer_state_dict"]["optimizer_state_dict"]["state"].values():
            entry["step"] = stored
        _rewrite(f, content)
    with DeepSpeedReader(str(d)) as reader:
        values = jsonable.decode(reader.state("optimizer")["scalar_state"][0]["values"])
        name = next(iter(reader.shapes))
        moments = {k: reader.read_full(name, k) for k in ("exp_avg", "exp_avg_sq")}
        weight = torch.nn.Parameter(reader.read_full(name))
    assert torch.is_tensor(values["step"]) and values["step"].shape == ()
    assert float(values["step"]) == 3.0
    opt = torch.optim.AdamW([weight], lr=1e-2)
    opt.state[weight] = {"step": values["step"], **moments}
    weight.grad = torch.ones_like(weight)
    opt.step()
    assert float(opt.state[weight]["step"]) == 4.0


def test_a_step_that_is_no_count_is_refused_naming_the_file(copy_of):
    d = copy_of("zero3_fp32")
    f = d / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    content = _plain(load_ds_file(str(f)))
    content["optimizer_state_dict"]["optimizer_state_dict"]["state"][0]["step"] = "three"
    _rewrite(f, content)
    with pytest.raises(
        CheckpointError, match="zero_pp_rank_0_mp_rank_00_optim_states.pt: optimizer state 'step'"
    ):
        with DeepSpeedReader(str(d)) as reader:
            reader.state("optimizer")
