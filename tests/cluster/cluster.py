"""The :class:`Cluster`: N hosts on this machine, each a network namespace running its own sshd.

Layout of a 3-host cluster with prefix ``P`` on subnet ``10.a.b.0/24``::

    root namespace (the controller)      bridge Pbr, 10.a.b.1
      ├── veth Pv1 ── eth0 10.a.b.2 in netns P-node1, hostname node1, sshd on :22
      ├── veth Pv2 ── eth0 10.a.b.3 in netns P-node2, hostname node2, sshd on :22
      └── veth Pv3 ── eth0 10.a.b.4 in netns P-node3, hostname node3, sshd on :22

Inside every namespace ``/etc/hosts`` (bind-mounted by ``ip netns exec`` from
``/etc/netns/P-nodeK/hosts``) names every node and the controller. The network and UTS
namespaces are separate; the filesystem and pid space are shared, so the same python and the
editable install work on every node.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from . import netns, sshfiles
from .naming import bridge_name, netns_name, new_prefix, state_dir, veth_name

__all__ = ["Cluster", "ClusterError", "unavailable_reason"]

LOCK_FILE = "/tmp/zlaunch-cluster.lock"
INTERFACE = "eth0"


class ClusterError(RuntimeError):
    """Bring-up failed; the message says which step and shows the sshd log where relevant."""


def unavailable_reason() -> str | None:
    """Why the cluster cannot run here (not root, a tool missing), or None when it can."""
    if os.geteuid() != 0:
        return f"test cluster needs root (network namespaces); running as uid {os.geteuid()}"
    for tool, path, package in (
        ("sshd", sshfiles.SSHD, "openssh-server"),
        ("ssh-keygen", sshfiles.SSH_KEYGEN, "openssh-client"),
        ("ssh", _which("ssh"), "openssh-client"),
        ("ip", _which("ip"), "iproute2"),
        ("unshare", _which("unshare"), "util-linux"),
    ):
        if not path:
            return f"test cluster needs `{tool}` (apt-get install {package})"
    return None


def ipv6_unavailable_reason() -> str | None:
    """Why the cluster's nodes get no IPv6 addresses here, or None when they do."""
    for key in ("all", "default"):
        try:
            with open(f"/proc/sys/net/ipv6/conf/{key}/disable_ipv6") as f:
                if f.read().strip() != "0":
                    return f"IPv6 is disabled on this machine (net.ipv6.conf.{key}.disable_ipv6)"
        except OSError:
            return "this kernel has no IPv6"
    return None


def _which(tool: str) -> str:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or ""


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    # Serialises subnet choice and bridge creation between clusters started at the same time.
    with open(LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _pick_subnet() -> ipaddress.IPv4Network:
    used = []
    for line in netns.ip("-o", "-4", "addr", "show").splitlines():
        used.append(ipaddress.ip_interface(line.split()[3]).network)
    for line in netns.ip("-4", "route", "show", "table", "all").splitlines():
        word = line.split()[0]
        if word[0].isdigit():
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(word, strict=False))
    for _ in range(1000):
        net = ipaddress.ip_network(f"10.{random.randint(100, 254)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(other) for other in used):
            return net
    raise ClusterError("no free 10.x.y.0/24 subnet found for the test cluster bridge")


class Cluster:
    """A running test cluster. Build one with :meth:`start`; :meth:`close` removes it all."""

    def __init__(self, prefix: str, n: int, subnet: ipaddress.IPv4Network, detached: bool):
        self.prefix = prefix
        self.hosts: list[str] = [f"node{k}" for k in range(1, n + 1)]
        self.subnet = subnet
        self.detached = detached
        self.state_dir = state_dir(prefix)
        self.interface = INTERFACE
        self.bridge = bridge_name(prefix)
        net = list(subnet.hosts())
        self.controller_address = str(net[0])
        self._addresses = {h: str(net[k]) for k, h in enumerate(self.hosts, start=1)}
        # IPv6 beside IPv4, on a unique-local /64 derived from the IPv4 subnet (10.a.b.0/24 ->
        # fd5a:a:b::/64); nodad: usable at once, no duplicate-address wait.
        self.ipv6 = ipv6_unavailable_reason() is None
        _, a, b, _ = subnet.network_address.packed
        net6 = ipaddress.IPv6Network(f"fd5a:{a:x}:{b:x}::/64")
        self.controller_address6 = str(net6[1])
        self._addresses6 = {h: str(net6[k + 1]) for k, h in enumerate(self.hosts, start=1)}
        self._netns = {h: netns_name(prefix, k) for k, h in enumerate(self.hosts, start=1)}
        self.ssh_config = os.path.join(self.state_dir, "ssh_config")
        self.identity_file = os.path.join(self.state_dir, "id_ed25519")
        self.known_hosts = os.path.join(self.state_dir, "known_hosts")
        self._sshd: dict[str, subprocess.Popen] = {}
        self._hostfiles = 0
        self._owner_pid = os.getpid()
        self.closed = False

    # -- public API -------------------------------------------------------------------------

    @classmethod
    def start(cls, n: int = 3, *, detached: bool = False) -> Cluster:
        """Build and start an ``n``-host cluster (about a second). Raises ClusterError."""
        reason = unavailable_reason()
        if reason:
            raise ClusterError(reason)
        if not 1 <= n <= 99:
            raise ValueError(f"n must be between 1 and 99 hosts, got {n}")
        netns.reap_stale()
        with _machine_lock():
            subnet = _pick_subnet()
            taken = netns.find_prefixes() | set(_LIVE)
            prefix = new_prefix()
            while prefix in taken:  # one owner, several clusters: the 2-char tag may repeat
                prefix = new_prefix()
            cluster = cls(prefix, n, subnet, detached)
            _LIVE[cluster.prefix] = cluster
            _install_cleanup_handlers()
            try:
                os.mkdir(cluster.state_dir, 0o700)
                cluster._create_network()
            except BaseException:
                cluster.close()
                raise
        try:
            cluster._write_files()
            cluster._start_sshd()
        except BaseException:
            cluster.close()
            raise
        return cluster

    def address(self, host: str) -> str:
        return self._addresses[self._check(host)]

    def address6(self, host: str) -> str:
        """The host's IPv6 address (sshd listens there too); ClusterError without IPv6."""
        if not self.ipv6:
            raise ClusterError(ipv6_unavailable_reason() or "IPv6 addresses were refused here")
        return self._addresses6[self._check(host)]

    def namespace(self, host: str) -> str:
        return self._netns[self._check(host)]

    def ssh_argv(self, host: str, cmd: str) -> list[str]:
        return ["ssh", "-F", self.ssh_config, self._check(host), cmd]

    def run(self, host: str, cmd: str, timeout: float = 10) -> subprocess.CompletedProcess:
        """Run a shell command on ``host`` over real ssh; never raises on a non-zero exit."""
        return subprocess.run(
            self.ssh_argv(host, cmd),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def hostfile(
        self, slots: int | Mapping[str, int] = 2, hosts: Sequence[str] | None = None
    ) -> str:
        """Write a DeepSpeed-style hostfile (``nodeK slots=S`` lines); returns its path."""
        chosen = list(self.hosts if hosts is None else hosts)
        lines = []
        for host in chosen:
            count = slots[host] if isinstance(slots, Mapping) else slots
            lines.append(f"{self._check(host)} slots={count}")
        self._hostfiles += 1
        path = os.path.join(self.state_dir, f"hostfile-{self._hostfiles}")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def pids(self, host: str, include_sshd: bool = False) -> list[tuple[int, str]]:
        """Processes living in ``host``'s namespace as (pid, cmdline), oldest pid first.

        The node's sshd listener is always left out; so are sshd's per-connection processes
        (``sshd: root@notty``) unless ``include_sshd``: they belong to an open connection and
        linger a few milliseconds after the client exits. Processes a command started over ssh
        (workers, agents, their orphans) are always listed.
        """
        return self._processes([self._check(host)], include_sshd).get(host, [])

    def wait_idle(self, timeout: float = 5.0) -> dict[str, list[tuple[int, str]]]:
        """Wait until no host has processes (see :meth:`pids`); returns what is left, if any."""
        deadline = time.monotonic() + timeout
        while (left := self._processes(self.hosts)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def kill_all(self) -> dict[str, list[tuple[int, str]]]:
        """SIGKILL every process on every host except the sshd listeners; returns what it killed.

        For test isolation: a test that left workers behind must not fail the next one.
        """
        killed = self._processes(self.hosts, include_sshd=True)
        for procs in killed.values():
            for pid, _ in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return killed

    def _processes(
        self, hosts: Sequence[str], include_sshd: bool = False
    ) -> dict[str, list[tuple[int, str]]]:
        """:meth:`pids` of several hosts from one scan of /proc; hosts with none are left out."""
        by_ns = netns.netns_pids(self._netns[h] for h in hosts)
        listeners = {proc.pid for proc in self._sshd.values()}
        found = {}
        for host in hosts:
            procs = [
                (pid, command)
                for pid in sorted(by_ns.get(self._netns[host], []))
                if pid not in listeners and (include_sshd or not _is_sshd(pid))
                # an empty command line: a zombie, or a process whose memory is already gone
                # as it exits (an ssh session's sshd, a millisecond after its client left)
                if (command := netns.cmdline(pid))
            ]
            if procs:
                found[host] = procs
        return found

    def describe(self) -> dict:
        return {
            "prefix": self.prefix,
            "owner_pid": self._owner_pid,
            "detached": self.detached,
            "hosts": self.hosts,
            "addresses": dict(self._addresses),
            "namespaces": dict(self._netns),
            "interface": self.interface,
            "controller_address": self.controller_address,
            "addresses6": dict(self._addresses6) if self.ipv6 else None,
            "ssh_config": self.ssh_config,
            "state_dir": self.state_dir,
        }

    def close(self) -> None:
        """Remove everything this cluster made. Idempotent."""
        if self.closed:
            return
        self.closed = True
        _LIVE.pop(self.prefix, None)
        netns.destroy(self.prefix)
        for proc in self._sshd.values():  # reap the killed listeners (our children)
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Cluster({self.prefix}, hosts={self.hosts}, subnet={self.subnet})"

    # -- bring-up ---------------------------------------------------------------------------

    def _check(self, host: str) -> str:
        if host not in self._addresses:
            raise KeyError(f"unknown host {host!r}; this cluster has {self.hosts}")
        return host

    def _create_network(self) -> None:
        prefix_len = self.subnet.prefixlen
        netns.ip("link", "add", self.bridge, "type", "bridge")
        netns.ip("addr", "add", f"{self.controller_address}/{prefix_len}", "dev", self.bridge)
        netns.ip("link", "set", self.bridge, "up")
        for k, host in enumerate(self.hosts, start=1):
            ns, veth = self._netns[host], veth_name(self.prefix, k)
            netns.ip("netns", "add", ns)
            netns.ip("link", "add", veth, "type", "veth", "peer", "name", INTERFACE, "netns", ns)
            netns.ip("link", "set", veth, "master", self.bridge, "up")
            batch = (
                f"addr add {self._addresses[host]}/{prefix_len} dev {INTERFACE}\n"
                f"link set {INTERFACE} up\n"
                "link set lo up\n"
            )
            out = subprocess.run(
                [netns.IP, "-n", ns, "-batch", "-"], input=batch, capture_output=True, text=True
            )
            if out.returncode != 0:
                raise ClusterError(f"configuring {ns} failed: {out.stderr.strip()}")
        if self.ipv6:
            self._add_ipv6()

    def _add_ipv6(self) -> None:
        """IPv6 beside IPv4, optional: where the kernel refuses (IPv6 disabled on the bridge or
        in the namespaces), the cluster runs IPv4 only and `ipv6` says so."""
        commands = [
            [netns.IP, "addr", "add", f"{self.controller_address6}/64", "dev", self.bridge, "nodad"]
        ]
        for host in self.hosts:
            commands.append(
                [netns.IP, "-n", self._netns[host], "addr", "add",
                 f"{self._addresses6[host]}/64", "dev", INTERFACE, "nodad"]
            )  # fmt: skip
        for argv in commands:
            if subprocess.run(argv, capture_output=True, text=True).returncode != 0:
                self.ipv6 = False
                return
        # A link taken down and up again (the fault tests) keeps its IPv6 address, as IPv4's:
        # without this, every later IPv6 test of the session finds no route to that node.
        for host in self.hosts:
            subprocess.run(
                [netns.IP, "netns", "exec", self._netns[host], "sysctl", "-qw",
                 f"net.ipv6.conf.{INTERFACE}.keep_addr_on_down=1"],
                capture_output=True,
            )  # fmt: skip

    def _write_files(self) -> None:
        d = self.state_dir
        client_pub = sshfiles.generate_key(self.identity_file, f"client@{self.prefix}")
        _write(os.path.join(d, "authorized_keys"), client_pub + "\n")
        known = []
        hosts_text = sshfiles.etc_hosts(self._addresses, self.controller_address)
        for host in self.hosts:
            key = os.path.join(d, f"host_key_{host}")
            pub = sshfiles.generate_key(key, f"{host}@{self.prefix}").split()
            names = [host, self._addresses[host]]
            if self.ipv6:
                names.append(self._addresses6[host])
            known.append(f"{','.join(names)} {pub[0]} {pub[1]}")
            _write(
                os.path.join(d, f"sshd_config_{host}"),
                sshfiles.sshd_config(
                    host_key=key,
                    authorized_keys=os.path.join(d, "authorized_keys"),
                    pid_file=os.path.join(d, f"sshd_{host}.pid"),
                    ipv6=self.ipv6,
                ),
            )
            etc = os.path.join(netns.NETNS_ETC_DIR, self._netns[host])
            os.makedirs(etc, exist_ok=True)
            _write(os.path.join(etc, "hosts"), hosts_text)
        _write(self.known_hosts, "\n".join(known) + "\n")
        _write(
            self.ssh_config,
            sshfiles.ssh_config(
                addresses=self._addresses,
                identity_file=self.identity_file,
                known_hosts=self.known_hosts,
                comment=f"zlaunch test cluster {self.prefix} on {self.subnet}",
            ),
        )
        _write(os.path.join(d, "cluster.json"), json.dumps(self.describe(), indent=2) + "\n")

    def _start_sshd(self) -> None:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for host in self.hosts:
            cfg = os.path.join(self.state_dir, f"sshd_config_{host}")
            log = open(os.path.join(self.state_dir, f"sshd_{host}.log"), "wb")  # noqa: SIM115
            with log:
                self._sshd[host] = subprocess.Popen(
                    [
                        netns.IP, "netns", "exec", self._netns[host],
                        _which("unshare"), "--uts",
                        "sh", "-c", f'hostname {host} && exec "$0" -D -e -f "$1"',
                        sshfiles.SSHD, cfg,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # a terminal's Ctrl-C must not reach them
                )  # fmt: skip
        deadline = time.monotonic() + 15
        for host in self.hosts:
            while not self._sshd_answers(host):
                if self._sshd[host].poll() is not None or time.monotonic() > deadline:
                    raise ClusterError(f"sshd on {host} did not come up:\n{self._sshd_log(host)}")
                time.sleep(0.01)

    def _sshd_answers(self, host: str) -> bool:
        try:
            with socket.create_connection((self._addresses[host], 22), timeout=1) as s:
                return s.recv(8).startswith(b"SSH-")
        except OSError:
            return False

    def _sshd_log(self, host: str) -> str:
        try:
            with open(os.path.join(self.state_dir, f"sshd_{host}.log")) as f:
                return f.read()[-4000:]
        except OSError as exc:
            return f"(no log: {exc})"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _is_sshd(pid: int) -> bool:
    try:
        return os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(sshfiles.SSHD)
    except OSError:
        return False


# -- cleanup on exit and on signals -----------------------------------------------------------

_LIVE: dict[str, Cluster] = {}
_PREVIOUS: dict[int, object] = {}
_handlers_installed = False


def _close_all() -> None:
    for cluster in list(_LIVE.values()):
        # A forked child inherits _LIVE, the atexit hook and the handlers: it owns nothing.
        if cluster._owner_pid == os.getpid():
            with contextlib.suppress(Exception):
                cluster.close()


def _on_signal(signum: int, frame: object) -> None:
    _close_all()
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_cleanup_handlers() -> None:
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_close_all)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            _PREVIOUS[signum] = signal.getsignal(signum)
            signal.signal(signum, _on_signal)
