"""What `zlaunch convert` does to what already stands at its output: nothing is replaced
without --force, the checkpoint read is never its output, a save folder's ``latest`` never
moves back silently, and every output is as private as a checkpoint (folders 0700, files
0600). The command runs in this process (``zlaunch.cli.main``); sources are the DeepSpeed
fixture and a small checkpoint of this runtime's own."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
import torch

from runtime.checkpoint import CheckpointError
from runtime.checkpoint.export import convert
from runtime.checkpoint.reader import CheckpointReader
from runtime.checkpoint.storage import LATEST, read_latest
from tests.unit.checkpoint.test_convert import FIXTURE
from zlaunch.cli import main

DS = FIXTURE / "zero2_fp32"


@pytest.fixture
def config_dir(tmp_path):
    """A config.json --to hf takes (the output is not loaded here: no model is built)."""
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def zlaunch(capsys, *args) -> tuple[int, str]:
    """``zlaunch ARGS`` in this process: (exit code, stderr)."""
    with pytest.raises(SystemExit) as done:
        main([str(a) for a in args])
    return done.value.code, capsys.readouterr().err


def snapshot(folder) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_non_empty_output_is_replaced_only_with_force(tmp_path, capsys, config_dir):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the user's own model")
    (out / "tokenizer.json").write_text("{}")
    before = snapshot(out)
    args = ["convert", DS, "-o", out, "--to", "hf", "--hf-config", config_dir]
    code, err = zlaunch(capsys, *args)
    assert code == 1 and "already holds model.safetensors, tokenizer.json" in err
    assert "--force" in err and "Traceback" not in err
    assert snapshot(out) == before  # nothing written, nothing removed
    code, err = zlaunch(capsys, *args, "--force")
    assert code == 0, err
    # The stale single-file model would shadow the new shards in from_pretrained: it goes;
    # the tokenizer, not the export's own, is kept.
    assert sorted(os.listdir(out)) == [
        "config.json",
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ]


def test_an_existing_file_output_is_replaced_only_with_force(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"precious")
    code, err = zlaunch(capsys, "consolidate", DS, "-o", out)
    assert code == 1 and "already exists" in err and out.read_bytes() == b"precious"
    code, err = zlaunch(capsys, "consolidate", DS, "-o", out, "--force")
    assert code == 0, err
    from safetensors.torch import load_file

    assert "model.embed_tokens.weight" in load_file(out)


def test_an_output_that_is_a_link_or_a_file_where_a_folder_goes_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        convert(str(DS), str(tmp_path / "link"), "dcp", force=True)
    assert os.listdir(tmp_path / "real") == []
    (tmp_path / "file").write_text("mine")
    with pytest.raises(CheckpointError, match="is a file; this output is a folder"):
        convert(str(DS), str(tmp_path / "file"), "dcp", force=True)
    assert (tmp_path / "file").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["file", "link", "real"]  # nothing left behind


@pytest.mark.parametrize(
    "output", ["X", "X/global_step3", "."], ids=["the save folder", "its tag", "its parent"]
)
def test_the_checkpoint_read_is_never_its_own_output(tmp_path, capsys, output):
    src = tmp_path / "X"
    shutil.copytree(DS, src)
    before = snapshot(src)
    for force in ([], ["--force"]):
        code, err = zlaunch(
            capsys, "convert", src, "-o", tmp_path / output, "--to", "zlaunch", *force
        )
        assert code == 1 and "would replace the source" in err, err
    assert snapshot(src) == before  # DeepSpeed's files are all there, unchanged


def test_an_output_inside_the_source_folder_is_fine(tmp_path):
    src = tmp_path / "X"
    shutil.copytree(DS, src)
    convert(str(src), str(src / "native"), "zlaunch")
    assert read_latest(str(src / "native")) == "global_step3"
    assert sorted(os.listdir(src / "global_step3")) == sorted(os.listdir(DS / "global_step3"))


def test_a_save_folder_with_a_newer_checkpoint_keeps_its_latest(tmp_path, capsys):
    save = tmp_path / "save"
    convert(str(DS), str(save), "zlaunch")
    shutil.copytree(save / "global_step3", save / "global_step9")
    (save / LATEST).write_text("global_step9\n")
    code, err = zlaunch(capsys, "convert", DS, "-o", save, "--to", "zlaunch")
    assert code == 1 and "--force to add the checkpoint global_step3" in err
    result = convert(str(DS), str(save), "zlaunch", force=True)
    assert read_latest(str(save)) == "global_step9"  # a resume still loads the newer one
    assert any("still names global_step9" in note for note in result.notes)
    assert any("replaced the checkpoint global_step3" in note for note in result.notes)
    with CheckpointReader(str(save / "global_step3")) as reader:
        assert reader.state("counters") is not None
    code, err = zlaunch(capsys, "convert", DS, "-o", save, "--to", "zlaunch", "--force")
    assert code == 0 and "note: " in err and "still names global_step9" in err


def test_exports_are_as_private_as_checkpoints(tmp_path, config_dir):
    convert(str(DS), str(tmp_path / "hf"), "hf", hf_config=str(config_dir))
    convert(str(DS), str(tmp_path / "dcp"), "dcp")
    convert(str(DS), str(tmp_path / "m.safetensors"), "safetensors")
    convert(str(DS), str(tmp_path / "native"), "zlaunch")
    for root in ("hf", "dcp", "native"):
        assert stat.S_IMODE((tmp_path / root).stat().st_mode) == 0o700, root
        for path in (tmp_path / root).rglob("*"):
            want = 0o700 if path.is_dir() else 0o600
            assert stat.S_IMODE(path.stat().st_mode) == want, path
    assert stat.S_IMODE((tmp_path / "m.safetensors").stat().st_mode) == 0o600
    dcp_state = {"model.norm.weight": torch.zeros(16)}
    import torch.distributed.checkpoint as dcp

    dcp.load(dcp_state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert dcp_state["model.norm.weight"].abs().sum() > 0
