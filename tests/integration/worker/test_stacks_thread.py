"""The worker's stacks thread (zlaunch/worker/stack_dumper.py) on this machine: it survives a rank
that starts and ends threads all the time (faulthandler's dump crashed such a rank), it
answers for a rank stuck in C code that released the GIL, and faulthandler stands in for a
rank whose GIL is held, with the answer saying which one dumped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.commands.helpers import ranks_state, wait_for, zlaunch
from tests.integration.commands.test_stacks import start
from zlaunch.agent.workers import boot_argv
from zlaunch.text.stack_dumps import DUMP_MARKER, parse_dump_by
from zlaunch.wire import protocol

REPO = Path(__file__).resolve().parents[3]

CHURN = """
import threading, time
print("ready", flush=True)
def short():
    sum(range(100))
end = time.monotonic() + 3
while time.monotonic() < end:
    threads = [threading.Thread(target=short) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
print("survived", flush=True)
"""


def test_a_rank_that_starts_and_ends_threads_survives_a_flood_of_stack_requests(tmp_path):
    script = tmp_path / "churn.py"
    script.write_text(CHURN)
    err_path = tmp_path / "stderr.txt"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        protocol.STACKS_SIGNAL_ENV: str(int(protocol.STACKS_SIGNAL)),
    }
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            boot_argv([sys.executable, "-u", str(script)]),  # as the agent starts a worker
            stdout=subprocess.PIPE, stderr=err, env=env, text=True,
        )  # fmt: skip
    assert proc.stdout.readline() == "ready\n"
    sent = 0
    while proc.poll() is None and sent < 1500:  # faulthandler died within ~100 of these
        os.kill(proc.pid, protocol.STACKS_SIGNAL)  # to the process, as the agent sends it
        sent += 1
        time.sleep(0.001)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "survived\n", (proc.returncode, sent)
    text = err_path.read_text()
    dumps = [m for m in map(DUMP_MARKER.match, text.splitlines()) if m]
    assert sent == 1500 and len(dumps) > 100, (sent, len(dumps))
    assert {m.group(2) for m in dumps} == {"its stacks thread"}
    dump, by = parse_dump_by(text)
    assert by == "its stacks thread" and dump[0][0] == "main"
    assert any("churn.py" in frame for frame in dump[0][1]), dump


STUCK_IN_C = """
import ctypes, os
r, w = os.pipe()  # nobody writes: read(2) blocks, and is restarted after a signal (SA_RESTART)
print("rank", os.environ["RANK"], "stuck", flush=True)
if os.environ["RANK"] == "0":
    ctypes.CDLL(None).read(r, ctypes.create_string_buffer(1), 1)   # in C, the GIL released
else:
    ctypes.PyDLL(None).read(r, ctypes.create_string_buffer(1), 1)  # in C, the GIL held
"""


def test_stacks_of_ranks_stuck_in_c_with_and_without_the_gil(tmp_path):
    script = tmp_path / "stuck_in_c.py"
    script.write_text(STUCK_IN_C)
    runs = tmp_path / "runs"
    job = start(runs, str(script))
    try:
        rows = wait_for(
            lambda: (r := ranks_state(runs)) and len(r) == 2 and all(x["stacks"] for x in r) and r,
            60,
            "both ranks ready for stack dumps",
        )
        out = zlaunch("stacks", "--log-dir", str(runs))
        assert out.returncode == 0, out.stderr
        assert f'File "{script}", line 6 in <module>' in out.stdout, out.stdout  # no GIL
        assert f'File "{script}", line 8 in <module>' in out.stdout, out.stdout  # GIL held
        assert "rank(s) 1 dumped by faulthandler" in out.stdout, out.stdout
        assert "stack_dumper" not in out.stdout and "sigwait" not in out.stdout
        logs = {p.name: p.read_text() for p in (runs / "latest").glob("attempt-0/*/rank-*.log")}
        assert "by its stacks thread:" in logs["rank-0.log"]
        assert "by faulthandler (no answer from its stacks thread within 2 s" in logs["rank-1.log"]
        assert job.poll() is None and all(os.path.exists(f"/proc/{r['pid']}") for r in rows)
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
    assert "Stack dump of process" not in (runs / "console.txt").read_text()
