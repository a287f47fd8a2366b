"""Agents that dial in (``--launcher dialin``), started by hand in two hosts of the test
cluster as a scheduler zlaunch does not know would start them: inside each host's network and
UTS namespaces, no SSH. One run checks the whole path: a stranger with a wrong token is
refused while the real agents join, the job trains with the same per-step losses as over SSH
on the same hosts, the token is on no command line, in no rank's environment and in no file of
the run, and every process ends.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time

import pytest

from tests.cluster import netns
from tests.integration.launcher import helpers

pytestmark = pytest.mark.cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ZLAUNCH = [sys.executable, "-m", "zlaunch"]
TRAIN = [
    "examples/train_gpt.py", "--config", "examples/configs/zero2.json",
    "--steps", "10", "--print-every", "5", "--threads", "1", "--max-chars", "50000",
    "--n-layer", "1", "--d-model", "64", "--seq-len", "32",
]  # fmt: skip
# rank 0's step lines, whatever its host is called
LINE = re.compile(r"^\[[^\]:]+:0\] step\s+(\d+)\s+loss ([0-9.]+)", re.MULTILINE)
NODES = ["node1", "node2"]
ENV = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}

idle_cluster = helpers.idle_cluster  # autouse: no process left on any host


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _start_agent(cluster, host: str, address: str, token_file: str) -> subprocess.Popen:
    """``zlaunch agent`` on ``host``, as a scheduler places it: in the host's namespace with
    its host name, no SSH session."""
    agent = [*ZLAUNCH, "agent", "--connect", address, "--token-file", token_file]
    return subprocess.Popen(
        [netns.IP, "netns", "exec", cluster.namespace(host), "unshare", "--uts",
         "sh", "-c", f'hostname {host} && exec "$@"', "sh", *agent],
        cwd="/", env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def _holding(secret: str) -> list[str]:
    """Every process whose command line or environment holds ``secret``."""
    found = []
    for pid in os.listdir("/proc"):
        for part in ("cmdline", "environ") if pid.isdigit() else ():
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if secret.encode() in f.read():
                        found.append(f"{pid} ({part})")
            except OSError:
                pass
    return found


@pytest.mark.multirank
def test_two_agents_started_by_hand_train_as_over_ssh_and_the_token_stays_secret(
    idle_cluster, tmp_path
):
    cluster = idle_cluster
    # the reference: the same job over SSH on the same two hosts
    ssh = subprocess.run(
        [*ZLAUNCH, "--hostfile", cluster.hostfile(1, hosts=NODES), "--ssh-config",
         cluster.ssh_config, "--log-dir", str(tmp_path / "ssh-runs"), *TRAIN],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ssh.returncode == 0, (ssh.stdout + ssh.stderr)[-3000:]
    reference = LINE.findall(ssh.stdout)
    assert [s for s, _ in reference] == ["5", "10"], ssh.stdout

    where = cluster.controller_address
    address = f"{where}:{_free_port(where)}"
    token_file = tmp_path / "job.token"  # absent: the controller writes it
    runs = tmp_path / "dialin-runs"
    controller = subprocess.Popen(
        [*ZLAUNCH, "run", "--launcher", "dialin", "--nodes", "2", "--token-file", str(token_file),
         "--controller-addr", where, "--controller-port", address.rpartition(":")[2],
         "--log-dir", str(runs), *TRAIN],
        cwd=REPO, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    agents: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 60
        while not token_file.exists():
            assert controller.poll() is None, controller.communicate()
            assert time.monotonic() < deadline, "the controller wrote no token file"
            time.sleep(0.05)
        time.sleep(0.2)  # the listener is up once the file is written and checked
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert re.fullmatch(r"[0-9a-f]{64}", token)

        # a stranger holding another token is refused; the controller goes on waiting
        wrong = tmp_path / "wrong.token"
        wrong.write_text("0" * 64 + "\n")
        wrong.chmod(0o600)
        stranger = _start_agent(cluster, "node2", address, str(wrong))
        said, _ = stranger.communicate(timeout=60)
        assert stranger.returncode == 2, said
        assert "wrong token" in said, said

        # each node gets its own private copy, as a scheduler would mount one
        for host in NODES:
            copy = tmp_path / f"{host}.token"
            copy.write_text(token + "\n")
            copy.chmod(0o400)
            agents.append(_start_agent(cluster, host, address, str(copy)))
        deadline = time.monotonic() + 120
        while not list(runs.rglob("rank-*.log")) and controller.poll() is None:
            assert time.monotonic() < deadline, "no rank started"
            time.sleep(0.1)
        assert _holding(token) == []  # while the ranks run: no argv, no environment
        out, err = controller.communicate(timeout=300)
        said = [agent.communicate(timeout=30)[0] for agent in agents]
    finally:
        for proc in (controller, *agents):
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    assert controller.returncode == 0, (out + err)[-3000:]
    assert [agent.returncode for agent in agents] == [0, 0], said
    assert "world size 2" in out
    assert LINE.findall(out) == reference  # the same per-step losses as over SSH
    # the agents were placed by hand: the controller names them as they joined, by host name
    # and by the address each dialed in from (the hosts' own)
    joined = dict(re.findall(r"(agent-[01]) is (node[12]) \(", err))
    assert sorted(joined.values()) == NODES, err
    for host in NODES:
        assert f"is {host} ({cluster.address(host)})" in err
    # the stranger, said once, by its address
    assert (
        f"refused a connection from {cluster.address('node2')}" in err
        and "claiming to be on node2 does not hold this job's token" in err
    ), err
    for path in runs.rglob("*"):
        if path.is_file():
            assert token not in path.read_text(errors="replace"), path
    assert token not in out + err


@pytest.mark.multirank
def test_with_min_nodes_a_lost_agent_restarts_the_job_waiting_for_fewer(idle_cluster, tmp_path):
    """--max-restarts 1 --min-nodes 1: one of two agents killed mid-job (its node lost); the
    next attempt waits for one agent, which is started again by hand, and the job runs to its
    last step on world size 1; nothing is left."""
    cluster = idle_cluster
    where = cluster.controller_address
    address = f"{where}:{_free_port(where)}"
    token_file, runs, console = tmp_path / "job.token", tmp_path / "runs", tmp_path / "stderr"
    with open(console, "w") as stderr:
        controller = subprocess.Popen(
            [*ZLAUNCH, "run", "--launcher", "dialin", "--nodes", "2", "--token-file",
             str(token_file), "--controller-addr", where, "--controller-port",
             address.rpartition(":")[2], "--max-restarts", "1", "--min-nodes", "1",
             "--log-dir", str(runs), *TRAIN[:4], "400", *TRAIN[5:]],
            cwd=REPO, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=stderr, text=True, start_new_session=True,
        )  # fmt: skip
    agents: list[subprocess.Popen] = []

    def said() -> str:
        return console.read_text()

    def wait_for(what: str, done) -> None:
        deadline = time.monotonic() + 120
        while not done():
            assert controller.poll() is None, said()[-3000:]
            assert time.monotonic() < deadline, f"{what}: {said()[-3000:]}"
            time.sleep(0.1)

    try:
        wait_for("no token file", token_file.exists)
        time.sleep(0.2)
        token = token_file.read_text().strip()
        copy = tmp_path / "node.token"
        copy.write_text(token + "\n")
        copy.chmod(0o400)
        agents = [_start_agent(cluster, host, address, str(copy)) for host in NODES]
        wait_for(
            "no step logged",
            lambda: any("step" in p.read_text(errors="replace") for p in runs.rglob("rank-*.log")),
        )
        os.killpg(agents[1].pid, 9)  # node2 lost: its agent and ranks gone at once
        agents[1].wait()
        wait_for("no wait for one agent", lambda: "waiting for 1 agents to dial in" in said())
        agents.append(_start_agent(cluster, "node1", address, str(copy)))
        out, _ = controller.communicate(timeout=300)
    finally:
        for proc in (controller, *agents):
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    assert controller.returncode == 0, (out + said())[-3000:]
    assert "restarted this job on another world size" in out and "world size 1," in out, out
    assert [s for s, _ in LINE.findall(out)][-1] == "400", out[-3000:]
    (record,) = [p for p in runs.glob("*/run.json") if not p.parent.is_symlink()]
    assert json.loads(record.read_text())["status"] == "succeeded"
    assert sorted(p.name for p in record.parent.glob("attempt-*")) == ["attempt-0", "attempt-1"]
