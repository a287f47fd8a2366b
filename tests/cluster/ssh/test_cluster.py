"""The namespace test cluster is a real cluster: real sshd, real names, real torch traffic."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cluster import Cluster, find_prefixes, netns, reap_stale, unavailable_reason
from tests.cluster.naming import owner_alive

pytestmark = pytest.mark.cluster

needs_cluster = pytest.mark.skipif(
    unavailable_reason() is not None, reason=unavailable_reason() or ""
)


def test_ssh_hostname_is_the_node_name(cluster):
    assert cluster.hosts == ["node1", "node2", "node3"]
    for host in cluster.hosts:
        out = subprocess.run(
            ["ssh", "-F", cluster.ssh_config, host, "hostname"],
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"{host}\n"


def test_every_host_reaches_every_other_by_name(cluster):
    probe = textwrap.dedent(
        """
        import json, socket, sys
        result = {}
        for name in sys.argv[1:]:
            address = socket.gethostbyname(name)
            with socket.create_connection((name, 22), timeout=5) as s:
                banner = s.recv(64).decode(errors="replace")
            result[name] = [address, banner.startswith("SSH-2.0-")]
        print(json.dumps({"me": socket.gethostname(), "peers": result}))
        """
    )
    for host in cluster.hosts:
        others = [h for h in cluster.hosts if h != host]
        cmd = f"{sys.executable} -c '{probe}' {' '.join(others)}"
        out = cluster.run(host, cmd, timeout=30)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["me"] == host
        assert report["peers"] == {h: [cluster.address(h), True] for h in others}


def test_gloo_all_reduce_across_hosts(cluster):
    script = textwrap.dedent(
        """
        import datetime, socket, torch, torch.distributed as dist
        import zlaunch  # the editable install is visible on every node
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print(socket.gethostname(), dist.get_rank(), int(t.item()))
        dist.destroy_process_group()
        """
    )
    port = random.randint(20000, 40000)  # node1 has its own network namespace: all ports free
    procs = []
    for rank, host in enumerate(cluster.hosts):
        env = (
            f"RANK={rank} WORLD_SIZE={len(cluster.hosts)} MASTER_ADDR={cluster.address('node1')} "
            f"MASTER_PORT={port} GLOO_SOCKET_IFNAME={cluster.interface}"
        )
        cmd = f"env {env} {sys.executable} -c '{script}'"
        procs.append(
            subprocess.Popen(
                cluster.ssh_argv(host, cmd),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        )
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        outputs.append(out.split())
    total = sum(range(1, len(cluster.hosts) + 1))
    assert outputs == [[host, str(rank), str(total)] for rank, host in enumerate(cluster.hosts)]
    assert cluster.wait_idle() == {}


def test_fabric_uses_the_ssh_config(cluster):
    fabric = pytest.importorskip("fabric")
    config = fabric.Config(runtime_ssh_path=cluster.ssh_config)
    for host in cluster.hosts:
        with fabric.Connection(host, config=config) as conn:
            # in_stream=False: fabric otherwise reads our stdin in a thread (pytest's raises).
            assert conn.run("hostname", hide=True, in_stream=False).stdout == f"{host}\n"
            assert conn.host == cluster.address(host) and conn.user == "root"


def test_pids_lists_processes_started_over_ssh(cluster):
    assert cluster.wait_idle() == {}  # sshd itself is not listed
    out = cluster.run("node2", "nohup sleep 300 >/dev/null 2>&1 & echo $!")
    pid = int(out.stdout)
    try:
        # The shell prints the pid as soon as it forks; nohup execs sleep a moment later.
        deadline = time.monotonic() + 5.0
        while (pid, "sleep 300") not in cluster.pids("node2") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (pid, "sleep 300") in cluster.pids("node2")
        assert all(pid != p for p, _ in cluster.pids("node1"))
    finally:
        killed = cluster.kill_all()
    assert pid in [p for p, _ in killed["node2"]]
    assert cluster.wait_idle() == {}


def _leftovers(prefix: str) -> list[str]:
    """Everything on the machine that carries ``prefix``, observed with the plain tools."""
    found = []
    for argv in (["ip", "netns", "list"], ["ip", "-o", "link", "show"]):
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        found += [f"{argv[1]}: {line}" for line in out.splitlines() if prefix in line]
    if os.path.isdir("/etc/netns"):
        found += [f"/etc/netns/{n}" for n in os.listdir("/etc/netns") if prefix in n]
    found += [f"/tmp/{n}" for n in os.listdir("/tmp") if prefix in n]
    found += [f"pid {p}: {netns.cmdline(p)}" for p in _processes_mentioning(prefix)]
    return found


def _is_dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its (re)parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:  # gone (ENOENT), or reaped between open and read (ESRCH)
        return True


def _processes_mentioning(prefix: str) -> list[int]:
    return [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and int(p) != os.getpid() and prefix in netns.cmdline(int(p))
    ]


def test_teardown_leaves_nothing_behind(cluster):
    with Cluster.start(n=2) as c:
        prefix = c.prefix
        # Two clusters side by side: own prefix, own subnet, own names for the same node names.
        assert prefix != cluster.prefix and not c.subnet.overlaps(cluster.subnet)
        assert c.run("node2", "hostname").stdout == "node2\n"
        sshd = [p.pid for p in c._sshd.values()]
        sleeper = int(c.run("node1", "nohup sleep 300 >/dev/null 2>&1 & echo $!").stdout)
        assert prefix in find_prefixes()
        assert len(_leftovers(prefix)) >= 2 + 2 + 1  # namespaces, veths, bridge at least
    assert _leftovers(prefix) == []
    assert not os.path.exists(c.state_dir)
    for pid in [*sshd, sleeper]:
        assert _is_dead(pid), netns.cmdline(pid)
    assert prefix not in find_prefixes()
    assert cluster.run("node1", "hostname").stdout == "node1\n"  # the other one is untouched


REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
OWNER = (
    # SIGINT as in a terminal, even where the test runner was started with it ignored.
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "import time; from tests.cluster import Cluster; c = Cluster.start(n=2); "
    "c.run('node1', 'nohup sleep 300 >/dev/null 2>&1 &'); "
    "print(c.prefix, flush=True); time.sleep(120)"
)


def _start_owner() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    prefix = proc.stdout.readline().strip()
    assert prefix, "owner failed to start a cluster"
    return proc, prefix


def _wait_gone(prefix: str, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := _leftovers(prefix)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@needs_cluster
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_the_owner_tears_down(signum):
    proc, prefix = _start_owner()
    assert _leftovers(prefix)
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == -signum  # torn down, then died of the signal as asked
    assert _wait_gone(prefix) == []


@needs_cluster
def test_leftovers_of_a_killed_owner_are_reaped():
    proc, prefix = _start_owner()
    proc.kill()
    proc.wait(timeout=10)
    assert _leftovers(prefix), "a SIGKILLed owner cannot clean up: leftovers expected"
    assert prefix in reap_stale()
    assert _wait_gone(prefix) == []


@needs_cluster
def test_fixture_tears_down_after_a_failing_test(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import cluster  # noqa: F401\n")
    (tmp_path / "test_inner.py").write_text(
        "def test_fails(cluster):\n"
        f"    open({str(tmp_path / 'prefix')!r}, 'w').write(cluster.prefix)\n"
        "    assert False, 'deliberate'\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": REPO_ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "deliberate" in out.stdout
    prefix = (tmp_path / "prefix").read_text()
    assert _leftovers(prefix) == []


@needs_cluster
def test_command_line_up_status_down():
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "tests.cluster", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    up = cli("up", "-n", "2", "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    try:
        assert info["hosts"] == ["node1", "node2"]
        ssh = subprocess.run(
            ["ssh", "-F", info["ssh_config"], "node2", "hostname"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert ssh.stdout == "node2\n", ssh.stderr
        assert info["prefix"] in cli("status").stdout
        with open(info["hostfile"]) as f:
            assert f.read() == "node1 slots=2\nnode2 slots=2\n"
        # A bare `down` stops no live cluster (other people's may be on this machine too).
        bare = cli("down")
        assert bare.returncode == 2, bare.stderr
        assert info["prefix"] in bare.stderr and "--all" in bare.stderr
        assert owner_alive(info["owner_pid"])
        assert cli("down", "nosuchprefix").returncode == 2
    finally:
        down = cli("down", info["prefix"])
    assert down.returncode == 0, down.stderr
    assert f"removed {info['prefix']}" in down.stdout
    assert _leftovers(info["prefix"]) == []
    assert not owner_alive(info["owner_pid"])


def test_usage_text_names_the_hostfile_and_a_zlaunch_command(tmp_path, capsys):
    from tests.cluster.__main__ import _print_usage

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    info = {
        "prefix": "zt1",
        "owner_pid": 1,
        "hosts": ["node1", "node2"],
        "addresses": {"node1": "10.0.0.2", "node2": "10.0.0.3"},
        "namespaces": {"node1": "zt1-node1", "node2": "zt1-node2"},
        "ssh_config": "/tmp/ssh_config",
        "hostfile": str(hostfile),
    }
    _print_usage(info)
    out = capsys.readouterr().out
    assert f"hostfile:   {hostfile}" in out
    assert "node2 slots=2" in out
    assert f"zlaunch --hostfile {hostfile} --ssh-config /tmp/ssh_config" in out


def test_unavailable_reason_names_what_is_missing(monkeypatch):
    from tests.cluster import cluster as cluster_module
    from tests.cluster import sshfiles

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert unavailable_reason() == (
        "test cluster needs root (network namespaces); running as uid 1000"
    )
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(sshfiles, "SSHD", "")
    assert unavailable_reason() == "test cluster needs `sshd` (apt-get install openssh-server)"
    monkeypatch.setattr(sshfiles, "SSHD", "/usr/sbin/sshd")
    monkeypatch.setattr(cluster_module, "_which", lambda tool: "" if tool == "ip" else "/bin/x")
    assert unavailable_reason() == "test cluster needs `ip` (apt-get install iproute2)"


def test_prefix_names_fit_interface_limits():
    from tests.cluster.naming import PREFIX_RE, bridge_name, new_prefix, owner_of, veth_name

    prefix = new_prefix(owner_pid=4194304)  # the largest pid_max
    assert owner_of(prefix) == 4194304
    assert len(veth_name(prefix, 99)) <= 15 and len(bridge_name(prefix)) <= 15
    assert PREFIX_RE.match(veth_name(prefix, 3)).group(1) == prefix
