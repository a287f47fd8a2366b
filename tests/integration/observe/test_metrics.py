"""Step metrics end to end: a 2-rank runtime job under zlaunch on localhost, piped.

The training script (train_tiny.py) writes the losses it computed itself; metrics.jsonl must
carry one row per optimizer step with every field (report steps marked), the rank-averaged loss equal to the
script's, and exact sample/token accounting. The run directory commands (ls, status, logs,
plot) then read that run back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.observe.metrics import METRIC_FIELDS

pytestmark = pytest.mark.multirank

HERE = Path(__file__).parent
TRAIN = str(HERE / "train_tiny.py")
STEPS, EVERY = 12, 5
# micro batch 4 x gradient accumulation 2 x 2 ranks; 4 x 9 token ids per micro batch.
SAMPLES_PER_STEP = 16
TOKENS_PER_STEP = 4 * 9 * 2 * 2


def zlaunch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ZLAUNCH_EVENTS_FD"}
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", *args],
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    out = tmp / "out"
    out.mkdir()
    runs = tmp / "runs"
    result = zlaunch(
        "--num-gpus", "2", "--log-dir", str(runs),
        TRAIN, str(out), "--steps", str(STEPS), "--print-every", str(EVERY), "--lines",
        cwd=tmp,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    run_dir = runs / os.readlink(runs / "latest")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [
        {int(k): v for k, v in json.loads((out / f"losses-{r}.json").read_text()).items()}
        for r in range(2)
    ]
    return {"tmp": tmp, "runs": runs, "run_dir": run_dir, "result": result, "rows": rows,
            "losses": losses}  # fmt: skip


def test_one_row_per_step_with_every_field_report_steps_marked(job):
    engine_rows = [r for r in job["rows"] if r["source"] == "engine"]
    # Every step reaches the controller: nothing is steps_per_print behind; the last step too.
    assert [r["step"] for r in engine_rows] == list(range(1, STEPS + 1))
    assert [r["step"] for r in engine_rows if r["report"]] == [1, 5, 10, 12]
    previous_comm = 0
    for row in engine_rows:
        assert set(METRIC_FIELDS) <= set(row), set(METRIC_FIELDS) - set(row)
        assert (row["kind"], row["rank"], row["host"]) == ("metrics", 0, "localhost")
        step = row["step"]
        assert row["samples"] == step * SAMPLES_PER_STEP
        assert row["total_steps"] == STEPS  # from the WarmupDecayLR schedule
        assert row["world_size"] == 2
        assert row["loss_scale"] == 1.0 and row["skipped_steps"] == 0
        assert isinstance(row["grad_norm"], float) and row["grad_norm"] > 0
        assert isinstance(row["lr"], float)
        assert row["memory_kind"] == "rss"
        assert row["memory_peak_bytes"] >= row["memory_bytes"] > 50 * 2**20
        assert row["comm_bytes"] > previous_comm
        previous_comm = row["comm_bytes"]
        # Rates are over the step itself.
        elapsed = row["step_time"]
        assert row["samples_per_s"] * elapsed == pytest.approx(SAMPLES_PER_STEP)
        assert row["tokens_per_s"] * elapsed == pytest.approx(TOKENS_PER_STEP)
    assert engine_rows[0]["lr"] == 0.0 and engine_rows[1]["lr"] > 0.0  # warmup from 0


def test_losses_equal_what_the_script_computed_averaged_over_ranks(job):
    rank0, rank1 = job["losses"]
    for row in (r for r in job["rows"] if r["source"] == "engine"):
        expected = (rank0[row["step"]] + rank1[row["step"]]) / 2
        assert row["loss"] == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_script_metrics_are_a_row_of_their_own(job):
    user = [r for r in job["rows"] if r["source"] == "user"]
    assert [(r["step"], r["custom_value"], r["rank"]) for r in user] == [(3, 1.5, 0)]


def test_piped_output_is_plain_and_metrics_stay_off_the_scripts_stdout(job):
    out, err = job["result"].stdout.decode(), job["result"].stderr.decode()
    assert "\x1b" not in out and "\x1b" not in err
    assert '"kind"' not in out and "loss_scale" not in out
    lines = out.splitlines()
    assert len(lines) == 2 * STEPS
    assert all(
        line.startswith(("[localhost:0] rank 0 step", "[localhost:1] rank 1 step"))
        for line in lines
    )
    plain = [line for line in err.splitlines() if line.startswith("zlaunch: step ")]
    assert [line.split()[2] for line in plain] == ["1/12", "3", "5/12", "10/12", "12/12"]
    assert "samples/s" in plain[0] and "tokens/s" in plain[0]


def test_ls_status_and_logs_read_the_finished_run(job):
    run_id = job["run_dir"].name
    listing = zlaunch("ls", "--log-dir", str(job["runs"]), cwd=job["tmp"])
    assert listing.returncode == 0
    row = next(line for line in listing.stdout.decode().splitlines() if line.startswith(run_id))
    # hosts, ranks, attempts (one: nothing restarted it), status, last step, log dir
    assert row.split()[3:] == ["localhost", "2", "1", "succeeded", "12/12", str(job["runs"])]

    status = zlaunch("status", run_id[:12], "--log-dir", str(job["runs"]), cwd=job["tmp"])
    text = status.stdout.decode()
    assert status.returncode == 0, status.stderr
    assert "status   succeeded, exit code 0" in text
    assert "metrics  step 12/12  loss " in text
    for rank in (0, 1):
        assert any(line.split()[:2] == ["localhost", str(rank)] and "exited 0  12" in line
                   for line in text.splitlines()), text  # fmt: skip

    logs = zlaunch("logs", "--log-dir", str(job["runs"]), "--rank", "1", "--tail", "2",
                   cwd=job["tmp"])  # fmt: skip
    rank1 = job["losses"][1]
    assert logs.stdout.decode().splitlines() == [
        f"[localhost:1] rank 1 step {s} loss {rank1[s]:.4f}" for s in (STEPS - 1, STEPS)
    ]
    grep = zlaunch("logs", "--log-dir", str(job["runs"]), "--grep", r"step 1[01] ", cwd=job["tmp"])
    assert grep.stdout.decode().splitlines() == [
        f"[localhost:{r}] rank {r} step {s} loss {job['losses'][r][s]:.4f}"
        for r in (0, 1)
        for s in (10, 11)
    ]

    by_host = zlaunch("logs", "--log-dir", str(job["runs"]), "--host", "localhost", "-n", "1",
                      cwd=job["tmp"])  # fmt: skip
    assert [line.split("]")[0] for line in by_host.stdout.decode().splitlines()] == [
        "[localhost:0",
        "[localhost:1",
    ]
    other = zlaunch("logs", "--log-dir", str(job["runs"]), "--host", "node9", cwd=job["tmp"])
    assert other.returncode == 2
    assert f"run {run_id}: no rank log matches the selection" in other.stderr.decode()

    stop = zlaunch("stop", "--log-dir", str(job["runs"]), cwd=job["tmp"])
    assert stop.returncode == 1
    assert f"run {run_id} already ended (succeeded, exit code 0); nothing to stop" in (
        stop.stderr.decode()
    )


def test_plot_writes_a_png_with_the_four_curves(job):
    pytest.importorskip("matplotlib", reason="zlaunch plot needs the plot extra (matplotlib)")
    png = job["tmp"] / "run.png"
    result = zlaunch("plot", "--log-dir", str(job["runs"]), "-o", str(png), cwd=job["tmp"])
    assert result.returncode == 0, result.stderr.decode()
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert f"({STEPS} steps of run {job['run_dir'].name})" in result.stdout.decode()


def test_without_zlaunch_metrics_are_one_logged_line_and_tensorboard_says_if_missing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZLAUNCH_")}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, TRAIN, str(tmp_path), "--steps", "4", "--print-every", "2",
         "--tensorboard", str(tmp_path / "tb")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    losses = {int(k): v for k, v in json.loads((tmp_path / "losses-0.json").read_text()).items()}
    lines = result.stdout.splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "step 1/4",
        "step 2/4",
        "step 3",
        "step 4/4",
    ]
    assert lines[0].split(" | ")[1] == f"loss {losses[1]:.4g}"
    assert lines[2] == "step 3 | custom_value 1.5"
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        assert result.stderr.count("pip install 'zlaunch[tensorboard]'") == 1, result.stderr
        assert not (tmp_path / "tb").exists()
    else:
        assert list((tmp_path / "tb" / "tiny").glob("events.out.tfevents.*"))
