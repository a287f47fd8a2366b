"""A real Slurm cluster on one machine: slurmctld + one slurmd per network-namespace node, munge.

Built on the SSH test cluster (:class:`tests.cluster.Cluster`: namespaces, bridge, per-node
``/etc/hosts``, sshd), so the same three nodes answer both ``ssh`` and ``srun``::

    root namespace (login node + controller)   munged (one socket for every node), slurmctld
      ├── netns P-node1  hostname node1  sshd, slurmd -N node1
      ├── netns P-node2  hostname node2  sshd, slurmd -N node2
      └── netns P-node3  hostname node3  sshd, slurmd -N node3

Facts this rests on (docs/slurm-test-cluster.md): slurmd enters its namespace with ``nsenter`` (``ip
netns exec`` hides /sys/fs/cgroup and slurmd 22.05 then dies), with ``unshare --uts --mount``
for its hostname and a private bind-mounted ``/etc/hosts``; per-node spool, pid, log and TmpFS
paths (``%n``); no cgroups (``proctrack/linuxproc``, ``task/none``), so a double-forked task
escapes Slurm's tracking — :meth:`close` kills whatever lives in the namespaces anyway.

Clients (srun, sbatch, salloc, scancel, squeue) run in the root namespace with
:attr:`SlurmCluster.env` (``SLURM_CONF``). Everything lives under the SSH cluster's state
directory, and the root-namespace daemons carry that path in their command line, so leftovers
of an owner that died are found by name (:func:`reap_stale`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from tests.cluster import Cluster, ClusterError
from tests.cluster import unavailable_reason as ssh_unavailable_reason
from tests.cluster.naming import PREFIX_RE, STATE_SUFFIX, owner_alive, owner_of
from tests.cluster.netns import cmdline

__all__ = ["SlurmCluster", "reap_stale", "unavailable_reason"]

PARTITION = "debug"
CPUS_PER_NODE = 8
_MARK = STATE_SUFFIX + "/slurm/"  # in the command line of every root-namespace daemon


def _which(tool: str) -> str:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or ""


def unavailable_reason() -> str | None:
    """Why a Slurm test cluster cannot run here, or None when it can."""
    reason = ssh_unavailable_reason()
    if reason:
        return reason
    for tool, package in (
        ("slurmctld", "slurm-wlm"),
        ("slurmd", "slurm-wlm"),
        ("srun", "slurm-wlm"),
        ("munged", "munge"),
        ("nsenter", "util-linux"),
    ):
        if not _which(tool):
            return f"Slurm test cluster needs `{tool}` (apt-get install {package})"
    if not os.path.isdir("/sys/fs/cgroup"):
        return "Slurm test cluster needs /sys/fs/cgroup mounted (slurmd 22.05 loads cgroup code)"
    return None


def reap_stale() -> list[int]:
    """Kill root-namespace munged/slurmctld left by test clusters whose owner died."""
    killed = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        line = cmdline(int(name))
        at = line.find(_MARK)
        if at < 0:
            continue
        start = line.rfind("/", 0, at) + 1
        match = PREFIX_RE.match(line[start:at])
        if match and not owner_alive(owner_of(match.group(1))):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)
                killed.append(int(name))
    return killed


class SlurmCluster:
    """A running Slurm cluster; :meth:`start` builds one, :meth:`close` removes everything."""

    def __init__(self, net: Cluster):
        self.net = net
        self.hosts = net.hosts
        self.partition = PARTITION
        self.dir = os.path.join(net.state_dir, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        self.controller_host = socket.gethostname().split(".")[0]
        self.ctld_port = _free_port(net.controller_address)
        self._daemons: dict[str, subprocess.Popen] = {}
        self._owner_pid = os.getpid()
        self.closed = False

    @property
    def env(self) -> dict[str, str]:
        """This process's environment plus what Slurm's clients need to reach this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = self.conf
        return env

    @classmethod
    def start(cls, n: int = 3) -> SlurmCluster:
        """Build the network (sshd included) and start munged, slurmctld and n slurmd."""
        reason = unavailable_reason()
        if reason:
            raise ClusterError(reason)
        reap_stale()
        net = Cluster.start(n=n)
        cluster = cls(net)
        _LIVE.append(cluster)
        _install_signal_handlers()
        try:
            cluster._write_files()
            cluster._start_munge()
            cluster._start_slurmctld()
            for host in cluster.hosts:
                cluster._start_slurmd(host)
            cluster._wait_idle()
        except BaseException:
            cluster.close()
            raise
        return cluster

    # -- use ---------------------------------------------------------------------------------

    def run(
        self, argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """A Slurm client command (srun, sbatch, ...) from the login node; never raises on exit."""
        return subprocess.run(
            list(argv),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def jobs(self) -> list[str]:
        """Ids of the jobs Slurm still knows as pending or running."""
        out = self.run(["squeue", "-h", "-o", "%i", "-t", "PD,R,CG,S"], timeout=30)
        return out.stdout.split()

    def wait_no_jobs(self, timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while (left := self.jobs()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def tasks(self) -> dict[str, list[tuple[int, str]]]:
        """Processes on the nodes other than sshd and slurmd (job steps, their tasks)."""
        left = {}
        for host in self.hosts:
            procs = [
                (pid, line) for pid, line in self.net.pids(host) if pid not in self._slurmd_pids
            ]
            if procs:
                left[host] = procs
        return left

    def wait_no_tasks(self, timeout: float = 10) -> dict[str, list[tuple[int, str]]]:
        deadline = time.monotonic() + timeout
        while (left := self.tasks()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def kill_tasks(self) -> dict[str, list[tuple[int, str]]]:
        """SIGKILL every task on every node (test isolation); slurmd and sshd stay."""
        killed = self.tasks()
        for procs in killed.values():
            for pid, _ in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return killed

    @property
    def _slurmd_pids(self) -> set[int]:
        return {p.pid for name, p in self._daemons.items() if name in self.hosts}

    def log(self, name: str) -> str:
        """The tail of a daemon log: ``slurmctld``, ``munged`` or a host (its slurmd)."""
        path = os.path.join(self.dir, "log", f"{name}.log")
        try:
            with open(path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError as exc:
            return f"(no log {path}: {exc})"

    def close(self) -> None:
        """Stop every job, daemon and namespace this cluster made. Idempotent."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)
        try:
            for proc in self._daemons.values():  # our children: slurmctld, munged, slurmd chains
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            for proc in self._daemons.values():
                with contextlib.suppress(Exception):
                    proc.wait(timeout=5)
        finally:
            self.net.close()  # everything left in the namespaces, links, files

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bring-up ----------------------------------------------------------------------------

    def _write_files(self) -> None:
        d = self.dir
        for sub in ("munge", "log", "state", "spool", "tmp", "etc"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        # munged wants the socket directory world-searchable, and so every directory above
        for path in (self.net.state_dir, d, os.path.join(d, "munge")):
            os.chmod(path, 0o755)
        for host in self.hosts:
            os.makedirs(os.path.join(d, "tmp", host), exist_ok=True)
            os.makedirs(os.path.join(d, "spool", host), exist_ok=True)
        key = os.path.join(d, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        nodes = "\n".join(
            f"NodeName={h} NodeAddr={self.net.address(h)} CPUs={CPUS_PER_NODE} State=UNKNOWN"
            for h in self.hosts
        )
        text = f"""\
# zlaunch Slurm test cluster {self.net.prefix} on {self.net.subnet}
ClusterName=zl{self.net.prefix.replace("-", "")[-6:]}
SlurmctldHost={self.controller_host}({self.net.controller_address})
SlurmctldPort={self.ctld_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/%n.log
TmpFS={d}/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
EnforcePartLimits=ALL
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
KillWait=3
InactiveLimit=0
MinJobAge=30
MailProg=/bin/true
PlugStackConfig={d}/etc/plugstack.conf
{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        _write(self.conf, text)
        _write(os.path.join(d, "etc", "plugstack.conf"), "")
        _write(os.path.join(d, "cgroup.conf"), "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(os.path.join(self.dir, "log", f"{name}.out"), "wb")  # noqa: SIM115
        with log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                start_new_session=True,  # a terminal's Ctrl-C must not reach them
            )
        self._daemons[name] = proc
        return proc

    def _start_munge(self) -> None:
        m = os.path.join(self.dir, "munge")
        proc = self._spawn("munged", [
            _which("munged"), "--foreground", "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={m}/munge.key",
            f"--pid-file={m}/munged.pid",
            f"--seed-file={m}/munged.seed",
            f"--log-file={self.dir}/log/munged.log",
        ])  # fmt: skip
        self._wait("munged", proc, lambda: os.path.exists(self.munge_socket), self.log("munged"))

    def _start_slurmctld(self) -> None:
        proc = self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", self.conf])
        addr = (self.net.controller_address, self.ctld_port)
        self._wait("slurmctld", proc, lambda: _answers(addr), "slurmctld")

    def _start_slurmd(self, host: str) -> None:
        ns = self.net.namespace(host)
        hosts_file = os.path.join("/etc/netns", ns, "hosts")
        script = 'mount --bind "$1" /etc/hosts && hostname "$2" && exec "$3" -D -N "$2" -f "$4"'
        self._spawn(host, [
            _which("nsenter"), f"--net=/run/netns/{ns}",
            _which("unshare"), "--uts", "--mount",
            "sh", "-c", script, "sh", hosts_file, host, _which("slurmd"), self.conf,
        ])  # fmt: skip

    def _wait_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if all(states.get(h) == "idle" for h in self.hosts):
                return
            for name, proc in self._daemons.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited with {proc.returncode} during bring-up:\n"
                        f"{self._output(name)}\n{self.log(name)}"
                    )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"nodes not idle after {timeout:.0f} s: {states or out.stderr.strip()}\n"
                    f"{self.log('slurmctld')}"
                )
            time.sleep(0.1)

    def _wait(self, name: str, proc: subprocess.Popen, ready, log_name: str) -> None:
        deadline = time.monotonic() + 15
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(
                    f"{name} did not come up:\n{self._output(name)}\n{self.log(log_name)}"
                )
            time.sleep(0.02)

    def _output(self, name: str) -> str:
        try:
            with open(os.path.join(self.dir, "log", f"{name}.out"), errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""


def _answers(addr: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(addr, timeout=1):
            return True
    except OSError:
        return False


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


_LIVE: list[SlurmCluster] = []


def _close_all() -> None:
    for cluster in list(_LIVE):
        if cluster._owner_pid == os.getpid():
            with contextlib.suppress(Exception):
                cluster.close()


_PREVIOUS: dict[int, object] = {}


def _on_signal(signum: int, frame: object) -> None:
    # Our root-namespace daemons first; then the SSH cluster's handler (namespaces) or default.
    _close_all()
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    if _PREVIOUS or threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        _PREVIOUS[signum] = signal.getsignal(signum)
        signal.signal(signum, _on_signal)


atexit.register(_close_all)
