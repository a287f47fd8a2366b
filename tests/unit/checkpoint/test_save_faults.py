"""Concurrent saves, crafted manifests, a
full disk and a crash between renames never give a wrong or missing checkpoint.

Ranks are threads, as in tests/unit/checkpoint/test_storage.py; ``share`` is rank 0's value.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import types

import pytest
import torch

from runtime.checkpoint import CheckpointError, engine_io, storage
from runtime.checkpoint.held_dir import HeldDir
from runtime.checkpoint.reader import CheckpointReader
from runtime.checkpoint.storage import LATEST, MANIFEST, resolve_checkpoint, shard_file_name
from tests.unit.checkpoint import test_storage as base


class SharingGroup(base.ThreadGroup):
    """Thread ranks; ``pause_at`` holds every rank at that agree() call."""

    def __init__(self, n: int, pause_at: int | None = None):
        super().__init__(n)
        self.calls = [0] * n
        self.pause_at = pause_at
        self.paused = threading.Event()
        self.resume = threading.Event()

    def agree_for(self, rank: int):
        inner = super().agree_for(rank)

        def agree(ok: bool) -> bool:
            self.calls[rank] += 1
            if self.calls[rank] == self.pause_at:
                if rank == 0:
                    self.paused.set()
                self.resume.wait(30)
            return inner(ok)

        return agree


def save(save_dir, tag, group=None, *, scale=1.0, background=False):
    """Save the reference state (times ``scale``) with 3 thread ranks; results per rank."""
    ref = base.reference()
    world = len(base.SPLITS)
    group = group or SharingGroup(world)
    results: dict[int, object] = {}

    def rank_main(rank: int) -> None:
        pieces = [
            (p, {k: v[p.offset : p.end] * scale for k, v in ref[p.name].items()})
            for p in base.SPLITS[rank]
        ]
        try:
            results[rank] = storage.write_checkpoint(
                str(save_dir),
                tag,
                rank=rank,
                world_size=world,
                agree=group.agree_for(rank),
                share=group.share_for(rank),
                pieces=pieces,
                rank_state={"r": rank},
                manifest_fields=lambda: {
                    "params": {n: {"shape": list(s)} for n, s in base.SHAPES.items()}
                },
            )
        except CheckpointError as err:
            results[rank] = err

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    if background:
        return threads, results
    for t in threads:
        t.join(30)
    return results


def read_param(path) -> torch.Tensor:
    with CheckpointReader(str(path)) as reader:
        return reader.read_full("a.weight")


# ---------------------------------------------------------------- concurrent saves
def test_a_second_save_into_a_directory_being_saved_to_is_refused(tmp_path):
    slow = SharingGroup(3, pause_at=2)  # held after the partial folder exists
    threads, first = save(tmp_path, "t", slow, background=True)
    assert slow.paused.wait(30)
    partials = [n for n in os.listdir(tmp_path) if n.startswith(".t.partial-")]
    assert len(partials) == 1  # one folder, named by a token every rank shares
    second = save(tmp_path, "t", scale=2.0)
    assert all(isinstance(r, CheckpointError) for r in second.values())
    assert "another save into" in str(second[0])
    assert os.listdir(tmp_path).count(partials[0]) == 1  # the first save's folder is intact
    slow.resume.set()
    for t in threads:
        t.join(30)
    assert set(first.values()) == {str(tmp_path / "t")}
    assert torch.equal(read_param(tmp_path / "t"), base.reference()["a.weight"]["param"].view(3, 5))


def test_a_shard_from_another_save_is_caught_by_its_crc_on_load(tmp_path):
    save(tmp_path / "a", "t")
    save(tmp_path / "b", "t", scale=2.0)
    name = shard_file_name(0, 3)
    (tmp_path / "a" / "t" / name).write_bytes((tmp_path / "b" / "t" / name).read_bytes())
    with CheckpointReader(str(tmp_path / "a" / "t")) as reader:
        with pytest.raises(CheckpointError, match="checksum"):
            reader.read("a.weight", "param")


# ---------------------------------------------------------------- crafted manifests
def _crafted(tmp_path, change) -> str:
    save(tmp_path, "t")
    path = tmp_path / "t" / MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    return str(tmp_path / "t")


@pytest.mark.parametrize("name", ["../t/" + shard_file_name(0, 3), "/etc/passwd", "a/b", "..", ""])
def test_shard_names_are_confined_to_the_checkpoint_folder(tmp_path, name):
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(b"x")

    def change(m):
        m["shards"][0]["file"] = name

    with pytest.raises(CheckpointError, match="plain file name|outside"):
        CheckpointReader(_crafted(tmp_path, change))


def test_a_shard_that_links_outside_is_refused(tmp_path):
    path = _crafted(tmp_path, lambda m: None)
    shard = os.path.join(path, shard_file_name(1, 3))
    os.rename(shard, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", shard)
    with pytest.raises(CheckpointError, match="outside"):
        CheckpointReader(path)


CRAFTED = {
    "piece offset is text": lambda m: m["shards"][0]["pieces"][0].__setitem__(1, "0"),
    "piece is a number": lambda m: m["shards"][0]["pieces"].__setitem__(0, 5),
    "extra is a number": lambda m: m["shards"][0].__setitem__("extra", {"x": 5}),
    "kind dtype unknown": lambda m: m.__setitem__("kinds", {"param": "Tensor"}),
    "params a list": lambda m: m.__setitem__("params", [1]),
    "shards not records": lambda m: m.__setitem__("shards", [1, 2, 3]),
    "claims 2**40 elements": lambda m: (
        m["params"].__setitem__("a.weight", {"shape": [2**40]}),
        m["shards"][0]["pieces"].__setitem__(0, ["a.weight", 0, 9]),
        m["shards"][1]["pieces"].__setitem__(0, ["a.weight", 9, 2**40 - 9]),
    ),
}


@pytest.mark.parametrize("change", list(CRAFTED.values()), ids=list(CRAFTED))
def test_crafted_manifests_raise_only_checkpoint_errors_before_allocating(tmp_path, change):
    with pytest.raises(CheckpointError):
        with CheckpointReader(_crafted(tmp_path, change)) as reader:
            reader.read_full("a.weight")


def test_deeply_nested_state_is_a_checkpoint_error(tmp_path):
    path = _crafted(tmp_path, lambda m: None)
    manifest = (tmp_path / "t" / MANIFEST).read_text()
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "t" / MANIFEST).write_text(manifest[:-1] + f', "client_state": {deep}}}')
    with pytest.raises(CheckpointError, match="malformed"):
        CheckpointReader(path)


def test_a_load_failing_with_any_error_still_reaches_the_agreement(tmp_path, monkeypatch):
    save(tmp_path, "t")
    calls = []
    engine = types.SimpleNamespace(
        device="cpu",
        comm=types.SimpleNamespace(all_reduce=lambda t: calls.append(t), rank=0),
        checkpoint_saver=types.SimpleNamespace(wait=lambda: None),  # no save in flight
    )

    def broken(path):
        raise TypeError("crafted")

    monkeypatch.setattr(engine_io, "open_checkpoint", broken)  # whatever the format
    with pytest.raises(CheckpointError, match="TypeError: crafted"):
        engine_io.load_engine(engine, str(tmp_path))
    assert len(calls) == 1  # the other ranks are told, not left waiting


# ---------------------------------------------------------------- full disk, crash


def test_a_crash_between_the_two_renames_of_a_resave_keeps_latest_loadable(tmp_path, monkeypatch):
    save(tmp_path, "t")
    # A file system without an atomic exchange: the re-save renames twice.
    monkeypatch.setattr(HeldDir, "exchange", lambda self, a, b: False)
    real_rename = HeldDir.rename_new

    def crash_on_second(self, src, dst):
        if ".partial" in str(src):
            raise KeyboardInterrupt  # the process dies between the renames
        real_rename(self, src, dst)

    monkeypatch.setattr(HeldDir, "rename_new", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        save_one_rank(tmp_path, "t", scale=2.0)
    monkeypatch.setattr(HeldDir, "rename_new", real_rename)
    assert not (tmp_path / "t").exists()
    path = resolve_checkpoint(str(tmp_path), None)  # latest names "t": the old copy serves
    assert path == str(tmp_path / ".t.old")
    assert torch.equal(read_param(path), base.reference()["a.weight"]["param"].view(3, 5))
    # The next save puts the old copy back first, then replaces it.
    save(tmp_path, "t", scale=3.0)
    assert sorted(os.listdir(tmp_path)) == sorted([storage.LOCK_FILE, LATEST, "t"])
    expected = base.reference()["a.weight"]["param"].view(3, 5) * 3
    assert torch.equal(read_param(resolve_checkpoint(str(tmp_path), None)), expected)


def test_a_resave_swaps_in_one_step_where_the_file_system_can(tmp_path):
    save(tmp_path, "t")
    save(tmp_path, "t", scale=2.0)
    assert sorted(os.listdir(tmp_path)) == sorted([storage.LOCK_FILE, LATEST, "t"])
    expected = base.reference()["a.weight"]["param"].view(3, 5) * 2
    assert torch.equal(read_param(tmp_path / "t"), expected)


def save_one_rank(save_dir, tag, *, scale):
    """A one-rank save of every piece (no threads: an exception reaches the caller)."""
    ref = base.reference()
    pieces = [
        (storage.Piece(n, 0, v["param"].numel()), {k: t * scale for k, t in v.items()})
        for n, v in ref.items()
    ]
    return storage.write_checkpoint(
        str(save_dir),
        tag,
        rank=0,
        world_size=1,
        agree=lambda ok: ok,
        pieces=pieces,
        manifest_fields=lambda: {"params": {n: {"shape": list(s)} for n, s in base.SHAPES.items()}},
    )


# ---------------------------------------------------------------- private files
def test_checkpoint_folders_are_0700_and_files_0600(tmp_path):
    save(tmp_path / "ck", "t")
    for root, dirs, files in os.walk(tmp_path / "ck"):
        for name in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode) == 0o700
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(tmp_path / "ck").st_mode) == 0o700
