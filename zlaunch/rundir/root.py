"""Where a run directory may be created, and how its files are written (stdlib only).

The log root (``./zlaunch_runs`` or ``--log-dir``) is often in a shared place: a project
directory, ``/tmp``. Rank logs hold whatever the job prints, so a root another user can write
to lets them read those lines or plant links that turn the job's writes onto files of the
user's own. Hence:

* the root must be owned by the user and writable by nobody else (created 0700 when missing);
  any other root is refused with the fix;
* the root is opened once, checked through that descriptor (no swap between check and use),
  and the run directory is created and then held by descriptor: every file in it is opened
  relative to it with ``O_NOFOLLOW``, and every temporary file with ``O_EXCL``, so no link
  planted by anyone redirects a write.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from typing import Any

from zlaunch.errors import UsageError

__all__ = [
    "LogRootError",
    "open_log_root",
    "make_private_dir",
    "open_private_file",
    "write_json_atomic",
    "write_text_atomic",
    "json_text",
    "read_json_at",
    "temp_name",
    "PRIVATE_DIR",
    "PRIVATE_FILE",
]

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LogRootError(UsageError):
    """The log root is not the user's alone: refused, with where to put runs instead."""


def open_log_root(root: str) -> int:
    """A descriptor of the log root ``root`` (created private when missing), checked to be
    owned by this user and writable by no one else; LogRootError otherwise."""
    hint = "use --log-dir with a directory of your own, e.g. --log-dir ~/zlaunch_runs"
    try:
        os.makedirs(root, mode=PRIVATE_DIR, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # a link to it is fine
    except OSError as err:
        raise LogRootError(f"cannot use log directory {root}: {err.strerror}", hint=hint) from None
    info = os.fstat(fd)
    problem = None
    if info.st_uid != os.geteuid():
        problem = f"is owned by another user (uid {info.st_uid})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"can be written by others (mode {stat.S_IMODE(info.st_mode):o})"
        if info.st_mode & stat.S_ISVTX:  # /tmp: a directory of one's own beneath it is safe
            private = os.path.join(root, f"zlaunch-{_user()}")
            hint = f"use a private directory beneath it: --log-dir {private}"
        else:
            hint = f"chmod go-w {root}, or {hint}"
    if problem is not None:
        os.close(fd)
        raise LogRootError(
            f"log directory {root} {problem}: its runs' logs could be read or redirected",
            hint=hint,
        )
    return fd


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def make_private_dir(parent_fd: int, name: str, exist_ok: bool = False) -> int:
    """Create directory ``name`` (0700) under ``parent_fd`` and return a descriptor of it,
    never following a link in its place."""
    try:
        os.mkdir(name, PRIVATE_DIR, dir_fd=parent_fd)
    except FileExistsError:
        if not exist_ok:
            raise
    return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def open_private_file(dir_fd: int, name: str, flags: int) -> int:
    """Open (create 0600) ``name`` under ``dir_fd``; a link in its place is an error (ELOOP)."""
    return os.open(
        name, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE, dir_fd=dir_fd
    )


def write_json_atomic(dir_fd: int, name: str, data: Any, *, levels: int = 3) -> None:
    """``name`` under ``dir_fd`` replaced by ``data`` as JSON at once: a reader never sees
    half a file, and the temporary file is always a new one of ours (O_EXCL). The outer
    ``levels`` are laid out one item a line, what is deeper on the item's line."""
    write_text_atomic(dir_fd, name, json_text(data, levels) + "\n")


def json_text(data: Any, levels: int = 3, depth: int = 0) -> str:
    """``data`` as JSON, indented 2 for its outer ``levels`` and compact below them.

    ``json.dumps(indent=2)`` goes through json's pure-Python encoder; run.json holds the plan
    (every rank) and ranks.json a row per rank, and at 16,384 ranks an indented dump took the
    controller seconds per write. Compact parts are written by json's C encoder."""
    if depth >= levels or not isinstance(data, (dict, list)) or not data:
        return json.dumps(data)
    if isinstance(data, dict) and not all(isinstance(key, str) for key in data):
        return json.dumps(data)  # json's own key conversion (int keys) where it matters
    pad, end = "  " * (depth + 1), "  " * depth
    if isinstance(data, dict):
        items = [
            f"{pad}{json.dumps(k)}: {json_text(v, levels, depth + 1)}" for k, v in data.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{end}}}"
    items = [f"{pad}{json_text(v, levels, depth + 1)}" for v in data]
    return "[\n" + ",\n".join(items) + f"\n{end}]"


def write_text_atomic(dir_fd: int, name: str, text: str) -> None:
    """``name`` under ``dir_fd`` replaced by ``text`` at once (see `write_json_atomic`)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for attempt in range(3):
        tmp = temp_name(name)
        try:
            fd = os.open(tmp, flags, PRIVATE_FILE, dir_fd=dir_fd)
            break
        except FileExistsError:  # someone guessed it: never reused, another name is drawn
            if attempt == 2:
                raise
    try:
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def temp_name(name: str) -> str:
    """``<name>.tmp.<16 hex digits>``: a temporary name nobody can guess and plant at first
    (a pid can be read from /proc), and that readers of the folder know to skip."""
    return f"{name}.tmp.{secrets.token_hex(8)}"


def read_json_at(dir_fd: int, name: str) -> Any:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with open(fd, encoding="utf-8") as handle:
        return json.load(handle)
