"""A manifest's pieces against what the shards store: each stored tensor is read into one place
only, and nothing a read allocates exceeds what the files hold. Every crafted manifest is one
CheckpointError naming the manifest and the field, raised when the checkpoint is opened, so
before any tensor is read or allocated (and before a load changes anything in an engine)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from runtime.checkpoint import CheckpointError
from runtime.checkpoint.reader import CheckpointReader
from runtime.checkpoint.storage import MANIFEST, Piece, shard_file_name
from tests.unit.checkpoint.test_storage import ThreadGroup

N = 1024  # elements of each half of ``w``


def save_halves(tmp_path) -> str:
    """``w`` (2N elements, 0..2N-1) saved by two thread ranks, one half each."""
    import threading

    full = torch.arange(2 * N, dtype=torch.float32)
    group = ThreadGroup(2)
    out = {}

    def rank_main(rank: int) -> None:
        piece = Piece("w", rank * N, N)
        out[rank] = _write(tmp_path, rank, 2, group, [(piece, {"param": full[rank * N :][:N]})])

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out[0]


def _write(tmp_path, rank, world, group, pieces, extra=None):
    from runtime.checkpoint.storage import write_checkpoint

    return write_checkpoint(
        str(tmp_path),
        "t",
        rank=rank,
        world_size=world,
        agree=group.agree_for(rank),
        share=group.share_for(rank),
        pieces=pieces,
        extra=extra if rank == 0 else None,
        manifest_fields=lambda: {"params": {"w": {"shape": [2 * N]}}},
    )


def craft(path: str, change) -> str:
    manifest_path = os.path.join(path, MANIFEST)
    with open(manifest_path) as f:
        manifest = json.load(f)
    change(manifest)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    return manifest_path


def test_one_stored_tensor_listed_as_two_pieces_is_refused(tmp_path):
    path = save_halves(tmp_path)
    with CheckpointReader(path) as reader:  # the intact checkpoint reads 0..2N-1
        assert torch.equal(reader.read_full("w"), torch.arange(2 * N, dtype=torch.float32))

    def change(m):
        # Shard 0's one stored tensor (w[0:N]) claimed to be w[0:N] and w[N:2N]; shard 1 empty.
        m["shards"][0]["pieces"] = [["w", 0, N], ["w", N, N]]
        m["shards"][1]["pieces"] = []

    manifest_path = craft(path, change)
    with pytest.raises(CheckpointError) as caught:
        CheckpointReader(path)
    assert str(caught.value).startswith(manifest_path)
    assert "shards[0].pieces[1]: w is listed again" in str(caught.value)


def test_a_small_tensor_listed_many_times_is_refused_before_anything_is_allocated(tmp_path):
    path = save_halves(tmp_path)

    def change(m):  # w[0:N] of shard 0 standing for all 256 pieces of a 256N-element w
        m["params"]["w"]["shape"] = [256 * N]
        m["shards"][0]["pieces"] = [["w", i * N, N] for i in range(256)]
        m["shards"][1]["pieces"] = []

    craft(path, change)
    with pytest.raises(CheckpointError, match=r"shards\[0\]\.pieces\[1\]: w is listed again"):
        CheckpointReader(path)


def test_two_shard_records_that_are_one_file_under_two_names_are_refused(tmp_path):
    path = save_halves(tmp_path)
    first, second = (os.path.join(path, shard_file_name(r, 2)) for r in range(2))
    os.unlink(second)
    os.link(first, second)  # shard 1's name now reaches shard 0's bytes

    def change(m):
        m["shards"][1].update(bytes=m["shards"][0]["bytes"], crc32=m["shards"][0]["crc32"])

    craft(path, change)
    with pytest.raises(CheckpointError, match="shards 0 and 1 are one file"):
        CheckpointReader(path)


def test_tensors_listed_beyond_the_bytes_a_shard_holds_are_refused(tmp_path):
    path = save_halves(tmp_path)

    def change(m):
        m["shards"][0]["extra"] = {"big": {"shape": [1 << 20], "dtype": "float32"}}

    craft(path, change)
    with pytest.raises(CheckpointError, match=r"shards\[0\] lists \d+ bytes of tensors"):
        CheckpointReader(path)


@pytest.mark.parametrize("name", ["w/param", "__full__", ""])
def test_a_parameter_name_that_blurs_the_stored_keys_is_refused(tmp_path, name):
    path = save_halves(tmp_path)

    def change(m):
        m["params"] = {name: m["params"]["w"]}
        for shard in m["shards"]:
            shard["pieces"] = [[name, o, c] for _, o, c in shard["pieces"]]

    craft(path, change)
    with pytest.raises(CheckpointError, match="is not a parameter name"):
        CheckpointReader(path)
