"""Storage layer: shards, manifest, atomic commit, exact range reads, clear errors (no engine).

Ranks are threads here: ``agree`` is a barrier that ANDs every rank's flag, which is all the
storage layer asks of a process group.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading

import numpy as np
import pytest
import torch

from runtime.checkpoint import CheckpointError, jsonable
from runtime.checkpoint.reader import CheckpointReader
from runtime.checkpoint.storage import (
    LATEST,
    MANIFEST,
    SLOW_SAVE_ENV,
    Piece,
    _slow_save_seconds,
    resolve_checkpoint,
    shard_file_name,
    write_checkpoint,
)

# Two parameters, cut unevenly over three ranks (rank 1 holds the tail of a and the head of b).
SHAPES = {"a.weight": (3, 5), "b.bias": (7,)}
SPLITS = {
    0: [Piece("a.weight", 0, 9)],
    1: [Piece("a.weight", 9, 6), Piece("b.bias", 0, 2)],
    2: [Piece("b.bias", 2, 5)],
}


def reference() -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return {
        name: {
            "param": torch.randn(math.prod(shape), generator=g),
            "exp_avg": torch.randn(math.prod(shape), generator=g),
        }
        for name, shape in SHAPES.items()
    }


class ThreadGroup:
    """``agree`` for N thread-ranks: a barrier that returns whether every rank passed True;
    ``share``: rank 0's value on every rank."""

    def __init__(self, n: int):
        self.flags = [True] * n
        self.barrier = threading.Barrier(n)
        self.value = 0

    def agree_for(self, rank: int):
        def agree(ok: bool) -> bool:
            self.flags[rank] = ok
            self.barrier.wait()
            result = all(self.flags)
            self.barrier.wait()
            return result

        return agree

    def share_for(self, rank: int):
        def share(value: int) -> int:
            if rank == 0:
                self.value = value
            self.barrier.wait()
            result = self.value
            self.barrier.wait()
            return result

        return share


def save_threads(save_dir, tag, *, fail_rank=None, client="hello", save_latest=True):
    ref = reference()
    world = len(SPLITS)
    group = ThreadGroup(world)
    results: dict[int, object] = {}

    def rank_main(rank: int) -> None:
        pieces = []
        for p in SPLITS[rank]:
            kinds = {k: v[p.offset : p.end] for k, v in ref[p.name].items()}
            if rank == fail_rank:
                kinds = {"param": torch.zeros(p.numel + 1)}  # wrong size: this rank fails
            pieces.append((p, kinds))

        def fields():
            return {
                "params": {n: {"shape": list(s)} for n, s in SHAPES.items()},
                "client_state": jsonable.encode({"note": client}),
            }

        try:
            results[rank] = write_checkpoint(
                save_dir,
                tag,
                rank=rank,
                world_size=world,
                agree=group.agree_for(rank),
                share=group.share_for(rank),
                pieces=pieces,
                extra={"buf": torch.arange(4)} if rank == 0 else None,
                rank_state={"rng": random.Random(rank).getstate()},
                manifest_fields=fields,
                save_latest=save_latest,
            )
        except CheckpointError as err:
            results[rank] = err

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return ref, results


def test_round_trip_every_range_reads_exact_values(tmp_path):
    ref, results = save_threads(tmp_path, "t1")
    assert set(results.values()) == {str(tmp_path / "t1")}
    assert (tmp_path / LATEST).read_text() == "t1\n"
    assert sorted(os.listdir(tmp_path / "t1")) == sorted(
        [MANIFEST] + [shard_file_name(r, 3) for r in range(3)]
    )
    path = resolve_checkpoint(str(tmp_path), None)
    with CheckpointReader(path) as reader:
        assert reader.world_size == 3
        assert reader.shapes == SHAPES
        assert reader.state("client_state") == {"note": "hello"}
        assert reader.rank_state(2)["rng"] == random.Random(2).getstate()
        assert torch.equal(reader.read_extra("buf"), torch.arange(4))
        for name, shape in SHAPES.items():
            n = math.prod(shape)
            for kind in ("param", "exp_avg"):
                assert torch.equal(reader.read_full(name, kind), ref[name][kind].view(shape))
                for lo in range(n + 1):
                    for hi in range(lo, n + 1):
                        assert torch.equal(reader.read(name, kind, lo, hi), ref[name][kind][lo:hi])


def test_a_range_inside_one_shard_opens_only_that_shard(tmp_path):
    save_threads(tmp_path, "t1")
    with CheckpointReader(str(tmp_path / "t1")) as reader:
        reader.read("b.bias", "param", 3, 6)  # entirely in rank 2's piece
        assert list(reader._handles) == [str(tmp_path / "t1" / shard_file_name(2, 3))]
        reader.read("a.weight", "exp_avg", 8, 10)  # straddles ranks 0 and 1
        assert len(reader._handles) == 3


def test_a_failing_rank_commits_nothing_and_keeps_latest(tmp_path):
    save_threads(tmp_path, "good")
    _, results = save_threads(tmp_path, "bad", fail_rank=1)
    assert all(isinstance(r, CheckpointError) for r in results.values())
    assert "rank 1" in str(results[1])
    assert "nothing was committed" in str(results[0])
    assert not (tmp_path / "bad").exists()
    assert (tmp_path / LATEST).read_text() == "good\n"
    # A later save of the same tag cleans the partial directory up and succeeds.
    _, results = save_threads(tmp_path, "bad")
    assert not (tmp_path / ".bad.partial").exists()
    assert (tmp_path / LATEST).read_text() == "bad\n"


def test_save_latest_false_leaves_latest_alone(tmp_path):
    save_threads(tmp_path, "one")
    save_threads(tmp_path, "two", save_latest=False)
    assert (tmp_path / LATEST).read_text() == "one\n"
    assert resolve_checkpoint(str(tmp_path), "two") == str(tmp_path / "two")


def test_a_partial_directory_is_never_a_checkpoint(tmp_path):
    save_threads(tmp_path, "one")
    partial = tmp_path / ".two.partial"
    partial.mkdir()
    (partial / shard_file_name(0, 3)).write_bytes(b"half a shard")
    assert resolve_checkpoint(str(tmp_path), None) == str(tmp_path / "one")
    with pytest.raises(CheckpointError, match="bad checkpoint tag"):
        resolve_checkpoint(str(tmp_path), ".two.partial")
    # A tag directory without a manifest (renamed by hand, say) is refused too.
    (tmp_path / "three").mkdir()
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_checkpoint(str(tmp_path), "three")


def test_missing_latest_is_none_and_latest_naming_a_missing_tag_is_an_error(tmp_path):
    assert resolve_checkpoint(str(tmp_path), None) is None
    (tmp_path / LATEST).write_text("global_step99\n")
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(str(tmp_path), None)
    assert str(tmp_path / LATEST) in str(err.value)
    assert "global_step99" in str(err.value) and "does not exist" in str(err.value)


def test_a_shard_cut_by_one_byte_is_named(tmp_path):
    save_threads(tmp_path, "t1")
    shard = tmp_path / "t1" / shard_file_name(1, 3)
    data = shard.read_bytes()
    shard.write_bytes(data[:-1])
    with pytest.raises(CheckpointError) as err:
        CheckpointReader(str(tmp_path / "t1"))
    assert str(shard) in str(err.value) and "truncated" in str(err.value)


def test_a_corrupt_shard_header_is_named_and_the_checksum_catches_data(tmp_path):
    save_threads(tmp_path, "t1")
    shard = tmp_path / "t1" / shard_file_name(2, 3)
    data = bytearray(shard.read_bytes())
    data[8:16] = b"\xff" * 8  # inside the JSON header, same size
    shard.write_bytes(bytes(data))
    with CheckpointReader(str(tmp_path / "t1")) as reader:
        with pytest.raises(CheckpointError) as err:
            reader.read("b.bias", "param")
    assert str(shard) in str(err.value) and "corrupt" in str(err.value)
    # Flip one byte of tensor data: only the checksum can tell.
    save_threads(tmp_path, "t2")
    shard = tmp_path / "t2" / shard_file_name(0, 3)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    with CheckpointReader(str(tmp_path / "t2")) as reader:
        with pytest.raises(CheckpointError, match="checksum"):
            reader.verify_checksums()
        with pytest.raises(CheckpointError, match="checksum"):  # and on the first read
            reader.read("a.weight", "param")


def test_a_manifest_with_a_wrong_shape_is_named(tmp_path):
    save_threads(tmp_path, "t1")
    path = tmp_path / "t1" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["params"]["a.weight"]["shape"] = [4, 5]
    path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as err:
        CheckpointReader(str(tmp_path / "t1"))
    assert str(path) in str(err.value)
    assert "a.weight has shape [4, 5] (20 elements) but its pieces hold 15" in str(err.value)


def test_a_manifest_that_is_not_json_is_named(tmp_path):
    save_threads(tmp_path, "t1")
    path = tmp_path / "t1" / MANIFEST
    path.write_text(path.read_text()[:-10])
    with pytest.raises(CheckpointError, match="not valid JSON"):
        CheckpointReader(str(tmp_path / "t1"))


def test_json_state_round_trips_exactly():
    rng = random.Random(3)
    value = {
        "python": rng.getstate(),
        "numpy": np.random.RandomState(5).get_state(),
        "torch": torch.get_rng_state(),
        "betas": (0.9, 0.999),
        "by_int": {0: [1.5, float("inf")], 3: None},
        "tagged": {"__tuple__": "a user key that looks like a tag"},
        "nested": [{"x": (1, (2, 3))}],
    }
    back = jsonable.loads(jsonable.dumps(value))
    assert back["python"] == value["python"]
    assert all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        for a, b in zip(back["numpy"], value["numpy"], strict=True)
    )
    assert torch.equal(back["torch"], value["torch"]) and back["torch"].dtype == torch.uint8
    assert back["betas"] == (0.9, 0.999) and isinstance(back["betas"], tuple)
    assert back["by_int"] == {0: [1.5, float("inf")], 3: None}
    assert back["tagged"] == value["tagged"]
    assert back["nested"] == [{"x": (1, (2, 3))}]


def test_non_json_state_names_the_path():
    with pytest.raises(CheckpointError) as err:
        jsonable.encode({"epoch": 3, "loader": {"sampler": object()}}, "client_state")
    assert "client_state['loader']['sampler']" in str(err.value)
    assert "never pickle" in str(err.value)


def test_slow_save_hook_parses_seconds_and_tag(monkeypatch):
    monkeypatch.setenv(SLOW_SAVE_ENV, "1.5@global_step10")
    assert _slow_save_seconds("global_step10") == 1.5
    assert _slow_save_seconds("global_step5") == 0.0
    monkeypatch.setenv(SLOW_SAVE_ENV, "0.25")
    assert _slow_save_seconds("anything") == 0.25
    monkeypatch.setenv(SLOW_SAVE_ENV, "soon")
    with pytest.raises(CheckpointError, match=SLOW_SAVE_ENV):
        _slow_save_seconds("x")


@pytest.mark.parametrize("kind", ["fifo", "symlink", "large", "folder"])
def test_latest_must_be_a_small_regular_file(tmp_path, kind):
    save_threads(tmp_path, "t")
    latest = tmp_path / LATEST
    latest.unlink()
    if kind == "fifo":
        os.mkfifo(latest)  # a read would wait for a writer for ever
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_text("t\n")
        os.symlink(tmp_path / "elsewhere", latest)
    elif kind == "large":
        latest.write_text("t" + " " * 10**6)
    else:
        latest.mkdir()
    with pytest.raises(CheckpointError, match=f"{latest}"):
        resolve_checkpoint(str(tmp_path), None)
