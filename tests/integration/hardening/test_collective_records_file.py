"""A job whose ranks write hostile collective-records files (the file is the rank's to write):
`zlaunch stacks` and the hang report both go on, the agents live, failure.json is written, and
the console says what was left out. On the way, a rank's escape sequences reach the console
escaped and its log as they were."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.commands.helpers import ranks_state, wait_for, zlaunch

HOSTILE_RECORDS = """
import json, os, time
path, rank = os.environ["ZLAUNCH_COLLECTIVES_FILE"], os.environ["RANK"]
if rank == "0":
    open(path, "w").write("[" * 100000 + "]" * 100000)  # overflowed the agent's decoder
elif rank == "1":
    os.mkfifo(path)  # nobody writes it
elif rank == "2":
    open(path, "w").write('{"records": [1, {"group": "0", "seq": "x"}]}')  # crashed the report
else:
    open(path, "w").write(json.dumps({"records": [{"group": "0", "seq": 3, "op": "all_reduce",
                                                    "state": "issued", "ranks": [0, 1, 2, 3]}]}))
os.write(int(os.environ["ZLAUNCH_EVENTS_FD"]), b'{"kind": "runtime_ready"}\\n')  # arms the watch
print("rank", rank, "waits", flush=True)
if rank == "3":  # erase the line above and print a line of another rank's making
    print("\x1b[1A\x1b[2K[localhost:0] loss 0.01", flush=True)
time.sleep(3600)
"""


def test_hostile_records_files_cost_neither_an_agent_nor_the_hang_report(tmp_path):
    script = tmp_path / "hostile_records.py"
    script.write_text(HOSTILE_RECORDS)
    runs = tmp_path / "runs"
    runs.mkdir()
    with open(runs / "console.txt", "wb") as console:
        job = subprocess.Popen(
            [sys.executable, "-m", "zlaunch", "--num-gpus", "4", "--log-dir", str(runs),
             "--hang-timeout", "6", str(script)],
            stdout=console, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(
            lambda: (r := ranks_state(runs)) and len(r) == 4 and all(x["stacks"] for x in r),
            60,
            "every rank ready for stack dumps",
        )
        asked = zlaunch("stacks", "--log-dir", str(runs), "--json")
        assert asked.returncode == 0 and "Traceback" not in asked.stderr, asked.stderr
        groups = json.loads(asked.stdout)["root_cause"]["hang"]["collective_groups"]
        assert [g["ranks"] for g in groups] == [[3]], groups  # only the well-formed record
        assert job.poll() is None  # every agent still there
        assert job.wait(timeout=90) == 124  # then the hang is declared and reported
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    console = (runs / "console.txt").read_text()
    assert "Traceback" not in console, console[-3000:]
    assert "rank 0's collective records are left out: its records file: nested deeper" in console
    assert "rank 1's collective records are left out: its records file: not a regular file" in (
        console
    )
    assert "rank 2 sent 2 collective record(s) zlaunch cannot read" in console
    # the console shows the rank's escape sequence, the rank log keeps its bytes
    assert "[localhost:3] \\x1b[1A\\x1b[2K[localhost:0] loss 0.01" in console
    assert "\x1b" not in console
    (log,) = (runs / "latest").glob("attempt-0/*/rank-3.log")
    assert b"\x1b[1A\x1b[2K[localhost:0] loss 0.01" in log.read_bytes()
    failure = json.loads((runs / "latest" / "failure.json").read_text())
    assert failure["root_cause"]["reason"] == "hang"
    records = failure["root_cause"]["hang"]["collective_groups"]
    assert [g["ranks"] for g in records] == [[3]] and records[0]["records"][0]["seq"] == 3
