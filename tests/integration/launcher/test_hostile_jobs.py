"""Jobs whose scripts misbehave in the ways that once cost a job or its record, run through the
``zlaunch`` command on this machine (local agent, two ranks)."""

from __future__ import annotations

import json
import os
import re

from tests.integration.commands.hostile_input import write_script, zlaunch

HOSTILE_EVENTS = """
import os
fd = int(os.environ["ZLAUNCH_EVENTS_FD"])
os.write(fd, b"[" * 100000 + b"\\n")
os.write(fd, b'{"kind":"metrics","step":1,"memory_bytes":NaN,"total_steps":"abc","loss":1.5}\\n')
os.write(fd, b'{"kind":"metrics","step":[1]}\\n')
os.write(fd, b'{"kind":"metrics","step":2,"comm_bytes":1' + b"0" * 400 + b'}\\n')
print("rank", os.environ["RANK"], "done", flush=True)
"""


def test_hostile_events_cost_neither_the_agent_nor_the_controller_nor_status(tmp_path):
    script = write_script(tmp_path, "hostile.py", HOSTILE_EVENTS)
    result = zlaunch(tmp_path, "--nproc_per_node", "2", "--log-dir", "runs", script)
    err = result.stderr.decode()
    assert result.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    assert "rank 0 done" in result.stdout.decode() and "rank 1 done" in result.stdout.decode()
    # named once, with the bad fields, then counted: 2 ranks x 3 malformed events
    assert len(re.findall("sent a malformed metrics event", err)) == 1
    assert "memory_bytes nan is not a count" in err and "6 malformed metrics events" in err
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if not p.is_symlink()]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows) == [1, 1, 2, 2]
    assert all("memory_bytes" not in r and "total_steps" not in r for r in rows)

    # A row written by an older controller (before the check) does not crash the readers.
    with open(run_dir / "metrics.jsonl", "a") as handle:
        handle.write('{"kind":"metrics","step":3,"memory_bytes":NaN,"step_time":"x"}\n')
    for command in (["status"], ["ls"]):
        shown = zlaunch(tmp_path, *command, "--log-dir", "runs")
        assert shown.returncode == 0, shown.stderr.decode()[-3000:]
        assert "Traceback" not in shown.stderr.decode()
    assert "step 3" in zlaunch(tmp_path, "status", "--log-dir", "runs").stdout.decode()


def test_a_script_named_like_a_token_prefix_shows_and_secrets_stay_out_of_run_json(tmp_path):
    script = write_script(tmp_path, "hf_trainer.py", "print('trained')\n")
    hexkey = "0123456789abcdef" * 3
    secret_env = {"NCCL_IB_TOKEN": "nccl-s3cr3t-value", "AZ": "AccountName=a;AccountKey=Zm9vYmFy"}
    args = ["--env", "NCCL_IB_TOKEN", "--env", "AZ", script, "-t", hexkey, "--hf_tok=tok-s3cr3t"]
    dry = zlaunch(tmp_path, "--dry-run", *args, env=secret_env)
    assert dry.returncode == 0, dry.stderr.decode()
    shown = dry.stdout.decode()
    assert "hf_trainer.py" in shown and "<redacted>" in shown
    for secret in (hexkey, "tok-s3cr3t", "nccl-s3cr3t-value", "Zm9vYmFy"):
        assert secret not in shown, secret
    result = zlaunch(tmp_path, "--log-dir", "runs", *args, env=secret_env)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    record = tmp_path / "runs" / "latest" / "run.json"
    text = record.read_text()
    assert json.loads(text)["program"][0].endswith("hf_trainer.py")
    for secret in (hexkey, "tok-s3cr3t", "nccl-s3cr3t-value", "Zm9vYmFy"):
        assert secret not in text, secret


FAILS_THEN_LINGERS = """
import os, signal, sys, time
if os.environ["RANK"] == "0":
    time.sleep(0.5)
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: print("rank 1 ignores SIGTERM", flush=True))
print("rank 1 up", flush=True)
time.sleep(60)
"""


def test_a_ctrl_c_during_a_failures_grace_keeps_the_root_cause(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    script = write_script(tmp_path, "fail.py", FAILS_THEN_LINGERS)
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    args = [
        "--nproc_per_node",
        "2",
        "--log-dir",
        "runs",
        "--grace-period",
        "20",
        "--max-restarts",
        "2",
    ]
    job = subprocess.Popen(
        [sys.executable, "-m", "zlaunch", *args, script],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / "runs" / "latest" / "failure.json").exists():
        ranks = tmp_path / "runs" / "latest" / "ranks.json"
        if ranks.exists() and '"exit_code": 3' in ranks.read_text():
            break
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.05)
    job.send_signal(signal.SIGINT)  # during the grace period rank 1 is given
    _, err = job.communicate(timeout=60)
    err = err.decode()
    assert job.returncode == 3, err[-3000:]
    assert "killing all ranks now" in err and "restarting" not in err
    failure = json.loads((tmp_path / "runs" / "latest" / "failure.json").read_text())
    assert failure["root_cause"]["rank"] == 0 and failure["exit_code"] == 3


WRAPPER = """#!/bin/bash
{python} -c "
import time
import runtime.observe.stacks
runtime.observe.stacks.install()
print('armed', flush=True)
time.sleep(60)
"
"""


def test_zlaunch_stacks_reaches_the_python_child_of_a_no_python_wrapper(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text(WRAPPER.format(python=sys.executable))
    wrapper.chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    job = subprocess.Popen(
        [sys.executable, "-m", "zlaunch", "--log-dir", "runs", "--no-python", str(wrapper)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            shown = zlaunch(tmp_path, "stacks", "--log-dir", "runs", timeout=60)
            if b"1 rank(s)" in shown.stdout:
                break
            assert time.monotonic() < deadline and job.poll() is None, shown.stderr[-2000:]
            time.sleep(0.3)
        assert b'File "<string>"' in shown.stdout  # the armed child's stack
        time.sleep(0.5)
        assert job.poll() is None, "the stacks signal killed the wrapper (and the job)"
        status = zlaunch(tmp_path, "status", "--log-dir", "runs").stdout.decode()
        assert "alive" in status, status
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=60)
