"""``save_checkpoint(async_save=True)``: returns before the files are written, training goes
on untouched, the checkpoint holds the state at the save (not later), ``latest`` moves only
when every rank's files are complete, and a crash mid-write leaves the previous checkpoint."""

from __future__ import annotations

import pytest
import torch

from runtime.checkpoint.reader import CheckpointReader
from tests.integration.engine.mp_utils import RankFailed, run_ranks

pytestmark = pytest.mark.multirank

WORKER = "tests/integration/checkpoint/async_save_worker.py"
SLOW = "ZLAUNCH_TEST_SLOW_SAVE"


def test_async_save_writes_the_state_of_the_save_while_training_goes_on(tmp_path, monkeypatch):
    sync = run_ranks(
        2,
        f"{WORKER}:save_and_continue",
        {"stage": 2, "save_dir": str(tmp_path / "s"), "async_save": False},
    )[0]
    monkeypatch.setenv(SLOW, "1.5")  # every shard write pauses 1.5 s half way
    late = run_ranks(
        2,
        f"{WORKER}:save_and_continue",
        {"stage": 2, "save_dir": str(tmp_path / "a"), "async_save": True},
    )[0]
    assert late["returned_after"] < 1.0 and late["latest_at_return"] is None
    assert late["latest_after_wait"] == "global_step2"
    assert late["losses"] == sync["losses"]  # training is not disturbed by the write
    with CheckpointReader(sync["path"]) as a, CheckpointReader(late["path"]) as b:
        assert a.shapes == b.shapes and a.kinds == b.kinds
        for name in a.shapes:
            for kind in a.kinds:
                assert torch.equal(a.read(name, kind), b.read(name, kind)), (name, kind)
        assert a.state("counters") == b.state("counters")


def test_a_crash_during_an_async_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOW, "30@global_step2")
    with pytest.raises(RankFailed, match="exited with -9"):
        run_ranks(1, f"{WORKER}:crash_during_async_save", {"save_dir": str(tmp_path)})
    assert (tmp_path / "latest").read_text().strip() == "global_step1"
    assert not (tmp_path / "global_step2").exists()
    with CheckpointReader(str(tmp_path / "global_step1")) as reader:
        reader.verify_checksums()
        assert reader.state("counters")["global_steps"] == 1
