"""Many SSH "hosts" on one machine: loopback addresses 127.0.1.1 ... 127.0.1.N, every one
reaching one sshd of our own on a private port (its own host key, client key, known_hosts and
ssh_config). For measuring and testing the launcher at scale over real SSH without namespaces:
a thousand ranks are 64 hosts x 16 slots.

    with LoopbackFarm.start(hosts=64) as farm:
        farm.hostfile(slots=16)          # "127.0.1.1 slots=16" ... "127.0.1.64 slots=16"
        farm.ssh_config                  # for zlaunch --ssh-config and ssh -F
        farm.processes()                 # pids of everything running under our sshd's sessions

Every 127.x.y.z address is the loopback interface on Linux, so one sshd listening on the
wildcard address answers them all; ``AllowUsers root@127.0.0.0/8`` and the one authorized key
keep it to this machine and this farm. Sessions get ``PYTHONPATH`` set by sshd (``SetEnv``):
the agents import the zlaunch of the tree that started the farm, not whatever is installed.

Needs root (sshd reads its config as root, and the sessions run as root) and an sshd binary;
``unavailable_reason()`` says why not otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

__all__ = ["LoopbackFarm", "unavailable_reason", "address"]

SSHD = shutil.which("sshd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or ""
SSH_KEYGEN = shutil.which("ssh-keygen") or ""
# Set in every session (and so inherited by agents, workers and whatever they start): how
# processes of this farm are found after their parents are gone.
MARKER = "LOOPBACK_FARM"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def address(index: int) -> str:
    """The loopback address of host ``index`` (0-based): 127.0.1.1, ..., 127.0.1.254,
    127.0.2.1, ..."""
    return f"127.0.{1 + index // 254}.{1 + index % 254}"


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "the loopback SSH farm runs its own sshd as root (not root here)"
    if not SSHD:
        return "no sshd binary (apt-get install openssh-server)"
    if not SSH_KEYGEN:
        return "no ssh-keygen binary (apt-get install openssh-client)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _keygen(path: str, comment: str) -> str:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    with open(path + ".pub") as f:
        return f.read().strip()


class LoopbackFarm:
    def __init__(self, hosts: int, state: str, port: int, pythonpath: str):
        self.hosts = [address(i) for i in range(hosts)]
        self.state = state
        self.port = port
        self.pythonpath = pythonpath
        self.ssh_config = os.path.join(state, "ssh_config")
        self.sshd: subprocess.Popen | None = None

    @classmethod
    def start(cls, hosts: int, pythonpath: str = ROOT, state: str | None = None) -> LoopbackFarm:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        state = state or tempfile.mkdtemp(prefix="zl-farm-")
        farm = cls(hosts, state, _free_port(), pythonpath)
        try:
            farm._write_files()
            farm._start_sshd()
        except BaseException:
            farm.close()
            raise
        return farm

    def __enter__(self) -> LoopbackFarm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- files ------------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.state, name)

    def _write_files(self) -> None:
        host_key = self._path("host_key")
        host_pub = _keygen(host_key, "zlaunch-farm-host")
        client_pub = _keygen(self._path("client_key"), "zlaunch-farm-client")
        with open(self._path("authorized_keys"), "w") as f:
            f.write(client_pub + "\n")
        keytype, key = host_pub.split()[:2]
        with open(self._path("known_hosts"), "w") as f:
            for host in self.hosts:  # non-22 ports are recorded as [host]:port
                f.write(f"[{host}]:{self.port} {keytype} {key}\n")
        with open(self._path("sshd_config"), "w") as f:
            f.write(self._sshd_config(host_key))
        with open(self.ssh_config, "w") as f:
            f.write(self._ssh_config())
        open(self._path(".bashrc"), "w").close()

    def _sshd_config(self, host_key: str) -> str:
        return "\n".join(
            [
                f"Port {self.port}",
                "AddressFamily inet",
                "ListenAddress 0.0.0.0",
                f"HostKey {host_key}",
                f"PidFile {self._path('sshd.pid')}",
                f"AuthorizedKeysFile {self._path('authorized_keys')}",
                "AllowUsers root@127.0.0.0/8",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "UseDNS no",
                "PrintMotd no",
                "PrintLastLog no",
                "X11Forwarding no",
                # A launcher opens one connection per host at once: 64 or more handshakes in
                # flight; sshd's default (10:30:100) would drop most of them.
                "MaxStartups 2000",
                "MaxSessions 100",
                # HOME: bash, started by sshd for the remote command, reads ~/.bashrc; here
                # every "host" shares root's, and one that runs `pyenv init` makes 64 sessions
                # queue on pyenv's rehash lock for a minute before any agent starts. Real hosts
                # each have their own home; the farm's sessions get an empty one of their own.
                f"SetEnv PYTHONPATH={self.pythonpath} {MARKER}={self.state} HOME={self.state}",
                "",
            ]
        )

    def _ssh_config(self) -> str:
        return "\n".join(
            [
                "# zlaunch loopback farm",
                "Host *",
                "    User root",
                f"    Port {self.port}",
                f"    IdentityFile {self._path('client_key')}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {self._path('known_hosts')}",
                "    GlobalKnownHostsFile /dev/null",
                "    StrictHostKeyChecking yes",
                "    BatchMode yes",
                "    ConnectTimeout 30",
                "    KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org",
                "    LogLevel ERROR",
                "",
            ]
        )

    def hostfile(self, slots: int, name: str = "hostfile", hosts: int | None = None) -> str:
        """``hosts`` (default: all) loopback hosts of ``slots`` slots each."""
        path = self._path(name)
        with open(path, "w") as f:
            f.writelines(f"{host} slots={slots}\n" for host in self.hosts[:hosts])
        return path

    # ---- sshd -------------------------------------------------------------------------------

    def _start_sshd(self) -> None:
        self.sshd = subprocess.Popen(
            [SSHD, "-D", "-f", self._path("sshd_config"), "-E", self._path("sshd.log")],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.sshd.poll() is not None:
                with open(self._path("sshd.log"), errors="replace") as f:
                    raise RuntimeError(f"sshd exited with {self.sshd.returncode}: {f.read()}")
            try:
                with socket.create_connection((self.hosts[0], self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on port {self.port} within 10 s")

    def processes(self) -> list[int]:
        """Every live process of this farm: below our sshd (its per-connection children and
        what they started: agents, workers) by /proc's parent links, and anything else whose
        environment carries the farm's marker (a worker whose agent died is reparented)."""
        if self.sshd is None:
            return []
        marker = f"{MARKER}={self.state}".encode()
        children: dict[int, list[int]] = {}
        marked = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                fields = stat[stat.rindex(b")") + 2 :].split()
                if fields[0] == b"Z":  # exited; its parent has not reaped it yet
                    continue
                children.setdefault(int(fields[1]), []).append(int(name))
                with open(f"/proc/{name}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        marked.append(int(name))
            except OSError:
                continue
        found, todo = set(marked), list(children.get(self.sshd.pid, ()))
        while todo:
            pid = todo.pop()
            found.add(pid)
            todo.extend(children.get(pid, ()))
        return sorted(found)

    def kill_sessions(self) -> None:
        """SIGKILL everything under our sshd (cleanup after a failed run)."""
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self.sshd is not None:
            self.kill_sessions()
            if self.sshd.poll() is None:
                os.killpg(self.sshd.pid, signal.SIGTERM)
                try:
                    self.sshd.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(self.sshd.pid, signal.SIGKILL)
                    self.sshd.wait()
            self.sshd = None
        shutil.rmtree(self.state, ignore_errors=True)
