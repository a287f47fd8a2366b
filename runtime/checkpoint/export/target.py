"""Where an export is written: a private folder beside the output, switched in when complete.

An export may go into a folder that already holds a model, or that others can write to.
Written in place, an export killed half-way would leave a folder that loads without error
with some tensors new and the rest old, and every file opened by name could be a link planted
by someone else. Instead:

* the output's parent is held by descriptor (`HeldDir`), and the export is built in a new
  private folder there, ``.<name>.partial-<random>`` (0700, checked ours before a byte is
  written), whose descriptor every writer uses;
* only when every file is written and synced is it put in place, by one rename: where nothing
  stood, a rename that never replaces; over an existing folder, an atomic exchange, after which
  the old folder is removed. A kill at any moment leaves the old output as it was or the new
  one whole, never a mix. A crashed export's partial folder is removed by the next export to
  the same output (each export holds a lock on its own, so one still running is left alone);
* an output that holds anything is replaced only with ``force``: the export's own kinds of
  files go, every other entry (a tokenizer, a README, a folder) is carried into the new folder
  first, by hard link (a copy where a link is refused), so nothing else of the user's is lost;
* a single-file output is written under a random temporary name in the parent and renamed
  over the old file only once complete (`file_output`).

An output that is a symbolic link is refused: replacing the link would lose where it points,
and following it would let whoever can write the parent choose what is replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
from collections.abc import Iterator

from ..errors import CheckpointError
from ..held_dir import HeldDir, owned_by_us, temp_name

__all__ = ["folder_output", "file_output", "check_output", "HF_OWN", "DCP_OWN"]

HF_OWN = re.compile(
    r"(pytorch_model|model|tf_model|flax_model)(-\d+-of-\d+)?\.(bin|safetensors|h5|msgpack)"
    r"(\.index\.json)?|config\.json|generation_config\.json"
)
"""What a Hugging Face model folder's weights and config are: replaced by an export, never
carried over (a stale ``model.safetensors`` would be loaded instead of the new shards)."""
DCP_OWN = re.compile(r".*\.distcp|.*\.metadata(\.tmp)?")
"""A torch distributed checkpoint's own files."""
FOLDER_FORCED = (
    "replace it (the new folder is switched in once complete; files that are not the "
    "export's own, a tokenizer say, are kept)"
)


def check_output(dst: str, force: bool, forced: str, *, follow: bool = False) -> list[str]:
    """Refuse an output that holds anything unless ``force`` (``forced``: what --force would
    do, for the message), and one that is a link unless ``follow``. Returns the entries it
    holds (a file output: its own name when it exists)."""
    if os.path.islink(dst) and not follow:
        raise CheckpointError(
            f"-o {dst} is a symbolic link (to {os.readlink(dst)}); give the path it leads to "
            "instead: the output is replaced whole, and a link would be replaced, not followed"
        )
    if not os.path.lexists(dst):
        return []
    if not os.path.isdir(dst):
        if not force:
            raise CheckpointError(
                f"-o {dst} already exists; pass --force to {forced}, or give a new output"
            )
        return [os.path.basename(dst)]
    held = sorted(os.listdir(dst))
    if held and not force:
        shown = ", ".join(held[:6]) + (f" and {len(held) - 6} more" if len(held) > 6 else "")
        raise CheckpointError(
            f"-o {dst} already holds {shown}; pass --force to {forced}, or give a new or "
            "empty folder"
        )
    return held


@contextlib.contextmanager
def folder_output(dst: str, own: re.Pattern, force: bool) -> Iterator[HeldDir]:
    """``with folder_output(dst, own, force) as folder:`` write the export into ``folder``; on
    leaving without an error it replaces ``dst`` whole (entries of an old ``dst`` that do not
    match ``own`` carried over), on an error ``dst`` is left as it was."""
    dst = os.path.abspath(dst)
    check_output(dst, force, FOLDER_FORCED)
    if os.path.lexists(dst) and not os.path.isdir(dst):
        raise CheckpointError(f"-o {dst} is a file; this output is a folder: give a folder name")
    parent, name = os.path.dirname(dst), os.path.basename(dst)
    try:
        os.makedirs(parent, exist_ok=True)
        root = HeldDir.open(parent)
    except OSError as err:
        raise CheckpointError(f"cannot write {dst}: {err.strerror or err}") from None
    partial = None
    try:
        _remove_stale(root, name)
        staging = temp_name(name, "partial")
        partial = root.make_private(staging)
        fcntl.flock(partial.fd, fcntl.LOCK_EX)  # in progress: the next export leaves it alone
        yield partial
        _switch(root, partial, staging, name, own, force)
    except OSError as err:
        raise CheckpointError(f"cannot write {dst}: {os_reason(err)}") from None
    finally:
        if partial is not None:
            root.discard(partial_name(partial))  # an export that failed, or the old folder
            partial.close()
        root.close()


def partial_name(partial: HeldDir) -> str:
    return os.path.basename(partial.path)


def os_reason(err: OSError) -> str:
    if err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return str(err)


def _switch(root: HeldDir, partial: HeldDir, staging: str, name: str, own, force: bool) -> None:
    """Put the complete export in place of ``name`` in one rename (see the module's text)."""
    partial.sync()
    info = root.lstat(name)
    if info is None:
        root.rename_new(staging, name)
        root.sync()
        return
    if not stat.S_ISDIR(info.st_mode):
        raise CheckpointError(f"{os.path.join(root.path, name)} is not a folder")
    with root.subdir(name) as old:
        if old.names() and not force:  # something arrived while the export ran
            check_output(old.path, force, FOLDER_FORCED)
        _carry(old, partial, own)
        os.fchmod(partial.fd, stat.S_IMODE(info.st_mode))  # the folder keeps its mode
        if root.exchange(staging, name):
            swapped = staging  # the old folder now stands at the partial folder's name
        else:  # no atomic exchange here: two renames (a crash between leaves .<name>.old-*)
            swapped = temp_name(name, "old")
            root.rename(name, swapped)
            root.rename_new(staging, name)
        root.sync()
        with root.subdir(name) as new:
            _carry_late(old, new, own)  # what appeared in the old folder meanwhile
    root.discard(swapped)


def _carry(old: HeldDir, new: HeldDir, own: re.Pattern) -> None:
    """Every entry of ``old`` that is not the export's own, into ``new`` (hard links)."""
    for entry in sorted(old.names()):
        if own.fullmatch(entry) or new.lstat(entry) is not None:
            continue
        _link_tree(old, new, entry)


def _carry_late(old: HeldDir, new: HeldDir, own: re.Pattern) -> None:
    """After the switch: what is in ``old`` (no longer visible) and not in ``new`` moves."""
    for entry in old.names():
        if not own.fullmatch(entry) and new.lstat(entry) is None:
            os.rename(entry, entry, src_dir_fd=old.fd, dst_dir_fd=new.fd)


def _link_tree(src: HeldDir, dst: HeldDir, name: str) -> None:
    info = src.lstat(name)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        os.mkdir(name, stat.S_IMODE(info.st_mode) | 0o700, dir_fd=dst.fd)
        with src.subdir(name) as inner_src, dst.subdir(name) as inner_dst:
            for entry in inner_src.names():
                _link_tree(inner_src, inner_dst, entry)
        dst.chmod(name, stat.S_IMODE(info.st_mode))
        return
    try:  # the same inode: no bytes copied, nothing of the user's changed
        os.link(name, name, src_dir_fd=src.fd, dst_dir_fd=dst.fd, follow_symlinks=False)
        return
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EACCES, errno.EMLINK, errno.EXDEV):
            raise
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(name, dir_fd=src.fd), name, dir_fd=dst.fd)
    elif stat.S_ISREG(info.st_mode):
        _copy_file(src, dst, name, stat.S_IMODE(info.st_mode))
    else:
        raise CheckpointError(
            f"{os.path.join(src.path, name)} cannot be carried into the new output (not a "
            "file, folder or link, and it cannot be linked); move it away and convert again"
        )


def _copy_file(src: HeldDir, dst: HeldDir, name: str, mode: int) -> None:
    fd_in = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src.fd)
    try:
        fd_out = dst.create(name, mode)
        try:
            with open(fd_in, "rb", closefd=False) as f_in, open(fd_out, "wb", closefd=False) as f:
                shutil.copyfileobj(f_in, f, 1 << 20)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def _remove_stale(root: HeldDir, name: str) -> None:
    """What crashed exports to ``name`` left: partial folders and temporary files no export
    holds locked any more, of this user, never through a link. A ``.<name>.old-*`` folder is
    the only copy when ``name`` is missing (a crash between two renames): put back."""
    for entry in root.names():
        if not entry.startswith(f".{name}."):
            continue
        info = root.lstat(entry)
        if info is None or not owned_by_us(info.st_uid) or stat.S_ISLNK(info.st_mode):
            continue
        kind = entry[len(name) + 2 :].partition("-")[0]
        if kind == "old" and stat.S_ISDIR(info.st_mode) and root.lstat(name) is None:
            root.rename_new(entry, name)
        elif kind in ("partial", "tmp", "old") and _unlocked(root, entry):
            root.remove(entry)


def _unlocked(root: HeldDir, entry: str) -> bool:
    """Whether no export holds ``entry`` (a folder or file) locked right now."""
    try:
        fd = os.open(
            entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root.fd
        )
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_output(dst: str, force: bool) -> Iterator[tuple[HeldDir, str]]:
    """``with file_output(dst, force) as (folder, name):`` write the file ``name`` in
    ``folder`` (a `SafetensorsStream` does: temporary name, locked, renamed when complete)."""
    dst = os.path.abspath(dst)
    if os.path.isdir(dst) and not os.path.islink(dst):
        raise CheckpointError(f"{dst} is a directory; give a file name, e.g. model.safetensors")
    check_output(dst, force, "replace the file (the new one is renamed over it once complete)")
    parent, name = os.path.dirname(dst), os.path.basename(dst)
    if not os.path.isdir(parent):
        raise CheckpointError(f"cannot write {dst}: {parent} is not a directory")
    with HeldDir.open(parent) as root:
        _remove_stale(root, name)
        yield root, name
