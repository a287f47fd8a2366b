"""The launcher on the real test cluster: 3 hosts x 2 slots, real sshd, real torch.distributed.

Every "gone" is checked by listing each host's processes (``cluster.pids``), never by trusting
zlaunch. Timings measured here are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster import ipv6_unavailable_reason
from tests.integration.launcher import fake_worker, helpers
from tests.integration.launcher.helpers import alive, seconds_until

pytestmark = pytest.mark.cluster

FAKE = fake_worker.__file__
HOSTS = 3
SLOTS = 2
WORLD = HOSTS * SLOTS

idle_cluster = helpers.idle_cluster  # autouse: no process left on any host
jobs = helpers.jobs


def job_processes(cluster) -> dict[str, list]:
    return {h: p for h in cluster.hosts if (p := cluster.pids(h))}


def wait_cluster_idle(cluster, timeout: float) -> float | None:
    """Seconds until no host has a process (polled every 20 ms), None after ``timeout``."""
    return seconds_until(lambda: not job_processes(cluster), timeout)


class Job(helpers.Job):
    def __init__(self, cluster, tmp: Path, worker_args, *options, hostfile=None, name="job"):
        records, runs = tmp / f"{name}-records", tmp / f"{name}-runs"
        argv = [
            sys.executable, "-m", "zlaunch",
            "--hostfile", hostfile or cluster.hostfile(SLOTS),
            "--ssh-config", cluster.ssh_config,
            "--log-dir", str(runs),
            *options,
            FAKE, "--record-dir", str(records), *worker_args,
        ]  # fmt: skip
        super().__init__(
            argv, tmp, records=records, runs=runs, ranks=WORLD, timeout=120, ready_timeout=60
        )


def launch(jobs, *args, **kwargs) -> Job:
    job = Job(*args, **kwargs)
    jobs.append(job)
    return job


def test_exact_env_per_rank_and_gloo_allreduce_across_hosts(cluster, jobs, tmp_path):
    job = launch(jobs, cluster, tmp_path, ["--allreduce"])
    code, out, err = job.communicate()
    assert code == 0, err
    records = [json.loads((job.records / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    master = cluster.address("node1")
    port = records[0]["env"]["MASTER_PORT"]
    assert port.isdigit()
    for rank, rec in enumerate(records):
        node = rank // SLOTS
        expected = {
            "RANK": str(rank), "LOCAL_RANK": str(rank % SLOTS), "WORLD_SIZE": str(WORLD),
            "LOCAL_WORLD_SIZE": str(SLOTS), "NODE_RANK": str(node), "NUM_NODES": str(HOSTS),
            "MASTER_ADDR": master, "MASTER_PORT": port, "CUDA_VISIBLE_DEVICES": "0,1",
            "GLOO_SOCKET_IFNAME": cluster.interface,
        }  # fmt: skip
        assert {k: rec["env"].get(k) for k in expected} == expected
        assert rec["hostname"] == cluster.hosts[node]
        assert rec["allreduce"] == WORLD * (WORLD + 1) // 2
    # Nothing secret or environment-like travelled on a command line: the agents' argv.
    run = json.loads((job.run_dir() / "run.json").read_text())
    assert run["status"] == "succeeded"
    # c10d's reverse-DNS warning (the nodes have no reverse DNS for v4-mapped addresses) stays
    # in the rank logs; the console says so once.
    warning = "hostname of the client socket cannot be retrieved"
    assert warning not in out
    logged = sum(log.read_text().count(warning) for log in job.run_dir().glob("attempt-0/*/*.log"))
    assert logged >= 1  # every rank prints it on the test cluster
    assert err.count("hid c10d's 'hostname of the client socket") == 1, err


@pytest.mark.parametrize("local_first", [True, False], ids=["master-here", "master-remote"])
def test_this_machine_and_ssh_hosts_in_one_job(cluster, jobs, tmp_path, local_first):
    """`localhost` (no ssh) beside two ssh hosts: the master address and the gloo interface
    are the ones the other side can reach, never 127.0.0.1 or lo."""
    remote = [f"{h} slots={SLOTS}" for h in cluster.hosts[1:]]
    lines = ["localhost slots=2", *remote] if local_first else [*remote, "localhost slots=2"]
    hostfile = tmp_path / "mixed-hosts"
    hostfile.write_text("\n".join(lines) + "\n")
    job = launch(jobs, cluster, tmp_path, ["--allreduce"], hostfile=str(hostfile))
    code, out, err = job.communicate()
    assert code == 0, err
    records = [json.loads((job.records / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    names = [line.split()[0] for line in lines]
    master = cluster.controller_address if local_first else cluster.address(names[0])
    here = os.uname().nodename
    for rank, rec in enumerate(records):
        host = names[rank // SLOTS]
        assert rec["hostname"] == (here if host == "localhost" else host)
        assert rec["env"]["MASTER_ADDR"] == master
        # this machine reaches the nodes through the cluster's bridge, a node through its veth
        iface = cluster.bridge if host == "localhost" else cluster.interface
        assert rec["env"]["GLOO_SOCKET_IFNAME"] == iface, (rank, host)
        assert rec["allreduce"] == WORLD * (WORLD + 1) // 2


def test_bracketed_ipv6_hosts_launch_over_ssh_and_rendezvous_on_ipv6(cluster, jobs, tmp_path):
    if not cluster.ipv6:
        pytest.skip(ipv6_unavailable_reason() or "IPv6 addresses were refused on this machine")
    hostfile = tmp_path / "ipv6-hosts"
    hostfile.write_text("".join(f"[{cluster.address6(h)}] slots={SLOTS}\n" for h in cluster.hosts))
    # --lines: console lines to read the prefixes from (c10d's warnings are off the console)
    job = launch(jobs, cluster, tmp_path, ["--allreduce", "--lines", "2"], hostfile=str(hostfile))
    code, out, err = job.communicate()
    assert code == 0, err
    records = [json.loads((job.records / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    for rank, rec in enumerate(records):
        node = cluster.hosts[rank // SLOTS]
        assert rec["hostname"] == node
        assert rec["env"]["MASTER_ADDR"] == cluster.address6("node1")
        assert rec["env"]["GLOO_SOCKET_IFNAME"] == cluster.interface
        assert rec["allreduce"] == WORLD * (WORLD + 1) // 2
    # console prefixes and per-host log directories name the hosts as the hostfile does
    assert f"[[{cluster.address6('node2')}]:2]" in out
    logs = sorted(p.parent.name for p in job.run_dir().glob("attempt-0/*/rank-*.log"))
    assert len(set(logs)) == HOSTS and all(":" not in name for name in logs), logs


def test_sigkill_of_a_worker_on_node2_stops_every_host(cluster, jobs, tmp_path):
    job = launch(jobs, cluster, tmp_path, ["--hang"])
    records = job.records_ready()
    ready = time.monotonic() - job.started
    victim = next(r for r in records if r["hostname"] == "node2")
    running = job_processes(cluster)
    # the listing sees the job: an agent and two workers on every host
    assert sorted(running) == cluster.hosts and all(len(p) >= 3 for p in running.values())
    killed_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    took = wait_cluster_idle(cluster, 3.0)
    assert took is not None, f"left 3 s after the kill: {job_processes(cluster)}"
    code, out, err = job.communicate(timeout=10)
    print(f"\n[measure] 6 ranks started in {ready:.2f}s; all gone {took:.2f}s after a SIGKILL")
    assert code == 137, err
    assert f"rank {victim['rank']} on node2 was killed by SIGKILL" in err
    failure = json.loads((job.run_dir() / "failure.json").read_text())
    root = failure["root_cause"]
    assert (root["host"], root["rank"], root["pid"]) == (
        "node2",
        int(victim["rank"]),
        victim["pid"],
    )
    assert time.monotonic() - killed_at < 10


def test_sigint_to_zlaunch_stops_every_host_within_grace(cluster, jobs, tmp_path):
    grace = 1.0
    job = launch(
        jobs, cluster, tmp_path, ["--hang", "--ignore-sigterm"], "--grace-period", str(grace)
    )
    job.records_ready()
    job.proc.send_signal(signal.SIGINT)
    took = wait_cluster_idle(cluster, grace + 2.0)
    assert took is not None, f"left {grace + 2}s after SIGINT: {job_processes(cluster)}"
    print(f"\n[measure] SIGINT with grace {grace}s: all gone after {took:.2f}s")
    code, out, err = job.communicate(timeout=10)
    assert code == 130, err
    assert all((job.records / f"rank-{r}.sigterm").exists() for r in range(WORLD))


def test_sigkill_to_zlaunch_stops_every_host_within_10s(cluster, jobs, tmp_path):
    job = launch(jobs, cluster, tmp_path, ["--hang"])
    job.records_ready()
    job.proc.kill()
    job.proc.wait()
    took = wait_cluster_idle(cluster, 10.0)
    assert took is not None, f"left 10 s after zlaunch was killed: {job_processes(cluster)}"
    print(f"\n[measure] zlaunch SIGKILLed: all gone after {took:.2f}s")


def test_ctrl_c_to_one_job_leaves_the_other_running(cluster, jobs, tmp_path):
    first = launch(jobs, cluster, tmp_path, ["--hang"], "--grace-period", "1", name="first")
    second = launch(jobs, cluster, tmp_path, ["--hang"], "--grace-period", "1", name="second")
    first_pids = [r["pid"] for r in first.records_ready()]
    second_pids = [r["pid"] for r in second.records_ready()]
    first.proc.send_signal(signal.SIGINT)
    assert first.communicate(timeout=15)[0] == 130
    assert not [p for p in first_pids if alive(p)]
    time.sleep(1.0)
    assert all(alive(p) for p in second_pids), "stopping one job touched the other"
    second.proc.send_signal(signal.SIGINT)
    assert second.communicate(timeout=15)[0] == 130


def test_six_ranks_of_20000_lines_arrive_intact(cluster, jobs, tmp_path):
    n = 20000
    job = launch(jobs, cluster, tmp_path, ["--lines", str(n)])
    code, out, err = job.communicate(timeout=180)
    took = time.monotonic() - job.started
    assert code == 0, err
    print(f"\n[measure] 6 x {n} lines over ssh in {took:.2f}s")
    want = {
        (r, s): [fake_worker.line(r, q) for q in range(n) if (q % 2 == 0) == (s == "out")]
        for r in range(WORLD)
        for s in ("out", "err")
    }
    console = {key: [] for key in want}
    for text in out.splitlines():
        prefix, _, rest = text.partition(" ")
        host, rank = prefix.strip("[]!").split(":")
        assert host == cluster.hosts[int(rank) // SLOTS]
        console[(int(rank), "err" if prefix.endswith("!") else "out")].append(rest)
    assert console == want
    for r in range(WORLD):
        path = job.run_dir() / "attempt-0" / cluster.hosts[r // SLOTS] / f"rank-{r}.log"
        lines = path.read_text().splitlines()
        assert len(lines) == n
        for s in ("out", "err"):
            assert [x for x in lines if f"stream={s} " in x] == want[(r, s)]


def _with_extra_host(cluster, tmp_path: Path, line: str) -> str:
    text = Path(cluster.hostfile(SLOTS)).read_text() + line + "\n"
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case", ["silent-address", "closed-port"])
def test_unreachable_host_is_named_and_nothing_keeps_running(cluster, jobs, tmp_path, case):
    if case == "silent-address":
        net = ipaddress.ip_network(f"{cluster.address('node1')}/24", strict=False)
        bad = str(net[250])  # on the bridge's subnet, nobody answers
        line = f"{bad} slots=2"
    else:
        bad = cluster.address("node3")
        line = f"{bad} slots=2 port=2222"  # the host is up, its sshd is not on that port
    hostfile = _with_extra_host(cluster, tmp_path, line)
    job = launch(jobs, cluster, tmp_path, ["--hang"], "--ssh-timeout", "3", hostfile=hostfile)
    code, out, err = job.communicate(timeout=30)
    took = time.monotonic() - job.started
    assert code == 1, err
    assert bad in err and "ssh" in err, err
    assert took < 3 + 8, took
    print(f"\n[measure] {case}: error after {took:.2f}s:\n{err}")
    assert not job_processes(cluster)
    assert not job.records.exists() or not list(job.records.iterdir())


def test_check_reaches_every_host_and_names_the_broken_one(cluster, tmp_path):
    bad = cluster.address("node3")
    hostfile = _with_extra_host(cluster, tmp_path, f"{bad} slots=2 port=2222")
    out = subprocess.run(
        [
            sys.executable, "-m", "zlaunch", "check", "--hostfile", hostfile,
            "--ssh-config", cluster.ssh_config, "--ssh-timeout", "3", "--chdir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    lines = [line.replace(" (master)", "") for line in out.stdout.splitlines()[2:]]
    rows = {line.split()[0]: line for line in lines}
    for host in cluster.hosts:
        assert rows[host].split()[1] == "ok" and rows[host].rstrip().endswith("ok"), rows[host]
    assert "FAILED" in rows[bad] and "2222" in rows[bad]
    assert "3 of 4 hosts ready" in out.stdout


def _check_with_known_hosts(cluster, tmp_path: Path, known: str) -> subprocess.CompletedProcess:
    """`zlaunch check` through the cluster's ssh config (StrictHostKeyChecking yes) with
    ``known`` as the known_hosts file."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(known)
    config = Path(cluster.ssh_config).read_text()
    config = config.replace(
        f"UserKnownHostsFile {cluster.known_hosts}", f"UserKnownHostsFile {known_hosts}"
    )
    assert str(known_hosts) in config
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(config)
    return subprocess.run(
        [
            sys.executable, "-m", "zlaunch", "check", "--hostfile", cluster.hostfile(SLOTS),
            "--ssh-config", str(ssh_config), "--ssh-timeout", "5", "--chdir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_host_keys_are_checked_against_known_hosts(cluster, tmp_path):
    lines = Path(cluster.known_hosts).read_text().splitlines()
    by_host = {line.split(",")[0]: line.split(" ", 1)[1] for line in lines}
    # node2's entry carries node1's key: as if node2 had been replaced by another machine
    forged = [
        f"{h},{cluster.address(h)} {by_host['node1' if h == 'node2' else h]}" for h in cluster.hosts
    ]
    out = _check_with_known_hosts(cluster, tmp_path, "\n".join(forged) + "\n")
    assert out.returncode == 1, out.stdout + out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[2:] if line.strip()}
    assert "FAILED" in rows["node2"] and "host key changed" in rows["node2"], out.stdout
    assert all(rows[h].rstrip().endswith("ok") for h in ("node1", "node3")), out.stdout

    # StrictHostKeyChecking yes and no entry at all: refused, with the command that fixes it
    out = _check_with_known_hosts(cluster, tmp_path, "")
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.count("not in known_hosts") == len(cluster.hosts), out.stdout
    assert "ssh-keyscan" in out.stdout + out.stderr
    assert not job_processes(cluster)


def test_lost_ssh_link_to_one_host_stops_the_job_everywhere(cluster, jobs, tmp_path):
    job = launch(jobs, cluster, tmp_path, ["--hang"])
    job.records_ready()
    sessions = [
        pid for pid, cmd in cluster.pids("node2", include_sshd=True) if cmd.startswith("sshd")
    ]
    assert sessions, cluster.pids("node2", include_sshd=True)
    for pid in sessions:  # the link dies: the agent loses its stdin, zlaunch its channel
        os.kill(pid, signal.SIGKILL)
    took = wait_cluster_idle(cluster, 10.0)
    assert took is not None, f"left 10 s after the link was cut: {job_processes(cluster)}"
    code, out, err = job.communicate(timeout=15)
    print(f"\n[measure] ssh link to node2 cut: all gone after {took:.2f}s")
    assert code == 1, err
    assert "node2" in err and "connection to the agent lost" in err
    # node2's ranks ended unseen: recorded and shown as lost, the others as stopped by SIGTERM
    ranks = json.loads((job.run_dir() / "ranks.json").read_text())["ranks"]
    states = {r["rank"]: r["state"] for r in ranks}
    node2 = {r["rank"] for r in ranks if r["host"] == "node2"}
    assert node2 == {2, 3} and all(states[r] == "lost" for r in node2), states
    assert all(states[r] == "exited" for r in set(states) - node2), states
    status = subprocess.run(
        [sys.executable, "-m", "zlaunch", "status", "--log-dir", str(job.runs), "--no-color"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    lost_rows = [line for line in status.stdout.splitlines() if "lost (connection" in line]
    assert len(lost_rows) == 2 and all("node2" in line for line in lost_rows), status.stdout
