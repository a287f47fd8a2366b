"""``--launcher ray`` on a real 3-node Ray cluster: ``ray start`` heads and workers inside the
network-namespace hosts of the test cluster (each node its own address), the controller on the
head node as a Ray user runs it. One module, two jobs:

- the job trains with the same per-step losses as the same job over SSH on the same hosts;
  the token is on no process's command line; afterwards no actor is alive, the placement
  group is removed, no agent or rank is left on any node;
- a Ray node lost mid-job (every process of one node killed at once) stops the job fail-fast, naming the
  node, and again nothing of the job is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster import netns

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("ray") is None,
        reason="Ray is not installed (pip install 'zlaunch[ray]'; CI's test extra has it)",
    ),
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ZLAUNCH = [sys.executable, "-m", "zlaunch"]
TRAIN = [
    "examples/train_gpt.py", "--config", "examples/configs/zero2.json",
    "--threads", "1", "--max-chars", "50000",
    "--n-layer", "1", "--d-model", "64", "--seq-len", "32",
]  # fmt: skip
LINE = re.compile(r"^\[[^\]:]+:0\] step\s+(\d+)\s+loss ([0-9.]+)", re.MULTILINE)
ENV = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
NODES = ["node1", "node2", "node3"]
# what is the job's on a node (Ray's own daemons stay until the cluster is stopped)
JOB = ("zlaunch.agent", "zlaunch agent", "train_gpt.py")


def _in(cluster, host: str, argv: list[str], **kwargs):
    """``argv`` inside ``host``'s namespaces, with its host name."""
    return [netns.IP, "netns", "exec", cluster.namespace(host), "unshare", "--uts",
            "sh", "-c", f'hostname {host} && exec "$@"', "sh", *argv]  # fmt: skip


def _run_in(cluster, host, argv, timeout=120):
    return subprocess.run(
        _in(cluster, host, argv), env=ENV, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip


def _job_processes(cluster) -> dict[str, list]:
    found = {}
    for host in cluster.hosts:
        procs = [(p, c) for p, c in cluster.pids(host) if any(mark in c for mark in JOB)]
        if procs:
            found[host] = procs
    return found


def _ray_state(cluster) -> dict:
    """Alive actors and placement groups not removed, as Ray's GCS says."""
    probe = (
        "import json, ray, ray._private.state as s\n"
        "ray.init(address='auto', logging_level='ERROR', log_to_driver=False)\n"
        "actors = [a for a in s.actors().values() if a['State'] != 'DEAD']\n"
        "groups = [g for g in ray.util.placement_group_table().values()"
        " if g['state'] != 'REMOVED']\n"
        "print(json.dumps({'actors': len(actors), 'groups': len(groups),"
        " 'nodes': sum(1 for n in ray.nodes() if n['Alive'])}))\n"
    )
    out = _run_in(cluster, "node1", [sys.executable, "-c", probe])
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def ray_cluster(cluster):
    head = cluster.address("node1")
    started = time.monotonic()
    try:
        for host in NODES:
            role = (
                ["--head", "--port=6379", "--include-dashboard=false"]
                if host == "node1"
                else [f"--address={head}:6379"]
            )
            out = _run_in(cluster, host, [
                "ray", "start", *role, f"--node-ip-address={cluster.address(host)}",
                "--num-cpus=1", "--disable-usage-stats",
            ])  # fmt: skip
            assert out.returncode == 0, out.stderr[-3000:]
        print(f"\nRay: 3 nodes started in {time.monotonic() - started:.1f} s")
        deadline = time.monotonic() + 60
        while _ray_state(cluster)["nodes"] < 3:
            assert time.monotonic() < deadline, "the Ray nodes did not all join"
            time.sleep(1)
        yield f"{head}:6379"
    finally:
        for host in NODES:
            _run_in(cluster, host, ["ray", "stop", "--force"], timeout=60)


def _controller(cluster, address, runs, *extra) -> subprocess.Popen:
    return subprocess.Popen(
        _in(cluster, "node1", [
            *ZLAUNCH, "run", "--launcher", "ray", "--ray-address", address, "--num-nodes", "3",
            "--controller-addr", cluster.address("node1"), "--log-dir", str(runs), *extra,
        ]),
        cwd=REPO, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _agent_token_files(cluster) -> list[str]:
    paths = []
    for host in NODES:
        for _, command in cluster.pids(host):
            if "zlaunch.agent" in command and "--token-file" in command:
                paths.append(command.split("--token-file")[1].split()[0])
    return paths


def _wait_for_ranks(proc, runs, count, timeout=180) -> None:
    deadline = time.monotonic() + timeout
    while len(list(runs.rglob("rank-*.log"))) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)


@pytest.mark.multirank
def test_ray_trains_as_over_ssh_then_a_lost_node_fails_fast_and_nothing_is_left(
    cluster, ray_cluster, tmp_path
):
    steps = ["--steps", "10", "--print-every", "5"]
    ssh = subprocess.run(
        [*ZLAUNCH, "--hostfile", cluster.hostfile(1), "--ssh-config", cluster.ssh_config,
         "--log-dir", str(tmp_path / "ssh-runs"), *TRAIN, *steps],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ssh.returncode == 0, (ssh.stdout + ssh.stderr)[-3000:]
    reference = LINE.findall(ssh.stdout)
    assert [s for s, _ in reference] == ["5", "10"], ssh.stdout

    # 1. the same job through Ray
    runs = tmp_path / "ray-runs"
    started = time.monotonic()
    proc = _controller(cluster, ray_cluster, runs, *TRAIN, *steps)
    try:
        _wait_for_ranks(proc, runs, 3)
        placed = time.monotonic() - started
        tokens = []
        for path in _agent_token_files(cluster):
            assert oct(os.stat(path).st_mode & 0o777) == "0o600"
            tokens.append(open(path).read().strip())
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"Ray: controller start to 3 ranks running {placed:.1f} s")
    assert proc.returncode == 0, (out + err)[-3000:]
    assert "world size 3" in out
    assert LINE.findall(out) == reference  # the same per-step losses as over SSH
    assert len(set(tokens)) == 1 and re.fullmatch(r"[0-9a-f]{64}", tokens[0])
    token = tokens[0]
    assert token not in out + err
    for path in runs.rglob("*"):
        if path.is_file():
            assert token not in path.read_text(errors="replace"), path
    deadline = time.monotonic() + 20
    while (left := _job_processes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
    assert _ray_state(cluster) == {"actors": 0, "groups": 0, "nodes": 3}

    # 2. a Ray node lost mid-job: fail-fast, naming it
    runs = tmp_path / "ray-loss-runs"
    proc = _controller(
        cluster, ray_cluster, runs, *TRAIN, "--steps", "100000", "--print-every", "50"
    )
    try:
        _wait_for_ranks(proc, runs, 3)
        time.sleep(3)  # training
        # the node goes: every process in it at once (its raylet, the actor, the agent, the
        # rank); `ray stop` would not do, it stops every Ray process of the machine
        for pid, _ in cluster.pids("node3"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, (out + err)[-3000:]
    assert "lost" in err, err[-3000:]  # the node's agent, said as over SSH
    # recorded as a lost agent is over SSH: failure.json names node3's agent, no interruption
    (lost_agent,) = re.findall(r"(agent-[0-2]) is node3 \(", err)
    (failure,) = runs.rglob("failure.json")
    report = json.loads(failure.read_text())
    assert report["root_cause"]["host"] == lost_agent, report
    assert report["root_cause"]["message"].startswith("connection to the agent lost"), report
    assert proc.returncode == report["exit_code"] != 143, report
    deadline = time.monotonic() + 30
    while (left := _job_processes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
    state = _ray_state(cluster)
    assert (state["actors"], state["groups"]) == (0, 0), state

    # 3. with --min-nodes: node2 lost mid-job (node3 is gone already), the job restarts on the
    # one node left, as over SSH, and ends well
    runs = tmp_path / "ray-min-nodes-runs"
    proc = _controller(
        cluster, ray_cluster, runs, "--num-nodes", "2", "--max-restarts", "1", "--min-nodes",
        "1", *TRAIN, "--steps", "2000", "--print-every", "500",
    )  # fmt: skip
    try:
        _wait_for_ranks(proc, runs, 2)
        time.sleep(2)  # training
        for pid, _ in cluster.pids("node2"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, (out + err)[-3000:]
    # the next attempt on the one node left (the first's rank 0 may have been on node2)
    assert "restarted this job on another world size" in out and "world size 1," in out, out
    assert [s for s, _ in LINE.findall(out)][-1] == "2000", out[-3000:]
    (record,) = [p for p in runs.glob("*/run.json") if not p.parent.is_symlink()]  # no "latest"
    assert json.loads(record.read_text())["status"] == "succeeded"
    assert sorted(p.name for p in record.parent.glob("attempt-*")) == ["attempt-0", "attempt-1"]
    deadline = time.monotonic() + 30
    while (left := _job_processes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
    state = _ray_state(cluster)
    assert (state["actors"], state["groups"]) == (0, 0), state
