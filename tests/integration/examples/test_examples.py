"""examples/: the GPT model, the stdlib character corpus, and the README's first job."""

import functools
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


LINE = re.compile(r"^(?:\[\S+\] )?step\s+(\d+)\s+loss ([0-9.]+)", re.MULTILINE)


def losses_printed(output):
    return [(int(s), float(v)) for s, v in LINE.findall(output)]


def train_gpt(*args):
    out = subprocess.run(
        [
            sys.executable,
            "examples/train_gpt.py",
            "--config",
            "examples/configs/zero1.json",
            "--print-every",
            "5",
            "--threads",
            "1",
            "--max-chars",
            "200000",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={k: v for k, v in os.environ.items() if not k.startswith("ZLAUNCH_")},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_train_gpt_single_process_and_exact_resume(tmp_path):
    full = train_gpt("--steps", "30")
    losses = losses_printed(full)
    assert [s for s, _ in losses] == [5, 10, 15, 20, 25, 30]
    assert losses[-1][1] < losses[0][1] - 0.8, full
    assert "world size 1" in full and "done: 30 steps" in full
    # Stop at 15 with a checkpoint, resume to 30: the same losses as the uninterrupted run.
    first = train_gpt("--steps", "15", "--save-dir", str(tmp_path))
    assert losses_printed(first) == losses[:3]
    assert (tmp_path / "global_step15").is_dir()
    second = train_gpt("--steps", "30", "--save-dir", str(tmp_path), "--resume")
    assert "resumed from" in second and "at step 15" in second
    assert losses_printed(second) == losses[3:]


def test_train_gpt_needs_a_config():
    out = subprocess.run(
        [sys.executable, "examples/train_gpt.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "ZLAUNCH_CONFIG"},
    )
    assert out.returncode == 2 and "give --config FILE" in out.stderr


@functools.cache
def two_rank_run(config):
    zlaunch = shutil.which("zlaunch")
    command = [zlaunch] if zlaunch else [sys.executable, "-m", "zlaunch"]
    out = subprocess.run(
        [
            *command,
            "--num-gpus",
            "2",
            "examples/train_gpt.py",
            "--config",
            config,
            "--steps",
            "40",
            "--print-every",
            "10",
            "--max-chars",
            "200000",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    return out.stdout


@pytest.mark.multirank
def test_readme_first_job_on_two_ranks():
    """zlaunch --num-gpus 2 examples/train_gpt.py --config examples/configs/zero2.json"""
    out = two_rank_run("examples/configs/zero2.json")
    assert "world size 2" in out and "GPT 417,408 parameters" in out
    losses = losses_printed(out)
    assert [s for s, _ in losses] == [10, 20, 30, 40]
    assert losses[-1][1] < losses[0][1] - 0.8, out


@pytest.mark.multirank
def test_stage3_example_matches_stage2():
    """zero3.json differs from zero2.json only in the stage: the same losses, printed to 4 places."""
    stage3 = two_rank_run("examples/configs/zero3.json")
    assert "GPT 417,408 parameters" in stage3  # counted before partitioning
    expected = losses_printed(two_rank_run("examples/configs/zero2.json"))
    got = losses_printed(stage3)
    assert [s for s, _ in got] == [s for s, _ in expected]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        assert a == pytest.approx(b, abs=2e-4)
