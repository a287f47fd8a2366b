"""Hostfile grammar (DeepSpeed-compatible) and the default single-host job.

One host per line, in rank order::

    # comment lines and blank lines are skipped
    node1 slots=8                   # trailing comments too
    alice@node2 slots=8             # ssh user in front of the host...
    node3 slots=4 user=bob port=2222  # ...or as keys; port is the ssh port
    [fe80::1] slots=2               # IPv6 addresses go in brackets

`slots=N` is required and is the number of workers (GPUs) on that host; its slots are
numbered 0..N-1 and become that host's `CUDA_VISIBLE_DEVICES`. Every error names the file
and the line and says how to fix it; a hostfile that was named but is missing is an error,
never a silent fallback to localhost.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from zlaunch.errors import HostfileError, UsageError
from zlaunch.text import brief, clip

__all__ = ["Host", "load_hostfile", "parse_hostfile", "default_hosts", "visible_gpu_slots"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# More workers than this on one host is a typo (and slots 0..N-1 are held in memory).
MAX_SLOTS = 4096
KNOWN_KEYS = ("slots", "port", "user")
# What people write for a known key, from other launchers' hostfiles and habit.
KEY_ALIASES = {
    "gpus": "slots",
    "gpu": "slots",
    "nproc": "slots",
    "max_slots": "slots",
    "ssh_port": "port",
    "username": "user",
    "login": "user",
}

# DNS names, IPv4 addresses and ssh-config aliases: letters, digits, '.', '-', '_'.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# Inside brackets: hex digits, ':' and '.' (IPv4-mapped), optional %zone.
_IPV6 = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(%[A-Za-z0-9_.-]+)?")
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?")
_USER_HINT = "user names use letters, digits, '.', '-' and '_'"


@dataclass(frozen=True)
class Host:
    """One host of the job and the slots selected on it."""

    name: str
    """ssh destination as written ("node1", "10.0.0.2", "::1", "localhost"); IPv6 without brackets."""
    slots: tuple[int, ...]
    """The selected slot (GPU) indices, in order, e.g. (0, 1)."""
    user: str | None = None
    """ssh user, from `user@host` or `user=`; None = ssh's default (ssh config or login name)."""
    port: int | None = None
    """ssh port from `port=`; None = ssh's default."""

    @property
    def is_local(self) -> bool:
        """A loopback name with no explicit ssh user or port: run without ssh.

        `user@localhost` or `localhost port=2222` asks for ssh on purpose (a container, another
        account), so those are not local.
        """
        return self.name in LOOPBACK_NAMES and self.user is None and self.port is None

    @property
    def display(self) -> str:
        """The host as a user would write it in a hostfile (IPv6 in brackets)."""
        return f"[{self.name}]" if ":" in self.name else self.name


def load_hostfile(path: str | os.PathLike) -> list[Host]:
    """Read and parse the hostfile at `path`; HostfileError (exit 2) on any problem."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise HostfileError(
            f"hostfile {path} not found",
            hint="check the path given to --hostfile, or leave --hostfile out to run on localhost",
        )
    if os.path.isdir(path):
        raise HostfileError(f"hostfile {path} is a directory", hint="pass the hostfile itself")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as err:
        raise HostfileError(
            f"hostfile {path} is not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    except OSError as err:
        raise HostfileError(f"cannot read hostfile {path}: {err.strerror}") from None
    return parse_hostfile(text, origin=path)


def parse_hostfile(text: str, *, origin: str = "<hostfile>") -> list[Host]:
    """Parse hostfile text; `origin` names the file in error messages."""
    hosts: list[Host] = []
    first_seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host = _parse_line(line, f"{origin}:{lineno}")
        key = host.name.lower()
        if key in first_seen:
            raise HostfileError(
                f"{origin}:{lineno}: duplicate host {host.display} (first listed at line "
                f"{first_seen[key]})",
                hint="list each host once and give it the total number of slots",
            )
        first_seen[key] = lineno
        hosts.append(host)
    if not hosts:
        raise HostfileError(
            f"hostfile {origin} has no hosts",
            hint="add one line per host, e.g. 'node1 slots=8'",
        )
    return hosts


def _parse_line(line: str, where: str) -> Host:
    first, *pairs = line.split()
    user, name = _parse_destination(first, where)
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise HostfileError(
                f"{where}: bad entry: expected key=value after the host, got {clip(pair)}",
                hint="write one host per line as 'HOST slots=N [port=P] [user=U]'",
            )
        if key not in KNOWN_KEYS:
            near = [KEY_ALIASES[key]] if key in KEY_ALIASES else []
            near = near or difflib.get_close_matches(key, KNOWN_KEYS, n=1, cutoff=0.6)
            raise HostfileError(
                f"{where}: unknown key {clip(key)}",
                hint=f"did you mean {near[0]!r}?"
                if near
                else f"known keys are {', '.join(KNOWN_KEYS)}",
            )
        if key in values:
            raise HostfileError(f"{where}: {key} given twice", hint=f"keep one {key}=...")
        values[key] = value

    if "slots" not in values:
        shown = brief(first)
        raise HostfileError(
            f"{where}: host {shown} has no slots",
            hint=f"add the number of workers for this host, e.g. '{shown} slots=8'",
        )
    slots = _positive_int(values["slots"], "slots", where, hint="slots must be 1 or more")
    if slots > MAX_SLOTS:
        raise HostfileError(
            f"{where}: slots must be 1-{MAX_SLOTS}, got {slots}",
            hint="slots is the number of workers (GPUs) on this host",
        )
    port = None
    if "port" in values:
        port = _positive_int(values["port"], "port", where, hint="an ssh port is 1-65535")
        if port > 65535:
            raise HostfileError(
                f"{where}: port must be 1-65535, got {port}", hint="an ssh port is 1-65535"
            )
    if "user" in values:
        if user is not None and user != values["user"]:
            raise HostfileError(
                f"{where}: user given twice ({user}@ and user={values['user']})",
                hint="keep one of them",
            )
        user = values["user"]
        if not _USER.fullmatch(user):
            raise HostfileError(f"{where}: bad user name {clip(user)}", hint=_USER_HINT)
    return Host(name=name, slots=tuple(range(slots)), user=user, port=port)


def _parse_destination(text: str, where: str) -> tuple[str | None, str]:
    """Split `[user@]host` / `[user@][v6addr]` into (user, name)."""
    user = None
    if "@" in text:
        user, _, text = text.rpartition("@")
        if not _USER.fullmatch(user):
            raise HostfileError(f"{where}: bad user name {clip(user)}", hint=_USER_HINT)
    if text.startswith("["):
        if not text.endswith("]") or not is_ipv6(text[1:-1]):
            raise HostfileError(
                f"{where}: bad entry {clip(text)}: expected an IPv6 address in brackets",
                hint="write IPv6 hosts like '[fe80::1] slots=2'",
            )
        return user, text[1:-1]
    if ":" in text:
        raise HostfileError(
            f"{where}: bad host {clip(text)}",
            hint="put IPv6 addresses in brackets ('[::1] slots=2') and the ssh port in "
            "'port=' ('node1 slots=8 port=2222')",
        )
    if "=" in text:
        raise HostfileError(
            f"{where}: bad entry: the line starts with {clip(text)} instead of a host name",
            hint="write one host per line as 'HOST slots=N'",
        )
    if not _NAME.fullmatch(text):
        raise HostfileError(
            f"{where}: bad host name {clip(text)}",
            hint="host names use letters, digits, '.', '-' and '_'",
        )
    return user, text


def is_ipv6(text: str) -> bool:
    """An IPv6 address, with an optional %zone (what may stand in brackets)."""
    if not _IPV6.fullmatch(text):
        return False
    try:
        ipaddress.IPv6Address(text.partition("%")[0])
    except ValueError:
        return False
    return True


def _positive_int(value: str, key: str, where: str, *, hint: str) -> int:
    # ASCII digits only: str.isdigit() also takes '²' and other digits int() refuses.
    if not (value.isascii() and value.isdigit()) or len(value) > 18 or int(value) < 1:
        raise HostfileError(
            f"{where}: {key} must be a positive integer, got {clip(value)}", hint=hint
        )
    return int(value)


def visible_gpu_slots(environ: Mapping[str, str] | None = None) -> tuple[int, ...] | None:
    """The GPU indices this machine may use, or None when it has no GPU we can see.

    CUDA_VISIBLE_DEVICES wins when set: its integer entries are the slots (so "2,3" keeps
    workers on GPUs 2 and 3); entries that are UUIDs count as slots 0..n-1. Otherwise
    `nvidia-smi -L` counts the GPUs. torch is never imported (too slow for a CLI).
    """
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        # CUDA stops at the first invalid entry, e.g. "-1" hides every GPU.
        kept: list[str] = []
        for entry in entries:
            if entry.startswith("-"):
                break
            kept.append(entry)
        if not kept:
            return None
        if all(e.isascii() and e.isdigit() for e in kept):
            return tuple(int(e) for e in kept)
        return tuple(range(len(kept)))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    count = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    return tuple(range(count)) if out.returncode == 0 and count else None


def default_hosts(num_gpus: int | None, environ: Mapping[str, str] | None = None) -> list[Host]:
    """The job when no hostfile is given: localhost with `num_gpus` slots.

    `num_gpus` None means every visible GPU, or 1 slot on a machine without GPUs. With visible
    GPUs the first `num_gpus` of them are used; on a CPU machine slots are 0..num_gpus-1.
    """
    gpus = visible_gpu_slots(environ)
    if num_gpus is None:
        return [Host("localhost", gpus or (0,))]
    if num_gpus < 1:
        raise UsageError(f"--num-gpus must be 1 or more, got {num_gpus}")
    if num_gpus > MAX_SLOTS:
        raise UsageError(f"--num-gpus must be at most {MAX_SLOTS}, got {num_gpus}")
    if gpus and num_gpus <= len(gpus):
        return [Host("localhost", gpus[:num_gpus])]
    return [Host("localhost", tuple(range(num_gpus)))]
