"""Client scripts as users bring them, under zlaunch (and torchrun beside it): a job whose ranks
train alone is said to be one; a job that formed its group is not; losses match torchrun's."""

from __future__ import annotations

import pytest

from tests.integration.clients.launch import clean_env, loss_lines, torchrun, zlaunch
from zlaunch.launcher.world_check import ACCELERATE_CPU_FIX

pytestmark = pytest.mark.multirank  # several torch.distributed processes


def _warnings(run: dict) -> list[str]:
    return [w["text"] for w in run.get("warnings") or []]


def test_a_plain_script_that_never_inits_is_reported_alone(tmp_path):
    done, run = zlaunch(tmp_path, 2, "never_init.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("initialized False") == 2
    expected = (
        "ranks 0-1 of this 2-rank job trained alone, each a world of one (no process group of "
        "the job's size); call torch.distributed.init_process_group() (or your library's "
        "setup) in it"
    )
    assert f"zlaunch: warning: {expected}" in done.stderr.splitlines()
    assert run["status"] == "succeeded" and _warnings(run) == [expected]


def test_plain_accelerator_on_cpu_is_reported_with_the_fix(tmp_path):
    done, run = zlaunch(tmp_path, 2, "accelerate_plain.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("processes 1 ") == 2  # accelerate's own word: each alone
    [warning] = _warnings(run)
    assert warning.startswith("ranks 0-1 of this 2-rank job trained alone")
    assert warning.endswith(ACCELERATE_CPU_FIX)
    assert done.stderr.rstrip().endswith(ACCELERATE_CPU_FIX)  # the job's last line


def test_accelerate_told_to_use_the_cpu_trains_together_and_nothing_is_said(tmp_path):
    done, run = zlaunch(tmp_path, 2, "accelerate_plain.py", env=clean_env(ACCELERATE_USE_CPU="1"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("processes 2 ") == 2
    assert "warning" not in done.stderr and _warnings(run) == []


def test_ddp_losses_are_bitwise_torchrun_s_and_its_own_destroy_still_counts_as_joined(tmp_path):
    args = ("--steps", "4")
    ours, run = zlaunch(tmp_path, 2, "tiny_gpt_ddp.py", *args)
    theirs = torchrun(tmp_path, 2, "tiny_gpt_ddp.py", *args)
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert len(loss_lines(ours.stdout)) == 4
    assert loss_lines(ours.stdout) == loss_lines(theirs.stdout)
    assert "warning" not in ours.stderr and _warnings(run) == []
