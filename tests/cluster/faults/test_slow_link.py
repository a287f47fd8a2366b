"""`zlaunch check --perf` on the real SSH test cluster with one slow host at a time: node2's
interface held to 2 Mbit/s by a token bucket (this kernel has tbf, not netem), then node2's CPU
held to a quarter core by a cgroup v1 quota. The network check, through gloo between the three
hosts' own probes, names exactly node2's network, outbound, with its figure and factor, and no
other host or link, and leaves node2 out of the written hostfile; the compute figure names
exactly node2. No probe is left on any host afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.faults.common import REPO
from tests.integration.launcher.helpers import idle_cluster  # noqa: F401 - autouse fixture

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

SLOW = ("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2mbit", "burst", "16kb",
        "latency", "200ms")  # fmt: skip
HEAL = ("tc", "qdisc", "del", "dev", "eth0", "root")


def test_check_perf_names_exactly_the_rate_limited_hosts_network(cluster, tmp_path):
    def on_node2(command):
        return subprocess.run(["ip", "netns", "exec", cluster.namespace("node2"), *command],
                              capture_output=True, text=True, check=False)  # fmt: skip

    written = tmp_path / "healthy"
    added = on_node2(SLOW)
    assert added.returncode == 0, added.stderr
    try:
        result = subprocess.run(
            [sys.executable, "-m", "zlaunch", "check", "--hostfile", cluster.hostfile(1),
             "--ssh-config", cluster.ssh_config, "--perf", "--json",
             "--checkpoint-dir", str(tmp_path), "--write-hostfile", str(written)],
            capture_output=True, text=True, timeout=240, cwd=REPO,
        )  # fmt: skip
    finally:
        on_node2(HEAL)
    assert result.returncode == 1, result.stderr[-3000:]  # a host stands out
    report = json.loads(result.stdout)
    network = report["network"]
    assert network is not None and network["backend"] == "gloo", result.stderr[-3000:]
    assert len(network["links"]) == 6  # a ring of 3, both ways
    outliers = network["outliers"]
    assert outliers and all((o["host"], o["dst"]) == ("node2", None) for o in outliers), outliers
    (bandwidth,) = [o for o in outliers if o["figure"] == "bandwidth"]
    assert not bandwidth["inbound"] and bandwidth["factor"] >= 5, bandwidth
    assert bandwidth["text"].startswith("network of node2 (outbound): bandwidth ")
    problems = {h["host"]: " ".join(h["problems"]) for h in report["hosts"]}
    assert bandwidth["text"] in problems["node2"]
    assert "network" not in problems["node1"] + problems["node3"], problems
    assert "node2" not in written.read_text()


CPU_CGROUP = "/sys/fs/cgroup/cpu"


def test_check_perf_names_exactly_the_cpu_throttled_host(cluster, tmp_path):
    """node2's sshd (and so everything started on node2 over ssh) in a cgroup v1 CPU quota of
    a tenth of one core: the compute figure names exactly node2, with figure and factor. (A
    quarter core was named alone, but not when the suite's other worker kept both cores
    busy: then every host's probe got about as little.)"""
    if not os.path.isfile(os.path.join(CPU_CGROUP, "cpu.cfs_quota_us")):
        pytest.fail("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu (this suite needs one)")
    group = os.path.join(CPU_CGROUP, f"zlaunch-slow-{os.getpid()}")
    os.mkdir(group)
    sshd = cluster._sshd["node2"].pid
    try:
        Path(group, "cpu.cfs_period_us").write_text("100000")
        Path(group, "cpu.cfs_quota_us").write_text("10000")
        Path(group, "cgroup.procs").write_text(str(sshd))
        result = subprocess.run(
            [sys.executable, "-m", "zlaunch", "check", "--hostfile", cluster.hostfile(1),
             "--ssh-config", cluster.ssh_config, "--perf", "--json",
             "--checkpoint-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=240, cwd=REPO,
        )  # fmt: skip
    finally:
        Path(CPU_CGROUP, "cgroup.procs").write_text(str(sshd))
        left = cluster.wait_idle(timeout=10.0)  # every probe gone from node2 (and the group)
        cluster.kill_all()
        os.rmdir(group)
    assert not left, f"processes left on the cluster: {left}"
    report = json.loads(result.stdout)
    compute = [o for o in report["outliers"] if o["figure"] == "compute"]
    assert [o["host"] for o in compute] == ["node2"], (report["outliers"], result.stderr[-2000:])
    assert compute[0]["factor"] >= 1.5, compute
    problems = {h["host"]: " ".join(h["problems"]) for h in report["hosts"]}
    assert "compute " in problems["node2"] and "x below the median" in problems["node2"]
    assert "compute " not in problems["node1"] + problems["node3"], problems
