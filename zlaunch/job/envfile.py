"""The environment the controller hands to every worker.

Sources, lowest precedence first (a later source overrides an earlier one, name by name):

1. Forwarded from the controller's own environment: PATH, LD_LIBRARY_PATH, PYTHONPATH,
   VIRTUAL_ENV and every name starting with NCCL_, GLOO_, TORCH_, CUDA_, OMP_, PYTHON or HF_.
2. `~/.deepspeed_env`, then `~/.zlaunch_env` (home directory).
3. `./.deepspeed_env`, then `./.zlaunch_env` (the directory zlaunch is started from):
   the project's files beat the user's, and zlaunch's own file beats DeepSpeed's.
4. `--env KEY=VALUE` (or `--env KEY`, which copies KEY from the controller's environment and is
   an error when KEY is unset), in command-line order.

Env files hold `KEY=VALUE` lines, with blank lines, `#` comment lines, an optional `export `
prefix and an optional trailing ` # comment` after unquoted values. Values are taken
literally: nothing is expanded or executed (`$(cmd)` stays `$(cmd)`). Quoting:
`'single'` keeps everything but `\\'` and `\\\\`; `"double"` understands `\\n \\t \\r \\" \\\\
\\$` and may span lines. Values travel to the nodes in the agent's stdin spec, never in a
command line, so they arrive byte-for-byte.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping

from zlaunch.errors import UsageError
from zlaunch.text import clip

__all__ = [
    "FORWARDED_NAMES",
    "FORWARDED_PREFIXES",
    "ENV_FILE_NAMES",
    "forwarded_env",
    "parse_env_text",
    "load_env_file",
    "check_env_file_owner",
    "env_file_paths",
    "parse_env_options",
    "collect_env",
]

FORWARDED_NAMES = frozenset({"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV"})
FORWARDED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "OMP_", "PYTHON", "HF_")
# In increasing precedence within one directory.
ENV_FILE_NAMES = (".deepspeed_env", ".zlaunch_env")

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOUBLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$", "`": "`"}


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The names of `environ` that workers inherit from the controller."""
    return {
        name: value
        for name, value in environ.items()
        if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES)
    }


MAX_ENV_FILE_BYTES = 64 * 1024 * 1024
"""A sanity bound only (the file is a regular one of your own): the spec's limit, which names
the variable, is what a large value meets first (zlaunch/job/spec.py)."""


def load_env_file(path: str | os.PathLike) -> dict[str, str]:
    """Parse one env file; UsageError naming file:line on a bad line, or naming the file when
    it is not the user's own (`check_env_file_owner`)."""
    path = os.fspath(path)
    try:
        # O_NONBLOCK: a FIFO put in the file's place must not hang the start (refused below)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise UsageError(f"cannot read env file {path}: {err.strerror}") from None
    try:
        check_env_file_owner(path, os.fstat(fd), os.geteuid())  # the file opened, not its name
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_ENV_FILE_BYTES + 1)
    except OSError as err:
        raise UsageError(f"cannot read env file {path}: {err.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_ENV_FILE_BYTES:
        raise UsageError(f"env file {path} is larger than {MAX_ENV_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    return parse_env_text(text, origin=path)


def check_env_file_owner(path: str, st: os.stat_result, uid: int) -> None:
    """An env file sets every rank's environment (``LD_PRELOAD``, ``PYTHONPATH``: code that
    runs as the job's user), and ``./.zlaunch_env`` is read from the working directory, which
    may be a folder other users write to. So only a regular file of the user's own (or
    root's) that nobody else may change is read, as OpenSSH reads ``authorized_keys``;
    anything else is refused before any rank starts (UsageError naming the file and the fix)."""
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"env file {path} is not a regular file", hint=f"remove it: rm {path}")
    if st.st_uid not in (uid, 0):
        raise UsageError(
            f"env file {path} belongs to {_user_name(st.st_uid)}, not to you: it would set "
            "every rank's environment (LD_PRELOAD, PYTHONPATH: code that runs as you), so "
            "zlaunch reads only your own",
            hint="read it; if you trust it, pass its values with --env KEY=VALUE, or put a "
            "copy of your own in its place",
        )
    if st.st_mode & 0o022:
        raise UsageError(
            f"env file {path} can be changed by other users (mode {st.st_mode & 0o777:04o}): "
            "it sets every rank's environment, so zlaunch reads it only when nobody else "
            "may write it",
            hint=f"chmod go-w {path}",
        )


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def parse_env_text(text: str, *, origin: str = "<env>") -> dict[str, str]:
    """Parse env-file text; `origin` names the file in errors. Later lines win."""
    result: dict[str, str] = {}
    # Split on newlines only: str.splitlines() would also break values holding \x0c or
    # U+2028, which must survive byte-for-byte.
    lines = text.replace("\r\n", "\n").split("\n")
    index = 0
    while index < len(lines):
        lineno = index + 1
        line = lines[index].lstrip()
        index += 1
        if not line or line.startswith("#"):
            continue
        where = f"{origin}:{lineno}"
        if line.startswith("export ") or line.startswith("export\t"):
            line = line[len("export") :].lstrip()
        key, sep, rest = line.partition("=")
        key = key.rstrip()
        if not sep:
            raise UsageError(
                f"{where}: expected KEY=VALUE, got {clip(lines[lineno - 1].strip())}",
                hint="write one variable per line as KEY=VALUE (a '#' starts a comment line)",
            )
        if not _KEY.fullmatch(key):
            raise UsageError(
                f"{where}: bad variable name {clip(key)}",
                hint="names use letters, digits and '_', and do not start with a digit",
            )
        rest = rest.lstrip(" \t")
        if rest[:1] in ("'", '"'):
            value, tail, index = _quoted(rest, lines, index, where)
            tail = tail.strip()
            if tail and not tail.startswith("#"):
                raise UsageError(
                    f"{where}: unexpected text after the closing quote of {key}: {clip(tail)}",
                    hint="quote the whole value, or put a '#' before a comment",
                )
        else:
            value = _unquoted(rest)
        _refuse_nul(value, f"{where}: the value of {key}")
        result[key] = value
    return result


def _refuse_nul(value: str, what: str) -> None:
    """A process environment cannot hold a NUL byte: the worker could never be started."""
    if "\0" in value:
        raise UsageError(
            f"{what} holds a NUL byte (at character {value.index(chr(0))})",
            hint="environment values cannot contain NUL bytes; remove it, or pass binary data "
            "in a file",
        )


def _unquoted(rest: str) -> str:
    """A bare value ends at ' #' (a trailing comment); surrounding blanks are dropped."""
    match = re.search(r"\s#", rest)
    if match:
        rest = rest[: match.start()]
    return rest.strip()


def _quoted(rest: str, lines: list[str], index: int, where: str) -> tuple[str, str, int]:
    """Read a quoted value starting at rest[0]; it may continue on the following lines.

    Returns (value, text after the closing quote, index of the next unread line).
    """
    quote = rest[0]
    text = rest[1:]
    out: list[str] = []
    while True:
        pos = 0
        while pos < len(text):
            char = text[pos]
            if char == quote:
                return "".join(out), text[pos + 1 :], index
            if char == "\\" and pos + 1 < len(text):
                nxt = text[pos + 1]
                if quote == '"' and nxt in _DOUBLE_ESCAPES:
                    out.append(_DOUBLE_ESCAPES[nxt])
                    pos += 2
                    continue
                if quote == "'" and nxt in ("'", "\\"):
                    out.append(nxt)
                    pos += 2
                    continue
            out.append(char)
            pos += 1
        if index >= len(lines):
            raise UsageError(
                f"{where}: the {quote} quote opened here is never closed",
                hint=f"end the value with {quote}",
            )
        out.append("\n")
        text = lines[index]
        index += 1


def env_file_paths(cwd: str, home: str | None) -> list[str]:
    """The env files to read, lowest precedence first, skipping ones that do not exist."""
    dirs = [os.path.abspath(cwd)]
    if home and os.path.abspath(home) != dirs[0]:
        dirs.insert(0, os.path.abspath(home))
    paths = []
    for directory in dirs:
        for name in ENV_FILE_NAMES:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                paths.append(path)
    return paths


def parse_env_options(items: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Parse --env values: KEY=VALUE, or KEY alone to copy it from `environ`."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not _KEY.fullmatch(key):
            raise UsageError(
                f"--env {clip(item)}: bad variable name {clip(key)}",
                hint="use --env KEY=VALUE, or --env KEY to pass the value zlaunch sees",
            )
        if not sep:
            if key not in environ:
                raise UsageError(
                    f"--env {key}: {key} is not set in this environment",
                    hint=f"set it first, or give the value: --env {key}=VALUE",
                )
            value = environ[key]
        _refuse_nul(value, f"--env {key}: the value")
        result[key] = value
    return result


def collect_env(
    environ: Mapping[str, str],
    *,
    cwd: str,
    home: str | None,
    env_options: Iterable[str] = (),
) -> dict[str, str]:
    """Merge every source in the precedence order described in this module's docstring."""
    merged = forwarded_env(environ)
    for path in env_file_paths(cwd, home):
        merged.update(load_env_file(path))
    merged.update(parse_env_options(env_options, environ))
    return merged
