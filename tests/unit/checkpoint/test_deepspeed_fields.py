"""Every field the DeepSpeed reader uses, replaced with a wrong type or removed in a copy of a
real DeepSpeed 0.19.8 checkpoint, is a `CheckpointError` naming the file and the field, before
any weight is read (and `zlaunch convert` exits with it, no traceback)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from runtime.checkpoint import CheckpointError
from runtime.checkpoint.formats.deepspeed import DeepSpeedReader
from runtime.checkpoint.formats.ds_pickle import load_ds_file
from tests.fixtures.deepspeed.resave import save_ds_file

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed"
FIXTURE = FIXTURES / "checkpoints"
MODEL = "mp_rank_00_model_states.pt"
OPTIM = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
Z3_MODEL = "zero_pp_rank_1_mp_rank_00_model_states.pt"
Z3_OPTIM = "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
MISSING = object()
OSD = "optimizer_state_dict"
BASE = (OSD, "base_optimizer_state")

# (case, file, path to the field, wrong value, the field as the error names it)
TABLE = [
    ("zero2_fp32", MODEL, ("param_shapes",), "x", "param_shapes"),
    ("zero2_fp32", MODEL, ("param_shapes", 0), [1, 2], "param_shapes[0]"),
    ("zero2_fp32", MODEL, ("param_shapes", 0, "lm_head.weight"), "x", "param_shapes[0]['lm_head.weight']"),
    ("zero2_fp32", MODEL, ("param_shapes", 0, "lm_head.weight"), None, "param_shapes[0]['lm_head.weight']"),
    ("zero2_fp32", MODEL, ("param_shapes", 0, "lm_head.weight"), [64.0, 16], "param_shapes[0]['lm_head.weight']"),
    ("zero2_fp32", MODEL, ("module",), [1], "module"),
    ("zero2_fp32", MODEL, ("module", "lm_head.weight"), "x", "module['lm_head.weight']"),
    ("zero2_fp32", MODEL, ("buffer_names",), "x", "buffer_names"),
    ("zero2_fp32", MODEL, ("frozen_param_shapes",), 3, "frozen_param_shapes"),
    ("zero2_fp32", MODEL, ("shared_params",), "x", "shared_params"),
    ("zero2_fp32", MODEL, ("mp_world_size",), torch.tensor([1, 2]), "mp_world_size"),
    ("zero2_fp32", MODEL, ("checkpoint_parallel_dimensions",), "x", "checkpoint_parallel_dimensions"),
    ("zero2_fp32", MODEL, ("global_steps",), "3", "global_steps"),
    ("zero2_fp32", MODEL, ("lr_scheduler",), [1], "lr_scheduler"),
    ("zero2_fp32", MODEL, ("ds_config",), "x", "ds_config"),
    ("zero2_fp32", OPTIM, (OSD, "zero_stage"), "2", f"{OSD}['zero_stage']"),
    ("zero2_fp32", OPTIM, (*BASE,), MISSING, f"{OSD}['base_optimizer_state']"),
    ("zero2_fp32", OPTIM, (OSD, "partition_count"), torch.tensor([2, 2]), f"{OSD}['partition_count']"),
    ("zero2_fp32", OPTIM, (OSD, "partition_count"), ["2"], f"{OSD}['partition_count']"),
    ("zero2_fp32", OPTIM, (OSD, "partition_count"), MISSING, f"{OSD}['partition_count']"),
    ("zero2_fp32", OPTIM, (OSD, "single_partition_of_fp32_groups"), "x", f"{OSD}['single_partition_of_fp32_groups']"),
    ("zero2_fp32", OPTIM, (OSD, "single_partition_of_fp32_groups", 0), torch.arange(6736), f"{OSD}['single_partition_of_fp32_groups'][0]"),
    ("zero2_fp32", OPTIM, (OSD, "param_alignment_paddings"), 3, f"{OSD}['param_alignment_paddings']"),
    ("zero2_fp32", OPTIM, (OSD, "param_alignment_paddings", 0), None, f"{OSD}['param_alignment_paddings'][0]"),
    ("zero2_fp32", OPTIM, (OSD, "param_alignment_paddings", 0, 0), "x", f"{OSD}['param_alignment_paddings'][0]"),
    ("zero2_fp32", OPTIM, (*BASE,), "x", f"{OSD}['base_optimizer_state']"),
    ("zero2_fp32", OPTIM, (*BASE, "state"), [1], f"{OSD}['base_optimizer_state']['state']"),
    ("zero2_fp32", OPTIM, (*BASE, "state", 0), "x", f"{OSD}['base_optimizer_state']['state'][0]"),
    ("zero2_fp32", OPTIM, (*BASE, "state", 0, "exp_avg"), torch.arange(6736), f"{OSD}['base_optimizer_state']['state'][0]['exp_avg']"),
    ("zero2_fp32", OPTIM, (*BASE, "param_groups"), 3, f"{OSD}['base_optimizer_state']['param_groups']"),
    ("zero2_fp32", OPTIM, (*BASE, "param_groups", 0), "x", f"{OSD}['base_optimizer_state']['param_groups'][0]"),
    ("zero2_fp32", OPTIM, (*BASE, "param_groups", 0, "params"), [[0]], f"{OSD}['base_optimizer_state']['param_groups'][0]['params']"),
    ("zero3_bf16", Z3_OPTIM, (OSD, "fp32_flat_groups"), {}, f"{OSD}['fp32_flat_groups']"),
    ("zero3_bf16", Z3_OPTIM, (OSD, "fp32_flat_groups", 0), "x", f"{OSD}['fp32_flat_groups'][0]"),
    ("zero3_bf16", Z3_OPTIM, (OSD, "optimizer_state_dict"), 3, f"{OSD}['optimizer_state_dict']"),
    ("zero3_bf16", Z3_OPTIM, (OSD, "loss_scaler"), "x", f"{OSD}['loss_scaler']"),
    ("../corpus/frozen_z3_fp32_w2", Z3_MODEL, ("frozen_param_fragments",), [1], "frozen_param_fragments"),
    ("../corpus/frozen_z3_fp32_w2", Z3_MODEL, ("frozen_param_fragments", "fc.bias"), "x", "frozen_param_fragments['fc.bias']"),
]  # fmt: skip


# The fields the reader uses, each refused when it holds a string (the others: unused).
REFUSED = {
    MODEL: {
        (k,) for k in ("param_shapes", "module", "buffer_names", "frozen_param_shapes",
                       "shared_params", "frozen_param_fragments", "lr_scheduler",
                       "skipped_steps", "global_steps", "global_samples", "dp_world_size",
                       "mp_world_size", "checkpoint_parallel_dimensions", "ds_config")
    } | {("module", "lm_head.weight"), ("ds_config", "optimizer")},
    OPTIM: {(OSD,)} | {
        (OSD, k) for k in ("loss_scaler", "base_optimizer_state", "zero_stage", "group_paddings",
                         "single_partition_of_fp32_groups", "param_alignment_paddings",
                         "partition_count")
    },
}  # fmt: skip


def _crafted(tmp_path: Path, case: str, file: str, path: tuple, value) -> Path:
    save = tmp_path / Path(case).name
    shutil.copytree(FIXTURE / case, save)
    target = save / "global_step3" / file
    content = load_ds_file(str(target))
    holder = content
    for key in path[:-1]:
        holder = holder[key]
    if value is MISSING:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    save_ds_file(content, target)
    return save


@pytest.mark.parametrize(("case", "file", "path", "value", "field"), TABLE)
def test_a_wrongly_typed_field_is_refused_naming_file_and_field(
    tmp_path, case, file, path, value, field
):
    save = _crafted(tmp_path, case, file, path, value)
    with pytest.raises(CheckpointError) as err:
        DeepSpeedReader(str(save / "global_step3"))
    message = str(err.value)
    assert message.startswith(f"{save / 'global_step3' / file}: field {field} is "), message
    assert ("is missing" in message) == (value is MISSING), message


@pytest.mark.parametrize("file", [MODEL, OPTIM])
def test_every_field_replaced_by_a_string_is_refused_or_unused(tmp_path, file):
    """A sweep over every field two levels deep: each is refused with a CheckpointError that
    names the file, or is a field the reader does not use (then it reads the fixture's
    weights unchanged); nothing else escapes."""
    case = "zero2_fp32"
    with DeepSpeedReader(str(FIXTURE / case / "global_step3")) as reader:
        expected = {n: reader.read_full(n).clone() for n in reader.shapes}
    content = load_ds_file(str(FIXTURE / case / "global_step3" / file))
    paths = [(k,) for k in content]
    paths += [(k, j) for k, v in content.items() if isinstance(v, dict) for j in v]
    refused = set()
    for i, path in enumerate(paths):
        save = _crafted(tmp_path / str(i), case, file, path, "x")
        try:
            with DeepSpeedReader(str(save / "global_step3")) as reader:
                for name, tensor in expected.items():
                    assert torch.equal(reader.read_full(name), tensor), (path, name)
        except CheckpointError as err:
            assert str(save / "global_step3" / file) in str(err), (path, str(err))
            refused.add(path)
    assert refused >= REFUSED[file], sorted(REFUSED[file] - refused)


def test_convert_exits_with_the_field_and_no_traceback(tmp_path, capsys):
    from zlaunch.cli import main

    save = _crafted(tmp_path, "zero2_fp32", OPTIM, (OSD, "partition_count"), ["2"])
    with pytest.raises(SystemExit) as exited:
        main(["convert", str(save), "-o", str(tmp_path / "out"), "--to", "safetensors"])
    err = capsys.readouterr().err
    assert exited.value.code == 1
    assert "Traceback" not in err
    assert re.search(rf"{OPTIM}: field {re.escape(OSD)}\['partition_count'\] is a list", err), err
    assert not (tmp_path / "out").exists()
