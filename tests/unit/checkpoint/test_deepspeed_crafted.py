"""Crafted DeepSpeed files cost bounded time and memory and are refused naming the file: a
pickle memo that shares containers (a DAG a few KB on disk that any walk expands
exponentially), a self-containing or deeply nested pickle, a zip whose pickle is deflated to
inflate far beyond the file, compressed tensor data, and a ``latest`` that is a FIFO, a device
or huge. Each case is built from a copy of a real DeepSpeed 0.19.8 fixture."""

from __future__ import annotations

import os
import shutil
import struct
import zipfile
from pathlib import Path

import pytest

from runtime.checkpoint import CheckpointError
from runtime.checkpoint.export import convert
from runtime.checkpoint.formats import locate
from runtime.checkpoint.formats.deepspeed import DeepSpeedReader
from runtime.checkpoint.formats.ds_pickle import MAX_DEPTH, MAX_INFLATED_BYTES, load_ds_file
from tests.fixtures.deepspeed.resave import save_ds_file

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed" / "checkpoints"
CASE = "zero2_fp32"
OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
MODEL = "mp_rank_00_model_states.pt"


@pytest.fixture
def save_dir(tmp_path):
    dst = tmp_path / CASE
    shutil.copytree(FIXTURE / CASE, dst)
    return dst


def _tag(save_dir: Path) -> Path:
    return save_dir / "global_step3"


def _dag(depth: int) -> list:
    node: list = [0]
    for _ in range(depth):
        node = [node, node]  # pickled once, referenced twice: 2**depth leaves as a tree
    return node


def _self_containing() -> list:
    loop: list = [1]
    loop.append(loop)
    return loop


def _nested(depth: int) -> list:
    node: list = []
    for _ in range(depth):
        node = [node]
    return node


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (_dag(64), r"stores \d+ references that, walked as a tree, reach \d+ objects"),
        (_self_containing(), r"holds a list that contains itself"),
        (_nested(MAX_DEPTH + 5), rf"nests containers more than {MAX_DEPTH} levels deep"),
    ],
    ids=["memo-dag", "cycle", "deep"],
)
def test_a_crafted_pickle_graph_is_refused_naming_the_file(save_dir, value, match):
    optim = _tag(save_dir) / OPTIM
    state = load_ds_file(str(optim))
    state["optimizer_state_dict"]["base_optimizer_state"]["param_groups"][0]["x"] = value
    save_ds_file(state, optim)
    assert optim.stat().st_size < (FIXTURE / CASE / "global_step3" / OPTIM).stat().st_size + 4096
    with pytest.raises(CheckpointError, match=rf"{OPTIM} {match}"):
        DeepSpeedReader(str(_tag(save_dir)))
    with pytest.raises(CheckpointError, match=OPTIM):
        convert(str(save_dir), str(save_dir.parent / "out"), "safetensors")
    assert not (save_dir.parent / "out").exists()


def _deflated(path: Path, inflate: dict[str, int]) -> None:
    new = path.with_suffix(".zip")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(new, "w") as dst:
        for entry in src.infolist():
            data = src.read(entry)
            suffix = next((s for s in inflate if entry.filename.endswith(s)), None)
            if suffix is None:
                dst.writestr(entry, data, compress_type=zipfile.ZIP_STORED)
                continue
            info = zipfile.ZipInfo(entry.filename)
            info.compress_type = zipfile.ZIP_DEFLATED
            with dst.open(info, "w") as out:
                out.write(data)
                zeros, left = bytes(1 << 20), inflate[suffix] - len(data)
                while left > 0:
                    out.write(zeros[: min(left, len(zeros))])
                    left -= len(zeros)
    new.replace(path)


def test_a_deflated_pickle_that_inflates_beyond_the_bound_is_refused_unread(save_dir):
    model = _tag(save_dir) / MODEL
    _deflated(model, {"/data.pkl": MAX_INFLATED_BYTES + (1 << 20)})
    assert model.stat().st_size < 1 << 20  # a bomb: small on disk
    with pytest.raises(
        CheckpointError,
        match=rf"{MODEL}: zip entry \S+/data.pkl declares {MAX_INFLATED_BYTES + (1 << 20)} "
        rf"bytes compressed into \d+; more than {MAX_INFLATED_BYTES >> 20} MiB",
    ):
        DeepSpeedReader(str(_tag(save_dir)))


def test_a_small_deflated_pickle_loads_and_compressed_tensor_data_is_refused(save_dir):
    model = _tag(save_dir) / MODEL
    expected = load_ds_file(str(model))["param_shapes"]
    _deflated(model, {"/data.pkl": 0})  # deflated, not padded: the same content
    assert load_ds_file(str(model))["param_shapes"] == expected
    _deflated(model, {"/data/0": 0})
    with pytest.raises(CheckpointError, match=rf"{MODEL}: tensor data \S+/data/0 is stored comp"):
        DeepSpeedReader(str(_tag(save_dir)))


def test_a_checkpoint_file_that_is_a_fifo_is_refused_not_waited_on(save_dir):
    optim = _tag(save_dir) / OPTIM
    optim.unlink()
    os.mkfifo(optim)
    with pytest.raises(CheckpointError, match=rf"{OPTIM} is not a regular file"):
        DeepSpeedReader(str(_tag(save_dir)))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_latest_that_is_no_small_regular_file_is_refused(save_dir, kind):
    latest = save_dir / "latest"
    latest.unlink()
    if kind == "fifo":
        os.mkfifo(latest)
    elif kind == "dev-zero":
        latest.symlink_to("/dev/zero")
    else:
        with open(latest, "wb") as f:
            f.truncate(1 << 30)  # sparse: 1 GiB declared, nothing on disk
    match = {"fifo": "not a regular file", "dev-zero": "a symbolic link", "huge": "more than"}
    with pytest.raises(CheckpointError, match=rf"latest.*{match[kind]}"):
        locate(str(save_dir))
    with pytest.raises(CheckpointError, match="latest"):
        convert(str(save_dir), str(save_dir.parent / "out"), "safetensors")


def _declare(path: Path, name_suffix: str, size: int) -> None:
    """Patch the uncompressed size the zip declares for one entry (its local header and its
    central-directory record), leaving its data as it is."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        entry = next(e for e in archive.infolist() if e.filename.endswith(name_suffix))
    struct.pack_into("<I", data, entry.header_offset + 22, size)  # local file header
    central = data.find(b"PK\x01\x02")
    while central >= 0:
        name_len = struct.unpack_from("<H", data, central + 28)[0]
        if bytes(data[central + 46 : central + 46 + name_len]).decode() == entry.filename:
            struct.pack_into("<I", data, central + 24, size)
            break
        central = data.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(data))


def test_a_deflated_pickle_that_inflates_beyond_its_declared_size_is_refused(save_dir):
    model = _tag(save_dir) / MODEL
    _deflated(model, {"/data.pkl": 32 << 20})  # 32 MiB of pickle and zeros, KBs on disk
    _declare(model, "/data.pkl", 1024)  # said to be 1 KiB
    with pytest.raises(
        CheckpointError, match=rf"{MODEL}: zip entry \S+/data.pkl does not inflate to the 1024"
    ):
        DeepSpeedReader(str(_tag(save_dir)))
