"""Noise on the console, through the real `zlaunch` command.

c10d's reverse-DNS warning is hidden on the console with one note (the rank log keeps it); an
SSH port that never answers with an SSH banner is one zlaunch message with a hint, without
paramiko's tracebacks; numpy is a dependency, so torch never prints "Failed to initialize
NumPy" on every rank of a fresh install.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

C10D = (
    "[W1130 16:55:08.343376140 socket.cpp:207] [c10d] The hostname of the client socket "
    "cannot be retrieved. err=-3"
)


def zlaunch(cwd, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "ZLAUNCH_LIVE": "0"},
        timeout=timeout,
    )


def test_c10d_reverse_dns_warning_is_noted_once_and_kept_in_the_logs(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(
        "import sys\n"
        f"print({C10D!r}, file=sys.stderr, flush=True)\n"
        f"print({C10D!r}, file=sys.stderr, flush=True)\n"
        "print('real output', flush=True)\n"
    )
    out = zlaunch(tmp_path, "--num-gpus", "2", "--log-dir", tmp_path / "runs", script)
    assert out.returncode == 0, out.stderr
    assert "cannot be retrieved" not in out.stdout
    assert out.stderr.count("hid c10d's 'hostname of the client socket") == 1, out.stderr
    assert out.stdout.count("real output") == 2
    logs = sorted((tmp_path / "runs" / "latest").glob("attempt-0/*/rank-*.log"))
    assert len(logs) == 2 and all(log.read_text().count(C10D) == 2 for log in logs)


def test_ssh_port_without_an_ssh_server_is_one_message_with_a_hint(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    accepted = []

    def serve():  # accepts and says nothing: no SSH banner ever comes
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    (tmp_path / "hosts").write_text(f"127.0.0.1 slots=1 port={port}\n")
    (tmp_path / "t.py").write_text("print('ran')\n")
    try:
        out = zlaunch(tmp_path, "-H", "hosts", "--ssh-timeout", "1", "t.py")
    finally:
        server.close()
        for conn in accepted:
            conn.close()
    assert out.returncode == 1, out
    assert "Traceback" not in out.stderr and "Exception (client)" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == (
        f"error: ssh to 127.0.0.1 failed: no SSH server answered on port {port} within 1s"
    ), out.stderr
    assert lines[1].startswith(f"  hint: check that port {port} is sshd's"), out.stderr
    assert len(lines) == 2, out.stderr
