"""End to end on localhost: the `zlaunch` command, the local transport, the agent, real workers.

"Gone" is checked by listing this machine's processes (every process that carries the job's
ZLAUNCH_RUN_ID in its environment, plus the agent), never by trusting zlaunch's word.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.launcher import fake_worker, helpers
from tests.integration.launcher.helpers import alive, seconds_until

FAKE = fake_worker.__file__

jobs = helpers.jobs


def job_pids(run_id: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds this job's run id."""
    needle = f"ZLAUNCH_RUN_ID={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(entry))
    return found


class Job(helpers.Job):
    def __init__(self, tmp_path: Path, ranks: int, worker_args: list[str], *options: str):
        records, runs = tmp_path / "records", tmp_path / "runs"
        argv = [
            sys.executable, "-m", "zlaunch", "--log-dir", str(runs), "--num-gpus", str(ranks),
            *options, FAKE, "--record-dir", str(records), *worker_args,
        ]  # fmt: skip
        super().__init__(
            argv, tmp_path, records=records, runs=runs, ranks=ranks, timeout=60, ready_timeout=30
        )


def launch(jobs, *args, **kwargs) -> Job:
    job = Job(*args, **kwargs)
    jobs.append(job)
    return job


def wait_gone(pids, timeout: float) -> float | None:
    return seconds_until(lambda: not any(alive(p) for p in pids), timeout)


def test_every_rank_gets_its_exact_env_and_the_run_is_recorded(jobs, tmp_path):
    job = launch(jobs, tmp_path, 3, [], "--env", "HOSTILE=$(touch x); 'q' \"q\"\nüñï")
    code, out, err = job.communicate()
    assert code == 0, err
    records = [json.loads((job.records / f"rank-{r}.json").read_text()) for r in range(3)]
    run = json.loads((job.run_dir() / "run.json").read_text())
    port = records[0]["env"]["MASTER_PORT"]
    assert port.isdigit() and 0 < int(port) < 65536
    for r, rec in enumerate(records):
        env = rec["env"]
        expected = {
            "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
            "NODE_RANK": "0", "NUM_NODES": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
            "CUDA_VISIBLE_DEVICES": "0,1,2", "ZLAUNCH_RUN_ID": run["run_id"], "ZLAUNCH_ATTEMPT": "0",
            "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
            "HOSTILE": "$(touch x); 'q' \"q\"\nüñï",
        }  # fmt: skip
        assert {k: env.get(k) for k in expected} == expected
        assert env["ZLAUNCH_EVENTS_FD"].isdigit()
        assert rec["sid"] == rec["pid"]  # own session: its group can be stopped as a whole
        assert rec["cwd"] == str(tmp_path)
    assert not (tmp_path / "x").exists()
    assert run["status"] == "succeeded" and run["exit_code"] == 0
    assert [n["host"] for n in run["plan"]["nodes"]] == ["localhost"]
    assert not job_pids(run["run_id"])


def test_exit_code_propagates_and_the_rest_is_stopped(jobs, tmp_path):
    job = launch(
        jobs, tmp_path, 3, ["--only-rank", "1", "--exit", "3", "--others", "hang", "--delay", "0.5"]
    )
    code, out, err = job.communicate()
    assert code == 3, err
    assert "rank 1 on localhost exited with code 3" in err
    failure = json.loads((job.run_dir() / "failure.json").read_text())
    assert failure["root_cause"]["rank"] == 1 and failure["root_cause"]["exit_code"] == 3
    assert failure["stopped_ranks"] == [0, 2]
    records = [json.loads((job.records / f"rank-{r}.json").read_text()) for r in range(3)]
    assert not [r["pid"] for r in records if alive(r["pid"])]
    assert not alive(records[0]["ppid"])  # the agent
    assert not job_pids(records[0]["env"]["ZLAUNCH_RUN_ID"])


def test_death_by_sigkill_exits_137_and_names_the_signal(jobs, tmp_path):
    job = launch(jobs, tmp_path, 2, ["--only-rank", "0", "--signal", "KILL", "--others", "hang"])
    code, out, err = job.communicate()
    assert code == 137, err
    assert "rank 0 on localhost was killed by SIGKILL" in err
    assert "pid" in err and "Root cause" in err
    failure = json.loads((job.run_dir() / "failure.json").read_text())
    assert failure["root_cause"]["signal_name"] == "SIGKILL"
    assert not job_pids(failure["run_id"])


def test_sigint_stops_everything_within_grace(jobs, tmp_path):
    grace = 1.0
    job = launch(jobs, tmp_path, 2, ["--hang", "--ignore-sigterm"], "--grace-period", str(grace))
    records = job.records_ready()
    run_id = records[0]["env"]["ZLAUNCH_RUN_ID"]
    pids = [r["pid"] for r in records] + [records[0]["ppid"]]
    job.proc.send_signal(signal.SIGINT)
    took = wait_gone(pids, grace + 2.0)
    assert took is not None, f"still alive {grace + 2.0}s after SIGINT: {job_pids(run_id)}"
    code, out, err = job.communicate(timeout=10)
    assert code == 130, err
    assert (job.records / "rank-0.sigterm").exists()  # TERM first, KILL after the grace
    assert not job_pids(run_id)
    assert json.loads((job.run_dir() / "run.json").read_text())["status"] == "interrupted"


def test_sigkill_to_zlaunch_leaves_nothing_behind(jobs, tmp_path):
    job = launch(jobs, tmp_path, 2, ["--hang"])
    records = job.records_ready()
    run_id = records[0]["env"]["ZLAUNCH_RUN_ID"]
    job.proc.kill()
    job.proc.wait()
    assert wait_gone([r["pid"] for r in records] + [records[0]["ppid"]], 10.0) is not None
    assert not job_pids(run_id)


def test_many_lines_arrive_intact_and_in_order_on_console_and_in_files(jobs, tmp_path):
    n = 20000
    job = launch(jobs, tmp_path, 2, ["--lines", str(n)])
    code, out, err = job.communicate(timeout=120)
    assert code == 0, err
    assert "\x1b" not in out and "\x1b" not in err  # piped: no escape codes
    want = {
        (r, s): [fake_worker.line(r, q) for q in range(n) if (q % 2 == 0) == (s == "out")]
        for r in range(2)
        for s in ("out", "err")
    }
    console = {key: [] for key in want}
    for text in out.splitlines():
        prefix, _, rest = text.partition(" ")
        rank = int(prefix.split(":")[1].split("]")[0])
        stream = "err" if prefix.endswith("]!") else "out"
        console[(rank, stream)].append(rest)
    assert console == want
    for r in range(2):
        (path,) = job.run_dir().glob(f"attempt-0/*/rank-{r}.log")
        lines = path.read_text().splitlines()
        assert len(lines) == n
        for s in ("out", "err"):
            assert [x for x in lines if f"stream={s} " in x] == want[(r, s)]


def test_ranks_filter_limits_the_console_not_the_files(jobs, tmp_path):
    job = launch(jobs, tmp_path, 3, ["--lines", "10"], "--ranks", "1")
    code, out, err = job.communicate()
    assert code == 0, err
    assert {line.split(" ")[0].rstrip("!") for line in out.splitlines()} == {"[localhost:1]"}
    for r in range(3):
        (path,) = job.run_dir().glob(f"attempt-0/*/rank-{r}.log")
        assert len(path.read_text().splitlines()) == 10


def test_check_reports_a_busy_master_port_and_a_missing_interpreter(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "zlaunch", "check", "--master-port", str(port)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
    assert out.returncode == 1, out.stderr
    (row,) = [line for line in out.stdout.splitlines() if line.startswith("localhost")]
    assert "in use" in row and f"master port {port} is in use" in row
    assert "\x1b" not in out.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "zlaunch", "check", "--python", str(tmp_path / "nopython")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "nopython" in missing.stdout and "FAILED" in missing.stdout


def test_second_ctrl_c_kills_at_once(jobs, tmp_path):
    job = launch(jobs, tmp_path, 2, ["--hang", "--ignore-sigterm"], "--grace-period", "60")
    records = job.records_ready()
    pids = [r["pid"] for r in records] + [records[0]["ppid"]]
    job.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 10
    while not (job.records / "rank-0.sigterm").exists():  # the first one arrived: TERM sent
        assert time.monotonic() < deadline
        time.sleep(0.02)
    job.proc.send_signal(signal.SIGINT)
    took = wait_gone(pids, 3.0)
    assert took is not None, "a second Ctrl-C did not kill the ranks at once"
    code, out, err = job.communicate(timeout=10)
    assert code == 130, err
    assert "killing all ranks now" in err


def test_worker_metrics_events_land_in_metrics_jsonl(tmp_path):
    script = tmp_path / "emit.py"
    script.write_text(
        "import json, os\n"
        "fd = int(os.environ['ZLAUNCH_EVENTS_FD'])\n"
        "for step in range(3):\n"
        "    row = {'kind': 'metrics', 'step': step, 'loss': 1.0 / (step + 1)}\n"
        "    os.write(fd, (json.dumps(row) + '\\n').encode())\n"
        'os.write(fd, b\'{"kind": "other"}\\n\')\n'
    )
    runs = tmp_path / "runs"
    out = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--log-dir", str(runs), "--num-gpus", "2", str(script)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = [json.loads(x) for x in (runs / "latest" / "metrics.jsonl").read_text().splitlines()]
    got = sorted((r["rank"], r["step"], r["loss"], r["host"]) for r in rows)
    assert got == [(r, s, 1.0 / (s + 1), "localhost") for r in range(2) for s in range(3)]


def test_save_signal_before_the_runtime_listens_does_not_kill_workers(jobs, tmp_path):
    # The fake worker never installs a SIGUSR1 handler (like a worker still importing torch):
    # the forwarded save signal must find it ignored, not kill it with the default action.
    ckpt = tmp_path / "ckpt"
    job = launch(
        jobs, tmp_path, 2, ["--delay", "1.5", "--exit", "0"], "--checkpoint-dir", str(ckpt)
    )
    records = job.records_ready()
    assert all(r["env"]["ZLAUNCH_SAVE_ON"] == "SIGUSR1" for r in records)
    job.proc.send_signal(signal.SIGUSR1)
    code, out, err = job.communicate()
    assert code == 0, err
    assert "killed by" not in err


def test_a_restart_is_never_recorded_as_the_run_s_end(tmp_path):
    """--max-restarts: between a failed attempt and the next, run.json says "restarting" (no
    end time), so `zlaunch logs --follow`, `ls` and `stop` never take the run for ended."""
    script = tmp_path / "fails_once.py"
    script.write_text(
        "import os, sys\nsys.exit(3 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)\n"
    )
    runs = tmp_path / "runs"
    argv = [
        sys.executable, "-m", "zlaunch", "--log-dir", str(runs), "--num-gpus", "2",
        "--max-restarts", "1", str(script),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []  # every distinct (status, ended) run.json showed while the job ran
    while proc.poll() is None:
        try:
            record = json.loads((runs / "latest" / "run.json").read_text())
        except (OSError, ValueError):
            continue
        state = (record["status"], record.get("end_time") is not None)
        if not seen or seen[-1] != state:
            seen.append(state)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "restarting all ranks" in err
    record = json.loads((runs / "latest" / "run.json").read_text())
    assert (record["status"], record["exit_code"]) == ("succeeded", 0)
    assert ("failed", True) not in seen and not any(ended for _, ended in seen[:-1]), seen
    run_dir = runs / os.readlink(runs / "latest")
    assert (run_dir / "attempt-0").is_dir() and (run_dir / "attempt-1").is_dir()


def test_a_console_nobody_reads_does_not_delay_fail_fast(tmp_path):
    """`zlaunch ... | less` left on its first page: the pipe fills up, yet a rank's failure
    still stops every rank at once (the console is written from a thread of its own); zlaunch
    itself exits once its reader has taken the rest."""
    runs, records = tmp_path / "runs", tmp_path / "records"
    argv = [
        sys.executable, "-m", "zlaunch", "--log-dir", str(runs), "--num-gpus", "2",
        FAKE, "--record-dir", str(records), "--lines", "40000",
        "--exit", "3", "--only-rank", "1", "--delay", "1", "--others", "hang",
    ]  # fmt: skip
    with open(tmp_path / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err)  # not read for now
    try:
        wait_until = time.monotonic() + 60
        while not (runs / "latest" / "ranks.json").exists() and time.monotonic() < wait_until:
            time.sleep(0.05)
        run_id = os.readlink(runs / "latest")
        # rank 0 prints 40000 lines and would hang forever: only fail-fast can end it
        gone = seconds_until(lambda: job_started(runs) and not job_pids(run_id), 60)
        assert gone is not None, "ranks still running: the blocked console held up the stop"
        out, _ = proc.communicate(timeout=60)  # now read: zlaunch writes the rest and exits
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, (tmp_path / "stderr.txt").read_text()
    assert out.count(b"\n") >= 40000  # the console got everything in the end
    # every line of rank 0 is in its log (stdout and stderr interleaved as they arrived)
    log = (runs / run_id / "attempt-0" / "localhost" / "rank-0.log").read_text().splitlines()
    assert sorted(log) == sorted(fake_worker.line(0, seq) for seq in range(40000))


def job_started(runs: Path) -> bool:
    """Both ranks were started (ranks.json lists their pids)."""
    try:
        rows = json.loads((runs / "latest" / "ranks.json").read_text())["ranks"]
    except (OSError, ValueError, KeyError):
        return False
    return len(rows) == 2 and all(r["pid"] for r in rows)
