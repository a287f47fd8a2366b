"""A folder held by descriptor, for writing where another user may write too.

Save and export folders are often shared: a project directory, a group-writable scratch
space. Anyone who can write there can plant a symbolic or hard link under a name the writer
is about to open; a plain ``open(O_CREAT|O_TRUNC)`` then truncates and overwrites the file the
link leads to, with the writer's rights, and the rename that follows puts the link itself where
the file should be. Every file this runtime writes into such a folder goes through a `HeldDir`:

* the folder is opened once and everything below is named relative to that descriptor
  (``openat``, ``mkdirat``, ``renameat``): a folder renamed or swapped for a link afterwards
  does not move the writes;
* a file is created with ``O_CREAT|O_EXCL|O_NOFOLLOW``: always a new inode of our own, never
  through a link (a planted hard link is an existing name, so ``O_EXCL`` refuses it too);
* a temporary name carries 64 random bits, so nobody can plant at it beforehand;
* a file is put in place by a rename relative to the same descriptor, which replaces the name
  (a link planted there included) and never what it leads to;
* a private folder we create is checked after opening (ours, writable by us alone) before
  anything is written into it, so nobody else can have placed a name inside.

Linux only where it matters (``renameat2``, ``/proc/self/fd``), with plain fallbacks.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import stat

__all__ = ["HeldDir", "PRIVATE_DIR", "PRIVATE_FILE", "owned_by_us", "temp_name"]

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def temp_name(name: str, kind: str = "tmp") -> str:
    """``.<name>.<kind>-<16 hex digits>``: hidden, tied to ``name``, and not guessable."""
    return f".{name}.{kind}-{secrets.token_hex(8)}"


class HeldDir:
    """One open folder; every method names entries relative to it and never follows a link
    in the entry's place. Close it (or use ``with``) when done."""

    def __init__(self, fd: int, path: str):
        self.fd = fd
        self.path = path
        """The folder's path when it was opened, for messages (the descriptor is the truth)."""

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str, *, create: bool = False, mode: int = PRIVATE_DIR) -> HeldDir:
        """The folder ``path`` (created with ``mode`` when missing and ``create``). A link
        in ``path`` itself is followed: the user named it."""
        path = os.path.abspath(path)
        if create:
            os.makedirs(path, mode=mode, exist_ok=True)
        return cls(os.open(path, _DIR_FLAGS), path)

    def subdir(self, name: str, *, private: bool = False) -> HeldDir:
        """The folder ``name`` below; a link in its place is an error (ELOOP or ENOTDIR).
        With ``private``, it must be ours and writable by nobody else."""
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        if private:
            info = os.fstat(fd)
            if not owned_by_us(info.st_uid) or info.st_mode & 0o077:
                os.close(fd)
                raise PermissionError(
                    errno.EPERM,
                    f"not a private folder of this user (uid {info.st_uid}, mode "
                    f"{stat.S_IMODE(info.st_mode):o}): something replaced it",
                    os.path.join(self.path, name),
                )
        return HeldDir(fd, os.path.join(self.path, name))

    def make_private(self, name: str) -> HeldDir:
        """Create folder ``name`` (0700) below and hold it; an existing name is an error."""
        os.mkdir(name, PRIVATE_DIR, dir_fd=self.fd)
        return self.subdir(name, private=True)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> HeldDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def os_path(self) -> str:
        """A path that reaches this very folder for code that only takes paths (a library's
        writer): ``/proc/self/fd/N`` where there is one, else the path it was opened by."""
        proc = f"/proc/self/fd/{self.fd}"
        return proc if os.path.isdir(proc) else self.path

    # ------------------------------------------------------------------ entries
    def lstat(self, name: str) -> os.stat_result | None:
        """The entry itself (a link as a link), or None when there is none."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def create(self, name: str, mode: int = PRIVATE_FILE) -> int:
        """A new file ``name``, open for writing: never an existing one, never via a link."""
        return os.open(name, _NEW_FILE, mode, dir_fd=self.fd)

    def write(self, name: str, data: bytes | memoryview, *, sync: bool = True) -> None:
        """A new file ``name`` holding ``data`` (fsync'd unless ``sync=False``)."""
        fd = self.create(name)
        try:
            with open(fd, "wb", closefd=False) as f:
                f.write(data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def replace(self, name: str, data: bytes) -> None:
        """``name`` replaced by a file holding ``data`` at once: readers see the old content
        or the new, never a mix, and whatever stood at ``name`` (a link too) is replaced, not
        written through."""
        tmp = temp_name(name)
        try:
            self.write(tmp, data)
            self.rename(tmp, name)
        except BaseException:
            self.remove(tmp)
            raise
        self.sync()

    def read(self, name: str, limit: int) -> bytes:
        """The content of the regular file ``name``, refused when it is a link, not a
        regular file (a FIFO is never waited on) or larger than ``limit`` bytes."""
        fd = os.open(
            name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd
        )
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", os.path.join(self.path, name))
            if info.st_size > limit:
                raise OSError(errno.EFBIG, f"{info.st_size} bytes, more than {limit}", name)
            return os.read(fd, limit + 1)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        """``src`` renamed to ``dst``, both in this folder (an existing file ``dst`` goes)."""
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def rename_new(self, src: str, dst: str) -> None:
        """``src`` renamed to ``dst`` only if ``dst`` does not exist (FileExistsError)."""
        if not self._renameat2(src, dst, _RENAME_NOREPLACE):
            if self.lstat(dst) is not None:  # no renameat2: check, then rename (a window)
                raise FileExistsError(errno.EEXIST, "exists", os.path.join(self.path, dst))
            self.rename(src, dst)

    def exchange(self, a: str, b: str) -> bool:
        """Swap entries ``a`` and ``b`` in one step; False where the file system cannot."""
        return self._renameat2(a, b, _RENAME_EXCHANGE)

    def _renameat2(self, src: str, dst: str, flags: int) -> bool:
        call = _renameat2()
        if call is None:
            return False
        if call(self.fd, os.fsencode(src), self.fd, os.fsencode(dst), flags) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return False  # this file system (or kernel) cannot: the caller falls back
        raise OSError(err, os.strerror(err), os.path.join(self.path, src))

    def remove(self, name: str) -> None:
        """Remove entry ``name``: a folder with everything in it, a file, or a link itself
        (never what a link leads to). Nothing there is fine."""
        info = self.lstat(name)
        if info is None:
            return
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=self.fd)  # descriptor-based: follows no link inside
        else:
            os.unlink(name, dir_fd=self.fd)

    def discard(self, name: str) -> None:
        """Remove what stands at one of our own names (our temporary folder, or what a swap
        put there), quietly: a link or file goes (the name only, never its target), a folder
        only when it is ours, since its content is not someone else's to lose."""
        try:
            info = self.lstat(name)
            if info is not None and (not stat.S_ISDIR(info.st_mode) or owned_by_us(info.st_uid)):
                self.remove(name)
        except OSError:
            pass  # what is left, the next save or export's clean-up finds

    def chmod(self, name: str, mode: int) -> None:
        os.chmod(name, mode, dir_fd=self.fd, follow_symlinks=False)

    def sync(self) -> None:
        """fsync the folder: its renames and new names reach the disk."""
        os.fsync(self.fd)


def owned_by_us(uid: int) -> bool:
    """Whether an entry owned by ``uid`` is one this process made. Root's files on an NFS
    export with root_squash belong to the anonymous user (65534 by default): still ours."""
    euid = os.geteuid()
    return uid == euid or (euid == 0 and uid == _ANONYMOUS_UID)


_ANONYMOUS_UID = 65534
_RENAMEAT2: list = []


def _renameat2():
    """libc's renameat2, or None (looked up once)."""
    if not _RENAMEAT2:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _RENAMEAT2.append(getattr(libc, "renameat2", None))
        except OSError:
            _RENAMEAT2.append(None)
    return _RENAMEAT2[0]
