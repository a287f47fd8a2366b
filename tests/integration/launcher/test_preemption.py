"""A preemption notice on one local host (2 ranks): SIGTERM to its agent.

With --checkpoint-dir, the signal is the host's preemption notice, not a stop: every rank
saves at its next step boundary within --preemption-deadline; without --min-nodes the job
cannot go on without its only host, so it ends saying where it saved, and the same command
with --resume continues at the next step: no step lost, none repeated. A deadline shorter than
the way to the next step boundary stops every rank without a new checkpoint, says so, and
`latest` still names the previous one, which loads.

The real SSH cluster test (tests/cluster/faults/test_preemption.py) checks the job going on
without a preempted host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.launcher.helpers import seconds_until

REPO = Path(__file__).resolve().parents[3]
WORKER = str(REPO / "tests" / "cluster" / "faults" / "elastic_worker.py")


def _config(tmp: Path) -> str:
    path = tmp / "config.json"
    path.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 3,
                "steps_per_print": 1,
                "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
                "zero_optimization": {"stage": 2},
            }
        )
    )
    return str(path)


def _steps(out: Path, attempt_file: str = "losses-0.jsonl") -> list[int]:
    """Rank 0's steps, once per step (3 micro-steps each)."""
    path = out / attempt_file
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted({r["step"] for r in rows})


def _agent_of(pid: int) -> int:
    """The job's local agent: the controller's child that runs zlaunch.agent (from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"zlaunch.agent" in cmd:
            return int(entry)
    raise AssertionError(f"no agent under the controller {pid}")


def _zlaunch(
    tmp: Path, out: Path, *flags: str, steps: int, sleep: float, save_interval: int
) -> list[str]:
    return [
        sys.executable, "-m", "zlaunch", "--no-color", "--num-gpus", "2",
        "--log-dir", str(tmp / "runs"), "--checkpoint-dir", str(tmp / "ckpt"),
        "--config", _config(tmp), *flags,
        WORKER, "--steps", str(steps), "--step-sleep", str(sleep), "--out", str(out),
        "--save-interval", str(save_interval),
    ]  # fmt: skip


def _preempt_at(tmp: Path, out: Path, step: int, *flags: str, sleep: float, save_interval: int):
    """Start the job, SIGTERM its agent once rank 0 passed ``step``; (exit code, output)."""
    cmd = _zlaunch(tmp, out, *flags, steps=40, sleep=sleep, save_interval=save_interval)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    job = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        reached = seconds_until(lambda: len(_steps(out)) >= step, 120)
        assert reached is not None, "the job never reached the step"
        time.sleep(min(0.3, sleep / 2))  # past the step's boundary: between two steps
        os.kill(_agent_of(job.pid), signal.SIGTERM)
        text, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return job.returncode, text


def _resume(tmp: Path, out: Path, steps: int) -> subprocess.CompletedProcess:
    cmd = _zlaunch(tmp, out, "--resume", steps=steps, sleep=0.0, save_interval=0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def test_sigterm_to_the_agent_saves_at_the_next_step_and_loses_none(tmp_path):
    out = tmp_path / "out"
    code, text = _preempt_at(tmp_path, out, 5, sleep=0.2, save_interval=0)
    assert code == 1, text[-3000:]
    assert (
        "localhost: preemption notice (the agent received SIGTERM); it goes in 30 s: every rank saves at its next step, then the job ends"
        in text
    )
    assert "failed rank" not in text and "killed by" not in text  # not a crash
    latest = (tmp_path / "ckpt" / "latest").read_text().strip()
    saved = int(latest.removeprefix("global_step"))
    assert f"localhost preempted: saved at step {saved}" in text, text[-3000:]
    assert "--resume" in text  # how to go on, since no host is left
    ran = _steps(out)
    assert ran == list(range(1, saved + 1))  # it saved at the step it stopped at

    resumed = _resume(tmp_path, tmp_path / "out2", saved + 3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {tmp_path / 'ckpt' / latest} at step {saved}" in resumed.stdout
    assert _steps(tmp_path / "out2") == [saved + 1, saved + 2, saved + 3]  # none lost or repeated


def test_a_deadline_shorter_than_the_way_to_a_save_is_reported_and_the_last_checkpoint_loads(
    tmp_path,
):
    out = tmp_path / "out"
    # 1 s between steps, and a save takes longer than 0.05 s: the deadline passes first.
    code, text = _preempt_at(
        tmp_path, out, 3, "--preemption-deadline", "0.05", sleep=1.0, save_interval=2
    )
    assert code == 1, text[-3000:]
    assert "the preemption deadline of localhost passed before the save was complete" in text
    latest = (tmp_path / "ckpt" / "latest").read_text().strip()
    step = int(latest.removeprefix("global_step"))
    assert step % 2 == 0 and step >= 2  # one of the job's own, every 2 steps
    assert f"the latest complete checkpoint is {tmp_path / 'ckpt' / latest}" in text, text[-3000:]
    resumed = _resume(tmp_path, tmp_path / "out2", step + 1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {step}" in resumed.stdout
    assert _steps(tmp_path / "out2") == [step + 1]


def test_with_min_nodes_the_job_goes_on_without_the_preempted_host_and_loses_no_step(tmp_path):
    """Two local hosts (localhost and 127.0.0.1, one rank each): SIGTERM to one's agent (their
    command lines are alike: whichever); the job goes on on the other alone with the global batch kept (6,1,6), from the
    step it saved at, spending no restart, and the record says what the change cost."""
    out = tmp_path / "out"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    cmd = _zlaunch(tmp_path, out, steps=12, sleep=0.3, save_interval=0)
    cmd[cmd.index("--num-gpus") : cmd.index("--num-gpus") + 2] = ["--hostfile", str(hostfile)]
    cmd[cmd.index("--config") : cmd.index("--config")] = ["--max-restarts", "1", "--min-nodes", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    job = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert seconds_until(lambda: len(_steps(out)) >= 4, 120) is not None
        agents = [pid for pid in _children(job.pid) if b"zlaunch.agent" in _cmdline(pid)]
        assert len(agents) == 2
        os.kill(agents[0], signal.SIGTERM)
        text, _ = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, text[-3000:]
    gone = "127.0.0.1" if "127.0.0.1: preemption notice" in text else "localhost"
    kept = "localhost" if gone == "127.0.0.1" else "127.0.0.1"
    assert f"{gone}: preemption notice (the agent received SIGTERM)" in text, text[-3000:]
    assert f"going on on {kept} without it (world 1, global batch kept)" in text, text[-3000:]
    rows = [json.loads(line) for line in (out / "losses-0.jsonl").read_text().splitlines()]
    first = sorted({r["step"] for r in rows if r["attempt"] == 0})
    second = sorted({r["step"] for r in rows if r["attempt"] == 1})
    assert first == list(range(1, first[-1] + 1))
    assert second == list(range(first[-1] + 1, 13))  # none lost, none repeated
    assert {r["world"] for r in rows if r["attempt"] == 1} == {1}

    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and not p.is_symlink()]
    attempts = json.loads((run / "run.json").read_text())["attempts"]
    assert [(a["hosts"], a["batch"]) for a in attempts] == [
        (["localhost", "127.0.0.1"], None),
        ([kept], "6,1,6"),
    ]
    change = attempts[1]["change"]
    assert change["kind"] == "preempted" and change["hosts"] == [gone]
    assert change["saved_step"] == first[-1] and change["steps_lost"] == 0
    assert 0 < change["notice_to_restart_s"] < 60
    status = subprocess.run(
        [sys.executable, "-m", "zlaunch", "status", "--log-dir", str(tmp_path / "runs"),
         "--no-color"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert f"preempted {gone}; saved at step {first[-1]}; 0 step(s) lost" in status.stdout


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
