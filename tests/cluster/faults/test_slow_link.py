"""`zlaunch check --perf` on the real SSH test cluster with one slow link: node2's interface held
to 2 Mbit/s by a token bucket (this kernel has tbf, not netem). The network check, through gloo
between the three hosts' own probes, names exactly node2's network, outbound, with its figure
and factor, and no other host or link; node2 is left out of the written hostfile and every
probe is gone from every host afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

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
