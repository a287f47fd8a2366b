"""Issue 13 items 10-12 (and 7's checkpoint modes): concurrent saves, crafted manifests, a
full disk and a crash between renames never give a wrong or missing checkpoint.

Ranks are threads, as in tests/unit/checkpoint/test_storage.py; ``share`` is rank 0's value.
"""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from runtime.checkpoint import CheckpointError, storage
from runtime.checkpoint.storage import LATEST
from tests.unit.checkpoint import test_storage as base


class SharingGroup(base.ThreadGroup):
    """Thread ranks with ``share`` too; ``pause_at`` holds every rank at that agree() call."""

    def __init__(self, n: int, pause_at: int | None = None):
        super().__init__(n)
        self.value = 0
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

    def share_for(self, rank: int):
        def share(value: int) -> int:
            if rank == 0:
                self.value = value
            self.barrier.wait()
            result = self.value
            self.barrier.wait()
            return result

        return share


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


# ---------------------------------------------------------------- item 10: concurrent saves


def test_the_save_lock_is_freed_when_its_holder_dies(tmp_path):
    holder = subprocess.Popen(
        ["flock", str(tmp_path / storage.LOCK_FILE), "sleep", "30"], start_new_session=True
    )
    try:
        deadline = 50
        while not (tmp_path / storage.LOCK_FILE).exists() and deadline:
            threading.Event().wait(0.1)
            deadline -= 1
        assert isinstance(save(tmp_path, "t")[0], CheckpointError)
    finally:
        os.killpg(holder.pid, 9)
        holder.wait()
    assert save(tmp_path, "t")[0] == str(tmp_path / "t")


# ---------------------------------------------------------------- item 11: crafted manifests


# ---------------------------------------------------------------- item 12: full disk, crash
@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs (root only)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_save_that_fills_the_disk_leaves_nothing_behind(small_fs):
    assert save(small_fs / "ck", "good")[0] == str(small_fs / "ck" / "good")
    filler = small_fs / "filler"
    with open(filler, "wb", buffering=0) as f:  # fill the disk up
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    for _ in range(3):  # repeated failures never pile up partial folders
        results = save(small_fs / "ck", "bad")
        assert all(isinstance(r, CheckpointError) for r in results.values())
        leftovers = [n for n in os.listdir(small_fs / "ck") if "partial" in n]
        assert leftovers == []
    assert (small_fs / "ck" / LATEST).read_text() == "good\n"
    filler.unlink()
    assert save(small_fs / "ck", "bad")[0] == str(small_fs / "ck" / "bad")


# ---------------------------------------------------------------- item 7: private files
