"""Agents that connect back over TCP (``--slurm-mode one-step``) on localhost: the socket
handshake between the controller's listener and the agent's ``connect_back``, refusals of a
wrong token and of garbage, a node that never connects, and a whole job started by a stand-in
``srun`` that runs every node's agent here (the real Slurm runs are in tests/cluster/slurm).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.launcher import fake_worker
from tests.integration.launcher.helpers import alive, seconds_until
from zlaunch.agent.connect import ConnectFailed, connect_back
from zlaunch.errors import HostUnreachable, Interrupted
from zlaunch.job.hostfile import Host
from zlaunch.transport.connect_back import Listener
from zlaunch.transport.roster import HostRoster
from zlaunch.transport.slurm_one_step import open_one_step
from zlaunch.wire import frames, protocol

REPO = Path(__file__).resolve().parents[3]
TOKEN = "5" * 64
HOSTS = [Host("nodeA", (0,)), Host("nodeB", (0,))]

# A stand-in for srun: every node of --nodelist gets the command after "--", run here with
# Slurm's node name and task id in its environment, its output labelled as `srun --label` does.
# FAKE_SRUN_SILENT names a node whose "agent" only sleeps (it never connects back).
FAKE_SRUN = """#!{python}
import os, subprocess, sys, threading
args = sys.argv[1:]
cut = args.index("--")
nodes = [a.split("=", 1)[1] for a in args[:cut] if a.startswith("--nodelist=")][0].split(",")
with open(os.environ["FAKE_SRUN_PIDFILE"], "w") as f:
    f.write(str(os.getpid()))
procs = []
for task, node in enumerate(nodes):
    env = {{**os.environ, "SLURMD_NODENAME": node, "SLURM_PROCID": str(task)}}
    argv = ["sleep", "30"] if node == os.environ.get("FAKE_SRUN_SILENT") else args[cut + 1:]
    procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
def relay(task, proc):
    for line in proc.stdout:
        sys.stdout.write(f"{{task}}: {{line.decode(errors='replace')}}")
        sys.stdout.flush()
threads = [threading.Thread(target=relay, args=item) for item in enumerate(procs)]
for t in threads:
    t.start()
sys.exit(max(p.wait() for p in procs))
"""


@pytest.fixture
def fake_srun(tmp_path):
    """A directory holding the stand-in ``srun``, and the environment that puts it first on
    PATH; whatever it started is killed afterwards (it runs in its own process group)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN.format(python=sys.executable))
    srun.chmod(0o755)
    pidfile = tmp_path / "srun.pid"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "SLURM_JOB_ID": "77",
        "FAKE_SRUN_PIDFILE": str(pidfile),
    }
    yield env
    if pidfile.exists():
        try:
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _agent_in_thread(address: str, environ: dict[str, str]) -> tuple[threading.Thread, list]:
    result: list = []

    def run() -> None:
        try:
            result.append(connect_back(address, environ))
        except ConnectFailed as err:
            result.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _accept(listener: Listener, hosts, timeout: float = 10.0):
    accepted: dict[int, tuple[socket.socket, object]] = {}
    refused: list[str] = []
    missing = listener.accept_agents(
        HostRoster(hosts),
        time.monotonic() + timeout,
        lambda index, sock, answer: accepted.__setitem__(index, (sock, answer)),
        refused.append,
        lambda: False,
    )
    return accepted, refused, missing


def test_an_agent_with_the_token_connects_and_the_socket_carries_bytes_both_ways():
    listener = Listener("127.0.0.1", TOKEN)
    environ = {protocol.CONNECT_TOKEN_ENV: TOKEN, "SLURMD_NODENAME": "nodeB", "SLURM_PROCID": "1"}
    thread, result = _agent_in_thread(listener.address, environ)
    accepted, refused, missing = _accept(listener, HOSTS[1:])
    listener.close()
    thread.join(10)
    assert missing == [] and refused == []
    sock, answer = accepted[0]
    assert (answer.node, answer.task) == ("nodeB", 1)
    agent = result[0]
    assert isinstance(agent, socket.socket)
    assert protocol.CONNECT_TOKEN_ENV not in environ  # taken out before any worker could see it
    agent.sendall(frames.encode(frames.Heartbeat()))  # the first bytes after the handshake
    assert sock.recv(100) == frames.encode(frames.Heartbeat())
    sock.sendall(b"down")
    assert agent.recv(100) == b"down"
    agent.close()
    sock.close()


def test_garbage_a_wrong_token_and_a_stranger_are_refused_and_the_real_agent_still_joins():
    listener = Listener("127.0.0.1", TOKEN)
    accepted: dict = {}
    refused: list[str] = []
    missing: list[int] = []
    waiting = threading.Thread(
        target=lambda: missing.extend(
            listener.accept_agents(
                HostRoster(HOSTS[:1]), time.monotonic() + 30,
                lambda i, s, a: accepted.__setitem__(i, (s, a)),
                refused.append, lambda: False,
            )
        )
    )  # fmt: skip
    waiting.start()
    garbage = socket.create_connection(("127.0.0.1", int(listener.address.rsplit(":", 1)[1])))
    garbage.sendall(b"GET / HTTP/1.1\r\n\r\n")
    wrong = {protocol.CONNECT_TOKEN_ENV: "6" * 64, "SLURMD_NODENAME": "nodeA"}
    stranger = {protocol.CONNECT_TOKEN_ENV: TOKEN, "SLURMD_NODENAME": "nodeZ"}
    threads = [_agent_in_thread(listener.address, env) for env in (wrong, stranger)]
    # the bad ones are refused while the controller still waits for its agent
    assert seconds_until(lambda: len(refused) == 3, 20) is not None, refused
    assert waiting.is_alive() and not accepted
    right = {protocol.CONNECT_TOKEN_ENV: TOKEN, "SLURMD_NODENAME": "nodeA"}
    threads.append(_agent_in_thread(listener.address, right))
    waiting.join(30)
    listener.close()
    for thread, _ in threads:
        thread.join(10)
    assert missing == [] and list(accepted) == [0]
    assert len(refused) == 3, refused
    assert any("not a zlaunch agent's answer: b'GET / HTTP/1.1\\r'" in r for r in refused)
    assert any("claiming to be on nodeA does not hold this job's token" in r for r in refused)
    assert any("nodeZ is not a node of this job" in r for r in refused)
    # the refused agents were told nothing they could use, and say so
    for _, result in threads[:2]:
        assert isinstance(result[0], ConnectFailed), result
    assert isinstance(threads[2][1][0], socket.socket)
    garbage.close()


def test_a_connection_that_says_nothing_does_not_hold_up_the_agents():
    listener = Listener("127.0.0.1", TOKEN)
    silent = socket.create_connection(("127.0.0.1", int(listener.address.rsplit(":", 1)[1])))
    thread, result = _agent_in_thread(
        listener.address, {protocol.CONNECT_TOKEN_ENV: TOKEN, "SLURMD_NODENAME": "nodeA"}
    )
    start = time.monotonic()
    accepted, _, missing = _accept(listener, HOSTS[:1], timeout=30)
    took = time.monotonic() - start
    listener.close()
    thread.join(10)
    assert missing == [] and list(accepted) == [0]
    assert took < 9, took  # well before the silent one's handshake time runs out (10 s)
    silent.close()


# The controller's side of the flood test: a listener whose process runs out of descriptors
# while it waits (the rest of the controller takes all but FREE of them as the wait begins, as
# rank logs and links do), and hands the one agent a line through its socket.
FLOODED_CONTROLLER = """
import json, os, resource, sys, time
from zlaunch.job.hostfile import Host
from zlaunch.transport.connect_back import Listener
from zlaunch.transport.roster import HostRoster
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, soft), hard))
listener = Listener("127.0.0.1", sys.argv[1])
print(listener.address, flush=True)
held, notes, result = [], [], {}
def take_descriptors():
    if not held:
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        for fd in held[:int(sys.argv[2])]:
            os.close(fd)
        print("descriptors taken", flush=True)
    return False
def on_agent(index, sock, answer):
    result["agent"] = answer.node
    sock.sendall(b"spec")
try:
    result["missing"] = listener.accept_agents(
        HostRoster([Host("nodeA", (0,))]), time.monotonic() + 90, on_agent, notes.append,
        take_descriptors,
    )
except Exception as err:
    result["error"] = repr(err)
print(json.dumps({**result, "notes": notes}), flush=True)
"""


def test_a_thousand_silent_and_a_thousand_garbage_connections_neither_keep_the_agent_out_nor_abort_the_start():
    free = 24
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2400 if hard == resource.RLIM_INFINITY else min(hard, 2400)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    controller = subprocess.Popen(
        [sys.executable, "-c", FLOODED_CONTROLLER, TOKEN, str(free)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    hostile: list[socket.socket] = []
    try:
        address = controller.stdout.readline().strip()
        assert controller.stdout.readline().strip() == "descriptors taken"
        host, port = address.rsplit(":", 1)
        for i in range(2000):  # silent and garbage in turn, all before the agent
            peer = socket.create_connection((host, int(port)), timeout=30)
            if i % 2:
                peer.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            hostile.append(peer)
        start = time.monotonic()
        agent = connect_back(
            address, {protocol.CONNECT_TOKEN_ENV: TOKEN, "SLURMD_NODENAME": "nodeA"}
        )
        took = time.monotonic() - start
        agent.settimeout(30)
        assert agent.recv(4) == b"spec"  # the connection is the agent's link now
        agent.close()
        out, _ = controller.communicate(timeout=60)
    finally:
        for peer in hostile:
            peer.close()
        controller.kill()
        controller.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    report = json.loads(out)
    print(f"the agent got in {took:.2f} s after 2,000 hostile connections")
    assert "error" not in report, report
    assert report["missing"] == [] and report["agent"] == "nodeA"
    notes = report["notes"]
    # the descriptors really ran out, and the controller said so once
    assert sum("ran out of file descriptors" in n for n in notes) == 1, notes
    # the flood is counted, not told line by line
    assert len(notes) <= 6, notes
    total = [
        n for n in notes if n.startswith("refused ") and "connections on the agents' port" in n
    ]
    assert len(total) == 1 and int(total[0].split()[1]) >= 1000, notes
    assert "from 127.0.0.1 (" in total[0]


def test_an_agent_refuses_a_listener_without_the_token():
    listener = Listener("127.0.0.1", "7" * 64)
    thread, result = _agent_in_thread(
        listener.address, {protocol.CONNECT_TOKEN_ENV: TOKEN, "SLURMD_NODENAME": "nodeA"}
    )
    _, refused, missing = _accept(listener, HOSTS[:1], timeout=3)
    listener.close()
    thread.join(10)
    assert missing == [0] and "does not hold this job's token" in refused[0]
    assert isinstance(result[0], ConnectFailed) and "handshake" in str(result[0])


def test_a_node_that_never_connects_fails_the_start_naming_it(fake_srun):
    env = {**fake_srun, "FAKE_SRUN_SILENT": "nodeB"}
    argv = [sys.executable, "-u", "-m", "zlaunch.agent"]
    start = time.monotonic()
    with pytest.raises(HostUnreachable) as err:
        open_one_step(HOSTS, argv, controller_addr="127.0.0.1", environ=env, timeout=10)
    assert err.value.hosts == ("nodeB",)
    assert "the agent on nodeB did not connect back to 127.0.0.1:" in err.value.message
    assert "(not within 10 s)" in err.value.message
    assert time.monotonic() - start < 30


def test_agents_that_exit_before_connecting_end_the_wait_at_once(fake_srun):
    # no Python there, or no token (--export=NONE at a site): srun exits, nobody waits a minute
    argv = [sys.executable, "-c", "import sys; print('no python here'); sys.exit(3)"]
    start = time.monotonic()
    with pytest.raises(HostUnreachable) as err:
        open_one_step(HOSTS, argv, controller_addr="127.0.0.1", environ=fake_srun, timeout=60)
    assert time.monotonic() - start < 20
    assert sorted(err.value.hosts) == ["nodeA", "nodeB"]
    assert "srun exited with status 3" in err.value.message
    assert "no python here" in err.value.message  # the tasks' last words, labelled


def test_a_job_through_one_srun_step_runs_every_rank_with_its_exact_environment(
    fake_srun, tmp_path
):
    records = tmp_path / "records"
    env = {**fake_srun, "SLURM_JOB_NODELIST": "nodeA,nodeB", "SLURM_TASKS_PER_NODE": "2(x2)"}
    out = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--slurm-mode", "one-step", "--controller-addr",
         "127.0.0.1", "--log-dir", str(tmp_path / "runs"), fake_worker.__file__,
         "--record-dir", str(records)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in records.glob("*.json")}
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, record in ranks.items():
        e = record["env"]
        assert (e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["NODE_RANK"]) == (
            str(rank),
            str(rank % 2),
            "4",
            str(rank // 2),
        )
        assert e["MASTER_ADDR"] == "nodeA"
        assert protocol.CONNECT_TOKEN_ENV not in e
    logs = {p.parent.name for p in (tmp_path / "runs").rglob("rank-*.log")}
    assert logs == {"nodeA", "nodeB"}


def test_ctrl_c_while_the_agents_connect_ends_the_wait_and_what_started(fake_srun):
    env = {**fake_srun, "FAKE_SRUN_SILENT": "nodeB"}
    argv = [sys.executable, "-u", "-m", "zlaunch.agent"]
    start = time.monotonic()
    opened: list[int] = []  # Ctrl-C once nodeA's agent is in; nodeB's never comes
    with pytest.raises(Interrupted) as err:
        open_one_step(
            HOSTS, argv, controller_addr="127.0.0.1", environ=env, timeout=60,
            on_open=lambda index, link: opened.append(index),
            interrupted=lambda: signal.SIGINT if opened else None,
        )  # fmt: skip
    assert opened == [0]
    assert err.value.exit_code == 130
    assert "stopped by SIGINT while the agents were connecting back (1 of 2 not yet)" in str(
        err.value
    )
    assert time.monotonic() - start < 30  # not the 60 s connect timeout
    srun = int((Path(env["FAKE_SRUN_PIDFILE"])).read_text())
    assert seconds_until(lambda: not alive(srun), 10) is not None  # the step was ended
