"""The checkpoint a job's ranks saved last, as the launcher tells it: the tag its save
folder's ``latest`` names.

The save folder may be shared with other users, so ``latest`` is read only when it is a small
regular file, through no link: a FIFO planted there is never waited on (the controller would
hang after the job) and a device is never read until memory runs out."""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["latest_tag", "MAX_LATEST_BYTES"]

MAX_LATEST_BYTES = 4096  # a tag; the runtime refuses a longer ``latest`` too


def latest_tag(directory: str) -> tuple[str | None, str]:
    """``(tag, why)``: the tag ``directory/latest`` names, or None and why there is none."""
    path = os.path.join(directory, "latest")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, "no 'latest' file"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return None, f"{path} is a symbolic link, not the file a save writes"
        return None, f"cannot read {path}: {err.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, f"{path} is not a regular file"
        if info.st_size > MAX_LATEST_BYTES:
            return None, f"{path} holds {info.st_size} bytes, not a tag"
        text = os.read(fd, MAX_LATEST_BYTES + 1).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    if not text or "\n" in text or "/" in text or text in (".", ".."):
        return None, f"{path} names no checkpoint ({text[:60]!r})"
    return text, ""
