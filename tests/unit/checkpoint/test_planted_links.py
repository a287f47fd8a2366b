"""Links another user plants in a save or output folder are never followed.

Anyone who can write a folder a save or an export writes into can plant a symbolic or hard
link under any name the writer is about to use, to turn the write onto a file of the victim's
elsewhere. Each test first records every name the writer opens, creates or renames while it
runs (at the ``os`` level, whatever module does it), with its random names made repeatable;
then, for each of those names and each kind of link (a symbolic link to the victim's file, one
to the victim's folder, a hard link to the victim's file), it plants the link in a fresh copy of
the folder and runs the writer again: the victim's file and folder stay exactly as they were,
the writer succeeds or fails with one CheckpointError, and ``latest`` is never a link.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import stat

import pytest
import torch

from runtime.checkpoint import CheckpointError
from runtime.checkpoint.export import convert
from runtime.checkpoint.reader import CheckpointReader
from runtime.checkpoint.storage import LATEST
from tests.unit.checkpoint import test_storage as base
from tests.unit.checkpoint.test_save_faults import save_one_rank

PRECIOUS = "the victim's own data\n"
LINKS = ("symlink-file", "symlink-dir", "hardlink-file")


_CALLS = {"open": (0,), "mkdir": (0,), "rename": (0, 1), "replace": (0, 1)}
_CALLS |= {"link": (0, 1), "symlink": (1,), "makedirs": (0,)}


def names_used(write) -> set[str]:
    """Every entry name the ``os`` calls that create or rename entries get while ``write()``
    runs, whatever module makes them."""
    seen: set[str] = set()

    def wrap(real, positions):
        def call(*args, **kwargs):
            for p in positions:
                if p < len(args) and isinstance(args[p], (str, bytes, os.PathLike)):
                    seen.add(os.path.basename(os.fsdecode(args[p])))
            return real(*args, **kwargs)

        return call

    with pytest.MonkeyPatch.context() as patch:
        for name, positions in _CALLS.items():
            patch.setattr(os, name, wrap(getattr(os, name), positions))
        write()
    return seen - {"", ".", ".."}


def repeatable_randomness(monkeypatch):
    """secrets' names made the same in every run of the writer (call again to restart)."""
    counter = itertools.count(1)
    monkeypatch.setattr(secrets, "token_hex", lambda n=16: f"{next(counter):0{2 * n}x}")
    monkeypatch.setattr(secrets, "randbits", lambda k: next(counter) % (1 << k))


class Victim:
    """A file and a folder of the victim's, outside the folder written."""

    def __init__(self, root):
        self.file = root / "victim.txt"
        self.dir = root / "victim-dir"
        self.dir.mkdir()
        self.file.write_text(PRECIOUS)
        (self.dir / "inside.txt").write_text(PRECIOUS)

    def plant(self, kind: str, at) -> None:
        if kind == "symlink-file":
            os.symlink(self.file, at)
        elif kind == "symlink-dir":
            os.symlink(self.dir, at)
        else:
            os.link(self.file, at)

    def untouched(self) -> bool:
        return (
            self.file.read_text() == PRECIOUS
            and stat.S_IMODE(self.file.stat().st_mode) == 0o644
            and sorted(os.listdir(self.dir)) == ["inside.txt"]
            and (self.dir / "inside.txt").read_text() == PRECIOUS
        )


def planted_cases(tmp_path, monkeypatch, write, folders, also=()):
    """Record the names ``write(root)`` uses (and ``also``: names only libc's renameat2 is
    given, through ctypes), then plant each kind of link at each name in each of
    ``folders(root)`` and run ``write`` again; yields (name, kind, root, error)."""
    probe = tmp_path / "probe"
    for folder in folders(probe):
        folder.mkdir(parents=True, exist_ok=True)
    repeatable_randomness(monkeypatch)
    names = names_used(lambda: write(probe)) | set(also)
    assert names, "the writer used no names"
    for i, (name, kind) in enumerate(itertools.product(sorted(names), LINKS)):
        root = tmp_path / f"case{i}"
        root.mkdir()
        victim = Victim(root)
        for folder in folders(root):
            if os.path.lexists(folder) and not (folder.is_dir() and not folder.is_symlink()):
                continue  # planted in its place already: nothing can be planted inside
            folder.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(folder / name):
                victim.plant(kind, folder / name)
        repeatable_randomness(monkeypatch)
        try:
            write(root)
            error = None
        except CheckpointError as err:
            error = err
        assert victim.untouched(), f"a {kind} planted at {name!r} was followed"
        yield name, kind, root, error


def test_no_link_planted_at_any_name_a_save_uses_is_followed(tmp_path, monkeypatch):
    def write(root):
        save_one_rank(root / "save", "t", scale=1.0)
        save_one_rank(root / "save", "t", scale=2.0)  # a re-save: the swap of <tag>

    saved = 0
    cases = planted_cases(
        tmp_path, monkeypatch, write, lambda root: [root / "save"], ["t", ".t.old"]
    )
    for name, kind, root, error in cases:
        latest = root / "save" / LATEST
        if error is None:
            saved += 1
            assert not latest.is_symlink() and latest.read_text() == "t\n", (name, kind)
            with CheckpointReader(str(root / "save" / "t")) as reader:
                assert reader.read("a.weight", "param").numel() == 15
        else:
            assert not latest.is_symlink() or name == LATEST, (name, kind, error)
    assert saved > 0  # most plants do not stop the save; the others fail clearly


def _source(tmp_path) -> str:
    src = tmp_path / "src"
    save_one_rank(src, "t", scale=1.0)
    manifest = src / "t" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["hf_config"] = {"model_type": "llama"}
    manifest.write_text(json.dumps(data))
    return str(src)


@pytest.mark.parametrize("to", ["hf", "safetensors"])
def test_no_link_planted_at_any_name_an_export_uses_is_followed(tmp_path, monkeypatch, to):
    src = _source(tmp_path)
    out_name = "model.safetensors" if to == "safetensors" else "out"

    def write(root):
        out = root / "shared" / out_name
        convert(src, str(out), to, force=True)
        convert(src, str(out), to, force=True)  # over an existing output

    def folders(root):
        shared = root / "shared"
        return [shared] if to == "safetensors" else [shared, shared / out_name]

    exported = 0
    for _, _, root, error in planted_cases(tmp_path, monkeypatch, write, folders, [out_name]):
        out = root / "shared" / out_name
        if error is None:
            exported += 1
            assert not out.is_symlink()
            if to == "hf":
                from safetensors.torch import load_file

                assert set(load_file(out / "model-00001-of-00001.safetensors")) == {
                    "a.weight",
                    "b.bias",
                }
    assert exported > 0


def test_dcp_writes_only_into_its_own_private_folder(tmp_path):
    src = _source(tmp_path)
    victim = Victim(tmp_path)
    out = tmp_path / "shared" / "dcp"
    out.mkdir(parents=True)
    for name in (".metadata.tmp", ".metadata", "__0_0.distcp"):  # DCP's fixed names
        os.symlink(victim.file, out / name)
    convert(src, str(out), "dcp", force=True)
    assert victim.untouched()
    assert stat.S_IMODE(out.stat().st_mode) == 0o755  # the folder replaced keeps its mode
    import torch.distributed.checkpoint as dcp

    state = {"a.weight": torch.zeros(3, 5), "b.bias": torch.zeros(7)}
    dcp.load(state, checkpoint_id=str(out), no_dist=True)
    assert torch.equal(state["b.bias"], base.reference()["b.bias"]["param"])


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_partial_folder_swapped_for_another_users_is_not_written_into(tmp_path):
    from tests.unit.checkpoint.test_save_faults import SharingGroup, save

    group = SharingGroup(3, pause_at=1)  # every rank held once rank 0 made the partial folder
    threads, results = save(tmp_path, "t", group, background=True)
    assert group.paused.wait(30)
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".t.partial-")]
    partial.rename(tmp_path / "moved")
    partial.mkdir(mode=0o700)  # someone else's folder under the name the ranks will open
    os.chown(partial, 4321, 4321)
    group.resume.set()
    for t in threads:
        t.join(30)
    assert all(isinstance(r, CheckpointError) for r in results.values())
    assert "not a private folder of this user (uid 4321" in str(results[1])
    assert os.listdir(partial) == [] and not (tmp_path / LATEST).exists()
