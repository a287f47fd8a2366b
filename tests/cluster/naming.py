"""Names of everything one test cluster creates, all derived from one per-run prefix.

A prefix looks like ``zl1f3a-k7``: ``zl``, the owner's pid in hex, a dash and two random
characters (two clusters owned by one process differ there). Every namespace, link, ``/etc/netns``
entry and state directory starts with it, so two runs on one machine never collide, and leftovers
of a run whose owner died can be found and removed by name alone.
"""

from __future__ import annotations

import os
import random
import re
import string
import tempfile

__all__ = [
    "PREFIX_RE",
    "STATE_SUFFIX",
    "bridge_name",
    "netns_name",
    "new_prefix",
    "owner_alive",
    "owner_of",
    "state_dir",
    "veth_name",
]

#: Matches the prefix at the start of any name the cluster made; group 2 is the owner pid (hex).
PREFIX_RE = re.compile(r"^(zl([0-9a-f]{1,7})-[0-9a-z]{2})")
#: State directories are ``<tmp>/<prefix>.zlcluster``.
STATE_SUFFIX = ".zlcluster"
_TAG_CHARS = string.ascii_lowercase + string.digits


def new_prefix(owner_pid: int | None = None) -> str:
    """A fresh prefix for a cluster owned by ``owner_pid`` (default: this process)."""
    pid = os.getpid() if owner_pid is None else owner_pid
    tag = "".join(random.choices(_TAG_CHARS, k=2))
    return f"zl{pid:x}-{tag}"


def owner_of(prefix: str) -> int:
    match = PREFIX_RE.match(prefix)
    if not match:
        raise ValueError(f"not a test-cluster prefix: {prefix!r}")
    return int(match.group(2), 16)


def owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_name(prefix: str, index: int) -> str:
    return f"{prefix}-node{index}"


def bridge_name(prefix: str) -> str:
    # Interface names are limited to 15 characters; the longest prefix is 12 ("zl" + 7 + 3).
    return f"{prefix}br"


def veth_name(prefix: str, index: int) -> str:
    return f"{prefix}v{index}"


def state_dir(prefix: str) -> str:
    return os.path.join(tempfile.gettempdir(), prefix + STATE_SUFFIX)
