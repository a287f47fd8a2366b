"""Low-level pieces: ``ip`` calls, processes per network namespace, and removal by prefix.

Removal works from names alone (see :mod:`tests.cluster.naming`), so the same code tears down a
live cluster, a cluster whose owner was killed, and a half-built one whose bring-up failed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable

from .naming import PREFIX_RE, STATE_SUFFIX, owner_alive, owner_of, state_dir

__all__ = [
    "IP",
    "cmdline",
    "destroy",
    "find_prefixes",
    "ip",
    "list_links",
    "list_netns",
    "netns_pids",
    "prefix_processes",
    "reap_stale",
]

IP = shutil.which("ip") or "/usr/sbin/ip"
NETNS_RUN_DIR = "/run/netns"
NETNS_ETC_DIR = "/etc/netns"


class IpError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> str:
    out = subprocess.run([IP, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and out.returncode != 0:
        raise IpError(f"`ip {' '.join(args)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_RUN_DIR))
    except FileNotFoundError:
        return []


def list_links() -> list[str]:
    names = []
    for line in ip("-o", "link", "show").splitlines():
        # "7: zl1f-abv1@if2: <BROADCAST,...> ..."
        name = line.split(":", 2)[1].strip()
        names.append(name.split("@", 1)[0])
    return names


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def netns_pids(names: Iterable[str]) -> dict[str, list[int]]:
    """Pids living in each named namespace (what ``ip netns pids`` prints, in one /proc scan)."""
    wanted: dict[tuple[int, int], str] = {}
    for name in names:
        try:
            st = os.stat(os.path.join(NETNS_RUN_DIR, name))
        except OSError:
            continue
        wanted[(st.st_dev, st.st_ino)] = name
    found: dict[str, list[int]] = {name: [] for name in wanted.values()}
    if not wanted:
        return found
    for pid in _all_pids():
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:  # gone, or a zombie
            continue
        name = wanted.get((st.st_dev, st.st_ino))
        if name is not None:
            found[name].append(pid)
    return found


def prefix_processes(prefix: str) -> list[int]:
    """The cluster's sshd listeners (and their start-up chain), wherever they live.

    Matched by the sshd_config path in their command line, not by the state directory alone:
    a launcher in the root namespace holding ``--ssh-config <state dir>/ssh_config`` is the
    test's business, not the cluster's.
    """
    marker = f"{prefix}{STATE_SUFFIX}/sshd_config_"
    me = os.getpid()
    return [pid for pid in _all_pids() if pid != me and marker in cmdline(pid)]


def _kill_until_gone(prefix: str, namespaces: list[str], timeout: float = 10.0) -> None:
    # SIGKILL at once: the cluster's processes hold no state worth a graceful stop, and test
    # workers may ignore SIGTERM. Repeat because a dying process tree can still fork.
    deadline = time.monotonic() + timeout
    while True:
        pids = {pid for pids in netns_pids(namespaces).values() for pid in pids}
        pids.update(prefix_processes(prefix))
        pids.discard(os.getpid())
        if not pids:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster {prefix}: processes survive SIGKILL: {sorted(pids)}")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def destroy(prefix: str) -> None:
    """Remove every process, namespace, link, /etc/netns entry and file named by ``prefix``.

    Removes all it can even when a process survives SIGKILL (then raises at the end).
    """
    namespaces = [name for name in list_netns() if name.startswith(prefix)]
    try:
        _kill_until_gone(prefix, namespaces)
    finally:
        _remove_names(prefix, namespaces)


def _remove_names(prefix: str, namespaces: list[str]) -> None:
    for link in list_links():
        if link.startswith(prefix):
            ip("link", "del", link, check=False)
    for name in namespaces:
        ip("netns", "del", name, check=False)
    if os.path.isdir(NETNS_ETC_DIR):
        for entry in os.listdir(NETNS_ETC_DIR):
            if entry.startswith(prefix):
                shutil.rmtree(os.path.join(NETNS_ETC_DIR, entry), ignore_errors=True)
    shutil.rmtree(state_dir(prefix), ignore_errors=True)


def find_prefixes() -> set[str]:
    """Prefixes of every cluster with something left on this machine."""
    names = list_netns() + list_links()
    if os.path.isdir(NETNS_ETC_DIR):
        names += os.listdir(NETNS_ETC_DIR)
    names += [e for e in os.listdir(tempfile.gettempdir()) if e.endswith(STATE_SUFFIX)]
    found = set()
    for name in names:
        match = PREFIX_RE.match(name)
        if match:
            found.add(match.group(1))
    return found


def reap_stale() -> list[str]:
    """Destroy leftovers of clusters whose owner process is dead; returns their prefixes."""
    reaped = []
    for prefix in sorted(find_prefixes()):
        if not owner_alive(owner_of(prefix)):
            destroy(prefix)
            reaped.append(prefix)
    return reaped
