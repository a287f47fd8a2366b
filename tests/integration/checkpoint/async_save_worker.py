"""Async saves on real ranks (run by mp_utils.run_ranks), with ckpt_worker's tiny GPT."""

from __future__ import annotations

import os
import signal
import time

from tests.integration.checkpoint.ckpt_worker import build, train_step


def save_and_continue(stage: int, save_dir: str, async_save: bool) -> dict:
    """Train 2 steps, save (async or not), train 2 more steps while it writes, then wait."""
    engine = build(stage)
    for _ in range(2):
        train_step(engine)
    begin = time.perf_counter()
    path = engine.save_checkpoint(save_dir, async_save=async_save)
    returned_after = time.perf_counter() - begin
    latest_at_return = _latest(save_dir)
    losses = [train_step(engine) for _ in range(2)]
    engine.wait_for_checkpoint()
    return {
        "path": path,
        "returned_after": returned_after,
        "latest_at_return": latest_at_return,
        "latest_after_wait": _latest(save_dir),
        "losses": losses,
    }


def crash_during_async_save(save_dir: str) -> None:
    """A checkpoint saved synchronously, then an async one killed mid-write (SIGKILL)."""
    engine = build(2)
    train_step(engine)
    engine.save_checkpoint(save_dir)  # global_step1: the one that must survive
    train_step(engine)
    engine.save_checkpoint(save_dir, async_save=True)  # slowed down by the test's env
    train_step(engine)
    time.sleep(0.5)  # the shard is half written now
    os.kill(os.getpid(), signal.SIGKILL)


def _latest(save_dir: str) -> str | None:
    try:
        with open(os.path.join(save_dir, "latest")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None
