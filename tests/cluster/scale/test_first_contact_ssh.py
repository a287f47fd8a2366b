"""First contact over real SSH (tests/cluster/scale/farm.py: loopback hosts behind one sshd of
the test's own): one host's agent held up before it starts by an interpreter wrapper
(``--python``; the wrapper reads which host it runs on from ``SSH_CONNECTION``).

- held 17 s, beyond a small job's 15 s hello deadline: probed, found running, named as slow,
  waited for; the job runs with every line of every rank, on the console and in its logs;
- its connection held 6 s by a ProxyCommand that waits before relaying (a slow login): the
  console says which connection is still opening, then the job runs;
- its agent exits 3 before a hello while a child it left holds the session's output open (no
  EOF reaches the controller): named by the probe at its deadline, within a bounded time,
  with the exit status sshd reported.

Skipped, with the reason, where the farm cannot run (not root, no sshd).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.scale import farm as farm_mod
from tests.cluster.scale import worker as worker_mod

pytestmark = pytest.mark.cluster

HOSTS = 3
SLOTS = 2
LINES = 20
SLOW_START = 17.0
HELD = farm_mod.address(1)  # 127.0.1.2


@pytest.fixture(scope="module")
def farm():
    reason = farm_mod.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with farm_mod.LoopbackFarm.start(HOSTS) as started:
        yield started


def _wrapper(tmp_path: Path, before_agent: str) -> Path:
    path = tmp_path / "python-wrapper"
    path.write_text(
        "#!/bin/sh\n"
        'case "$SSH_CONNECTION $*" in'
        f' *" {HELD} "*zlaunch.agent*)\n{before_agent}\n;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    return path


RELAY = """import os, socket, sys, threading, time
time.sleep(float(sys.argv[3]))
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    for data in iter(lambda: os.read(0, 65536), b""):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
for data in iter(lambda: conn.recv(65536), b""):
    os.write(1, data)
"""


def _slow_login_config(farm, tmp_path: Path, seconds: float) -> str:
    """The farm's ssh config, with HELD reached through a relay that waits first."""
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    path = tmp_path / "ssh_config"
    path.write_text(
        f"Host {HELD}\n    ProxyCommand {sys.executable} {relay} %h %p {seconds}\n\n"
        + Path(farm.ssh_config).read_text()
    )
    return str(path)


def _zlaunch(
    farm, tmp_path: Path, wrapper: Path | None, ssh_config: str | None = None
) -> tuple[int, str, str, float]:
    python = ["--python", str(wrapper)] if wrapper else []
    argv = [
        sys.executable, "-m", "zlaunch", "--hostfile", farm.hostfile(SLOTS), "--ssh-config",
        ssh_config or farm.ssh_config, "--log-dir", str(tmp_path / "runs"), "--grace-period",
        "3", *python, worker_mod.__file__, "--records", str(tmp_path),
        "--lines", str(LINES),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def test_a_slow_agent_is_waited_for_and_a_gone_one_is_named(farm, tmp_path):
    slow = tmp_path / "slow"
    slow.mkdir()
    code, out, err, took = _zlaunch(farm, slow, _wrapper(slow, f"sleep {SLOW_START}"))
    assert code == 0, err
    assert took >= SLOW_START
    assert f"agent slow to start on {HELD}: still running, no hello 15s after" in err
    assert f"agents: 2/3 answered; starting: {HELD}" in err
    assert "no answer" not in err
    counts = {}
    for line in out.splitlines():
        tag = re.match(r"^\[[^:\]]+:(\d+)\] rank \d+ line", line)
        if tag:
            counts[int(tag.group(1))] = counts.get(int(tag.group(1)), 0) + 1
    assert counts == {rank: LINES for rank in range(HOSTS * SLOTS)}
    assert farm.processes() == []

    login = tmp_path / "login"
    login.mkdir()
    code, out, err, took = _zlaunch(farm, login, None, _slow_login_config(farm, login, 6.0))
    assert code == 0, err
    assert f"agents: 2/3 connected; connecting: {HELD}" in err
    assert out.count(" line ") == HOSTS * SLOTS * LINES

    gone = tmp_path / "gone"
    gone.mkdir()
    holder = gone / "holder.pid"
    wrapper = _wrapper(gone, f"sleep 60 & echo $! > {holder}; exit 3")
    try:
        code, out, err, took = _zlaunch(farm, gone, wrapper)
    finally:
        if holder.exists():
            try:
                os.kill(int(holder.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code != 0
    assert (
        f"no answer from the agent on {HELD}: silent 15s after its connection opened, and its "
        "process is no longer running (exit status 3)"
    ) in err, err
    assert "Traceback" not in err
    assert 15.0 <= took < 30.0
    deadline = time.monotonic() + 10
    while farm.processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert farm.processes() == []
