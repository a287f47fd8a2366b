"""Network faults on the real SSH test cluster: each ends in a clean, explained outcome, with
no process of the job left on any host.

* node2's link goes down mid-run: its agent hears no heartbeat and stops its worker within
  seconds; the controller hears nothing from node2 (agents echo every heartbeat) and takes it
  as lost after AGENT_SILENCE_TIMEOUT; with --min-nodes 2 the job goes on with node1 and node3.
* node2 cut off by a firewall rule in its namespace (it still sends, hears nothing): its agent
  stops its worker and says it lost the controller's heartbeat, which drops node2 at once.
* the controller loses its route to node2 for 10 s, then gets it back: node2's agent stops its
  worker (no heartbeat); the job is restarted on the same three hosts (--max-restarts 1, no
  --min-nodes) and completes.
* the checkpoint directory fills up during a save: the save fails with a clear error, `latest`
  keeps naming the previous, complete checkpoint.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tests.cluster.faults.common import REPO, STEPS, attempts, elastic_job, losses
from tests.integration.launcher.helpers import idle_cluster, seconds_until  # noqa: F401 - autouse fixture

pytestmark = [pytest.mark.cluster, pytest.mark.faults]


def _start(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _ns(cluster, host: str, *cmd: str) -> None:
    subprocess.run(["ip", "netns", "exec", cluster.namespace(host), *cmd], check=True)


def _run_with_fault(cluster, tmp_path, flags, inject, heal):
    """Start the elastic job, inject the fault at step 5 (after a checkpoint), heal at the end."""
    job = _start(elastic_job(cluster, tmp_path, *flags))
    try:
        reached = seconds_until(
            lambda: (
                (tmp_path / "ckpt" / "latest").exists()
                and any(r["step"] >= 5 for r in losses(tmp_path / "out"))
            ),
            120,
        )
        assert reached is not None, "the job never reached step 5"
        inject()
        node2_gone = seconds_until(lambda: not cluster.pids("node2"), 30)
        text, _ = job.communicate(timeout=300)
    finally:
        heal()
        if job.poll() is None:
            job.kill()
    return job.returncode, text, node2_gone


def _continued_on_two_hosts(tmp_path, text, code):
    assert code == 0, text[-4000:]
    # node2 is dropped as soon as the controller hears of it (its agent's silence, or its agent
    # saying it heard no heartbeat); on a loaded machine a rank may fail first on node2's
    # closed connection, and the restart, unable to reach node2, goes on without it
    heard = ("no word from the agent" in text or "no heartbeat" in text) and (
        "restarting on node1, node3 without node2 (world 2)" in text
    )
    unreachable = (
        "ssh to node2 timed out after 10s; going on without node2 on node1, node3 (world 2)" in text
    )
    assert heard or unreachable, text[-4000:]
    assert [a["hosts"] for a in attempts(tmp_path)] == [
        ["node1", "node2", "node3"],
        ["node1", "node3"],
    ]
    assert max(r["step"] for r in losses(tmp_path / "out")) == STEPS


CUT_OFF = {
    # node2's link goes down: nothing in or out
    "link_down": (("ip", "link", "set", "eth0", "down"), ("ip", "link", "set", "eth0", "up")),
    # a firewall rule in node2's namespace: it still sends, hears nothing
    "firewall": (
        ("iptables", "-I", "INPUT", "-i", "eth0", "-j", "DROP"),
        ("iptables", "-F", "INPUT"),
    ),
}


@pytest.mark.parametrize("fault", sorted(CUT_OFF))
def test_node_cut_off_goes_on_without_it(cluster, tmp_path, fault):
    inject, heal = CUT_OFF[fault]
    if shutil.which(inject[0]) is None:
        pytest.skip(f"{inject[0]} is not installed")
    code, text, gone = _run_with_fault(
        cluster,
        tmp_path,
        ("--max-restarts", "1", "--min-nodes", "2"),
        inject=lambda: _ns(cluster, "node2", *inject),
        heal=lambda: _ns(cluster, "node2", *heal),
    )
    assert gone is not None, f"node2's worker outlived the fault ({fault})"
    _continued_on_two_hosts(tmp_path, text, code)


def test_controller_route_lost_for_ten_seconds(cluster, tmp_path):
    address = cluster.address("node2")
    state = {}

    def cut():
        subprocess.run(["ip", "route", "add", "blackhole", f"{address}/32"], check=True)
        state["since"] = time.monotonic()

    def restore():
        if "since" in state:
            time.sleep(max(0.0, 10.0 - (time.monotonic() - state["since"])))
            subprocess.run(["ip", "route", "del", "blackhole", f"{address}/32"], check=False)
            state.pop("since")

    # Training goes on during the cut (the nodes reach each other over the bridge, not through
    # the controller's routes): enough steps must remain for node2's agent to miss 5 s of
    # heartbeats before the job could finish without noticing.
    steps = 40
    job = _start(elastic_job(cluster, tmp_path, "--max-restarts", "1", steps=steps))
    try:
        reached = seconds_until(lambda: any(r["step"] >= 5 for r in losses(tmp_path / "out")), 120)
        assert reached is not None
        cut()
        node2_gone = seconds_until(lambda: not cluster.pids("node2"), 30)
        restore()
        text, _ = job.communicate(timeout=300)
    finally:
        restore()
        if job.poll() is None:
            job.kill()
    assert node2_gone is not None, "node2's worker outlived the lost route"
    assert job.returncode == 0, text[-4000:]
    assert "restarting all ranks" in text
    hosts = [a["hosts"] for a in attempts(tmp_path)]
    assert hosts == [["node1", "node2", "node3"]] * 2
    assert max(r["step"] for r in losses(tmp_path / "out")) == steps


# This kernel has no netem: loss comes from a firewall rule dropping a share of node2's packets
# at random (both ways), slowness from a token bucket on its link (a queue of up to 200 ms).
LOSSY = (
    ("iptables", "-I", "INPUT", "-i", "eth0", "-m", "statistic", "--mode", "random",
     "--probability", "0.2", "-j", "DROP"),
    ("iptables", "-I", "OUTPUT", "-o", "eth0", "-m", "statistic", "--mode", "random",
     "--probability", "0.2", "-j", "DROP"),
    ("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2mbit", "burst", "16kb",
     "latency", "200ms"),
)  # fmt: skip
HEAL_LOSSY = (
    ("iptables", "-F", "INPUT"),
    ("iptables", "-F", "OUTPUT"),
    ("tc", "qdisc", "del", "dev", "eth0", "root"),
)


def test_lossy_slow_link_completes_or_is_explained(cluster, tmp_path):
    """20% packet loss each way and a 2 Mbit/s link on node2. TCP retransmits hide the loss
    from gloo and from the agent's link; what can break is the agent's heartbeat deadline when
    retransmissions back off long enough. So the job either completes (slower) or stops with
    node2's missed heartbeat named, and restarts without it: never a silent hang."""

    dropped = []

    def heal():
        # the fault really bit: the random rules dropped packets before they are flushed
        listing = subprocess.run(
            ["ip", "netns", "exec", cluster.namespace("node2"), "iptables", "-nvxL"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        dropped.extend(
            int(line.split()[0]) for line in listing.stdout.splitlines() if "statistic" in line
        )
        for command in HEAL_LOSSY:
            subprocess.run(["ip", "netns", "exec", cluster.namespace("node2"), *command],
                           check=False, capture_output=True)  # fmt: skip

    def inject():
        for command in LOSSY:
            _ns(cluster, "node2", *command)

    flags = ("--max-restarts", "1", "--min-nodes", "2")
    code, text, _ = _run_with_fault(cluster, tmp_path, flags, inject=inject, heal=heal)
    assert len(dropped) == 2 and all(count > 0 for count in dropped), dropped
    assert code == 0, text[-4000:]
    if len(attempts(tmp_path)) > 1:  # the heartbeat deadline was missed: said, and dropped
        assert "no heartbeat" in text or "no word from the agent" in text, text[-4000:]
    assert max(r["step"] for r in losses(tmp_path / "out")) == STEPS
