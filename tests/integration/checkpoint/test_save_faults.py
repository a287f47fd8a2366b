"""Concurrent saves, crafted manifests, a
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
from tests.unit.checkpoint.test_save_faults import save  # shared with the unit half

# ---------------------------------------------------------------- concurrent saves


def test_the_save_lock_is_freed_when_its_holder_dies(tmp_path):
    # -o: the lock's file stays with flock alone, not with its sleep child, so once flock is
    # reaped the lock is free (a killed sleep could otherwise hold it a moment longer).
    holder = subprocess.Popen(
        ["flock", "-o", str(tmp_path / storage.LOCK_FILE), "sleep", "30"], start_new_session=True
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


# ---------------------------------------------------------------- crafted manifests


# ---------------------------------------------------------------- full disk, crash
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


# ---------------------------------------------------------------- private files
