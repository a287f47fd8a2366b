"""`zlaunch logs --follow`'s reading of a growing rank log (zlaunch/commands/followed_log.py)."""

from __future__ import annotations

from tests.unit.launcher.test_rank_tail import traceback_lines, trainer_like_output
from zlaunch.commands.followed_log import FollowedLog


def follow(chunks: list[bytes]) -> tuple[list[str], list[str | None]]:
    """Lines printed and bar states seen, the log growing by ``chunks`` between two reads."""
    log = FollowedLog()
    printed, states = [], []
    for chunk in chunks:
        printed += [line.decode() for line in log.feed(chunk)]
        state = log.state()
        states.append(state.decode() if state is not None else None)
    printed += [line.decode() for line in log.finish()]
    return printed, states


def test_real_tqdm_output_read_write_by_write():
    printed, states = follow(trainer_like_output())
    assert printed[0] == "{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}"
    assert printed[1].startswith("train: 100%|##########| 16/16 [")
    assert printed[2:] == traceback_lines()
    assert states[2].startswith("train:  12%|#2        | 2/16 [")  # the bar while it is redrawn


def test_a_line_written_over_a_bar_prints_on_its_own_line_after_the_bar_s_last_state():
    chunks = [b"start\n\r 10%|#", b"\r 50%|#####", b"saving checkpoint\n\r 60%|######", b"\n"]
    printed, states = follow(chunks)
    assert printed == ["start", " 50%|#####", "saving checkpoint", " 60%|######"]
    assert states == [" 10%|#", " 50%|#####", " 60%|######", None]


def test_a_line_still_unfinished_when_the_bar_stops_waits_for_its_end():
    printed, _ = follow([b"\r 90%|#########", b"sav", b"ing\n"])
    assert printed == [" 90%|#########", "saving"]


def test_a_bar_cleared_for_a_line_gives_way_to_it_and_the_end_keeps_what_is_left():
    printed, _ = follow([b"\r 30%|###", b"\r      \r", b"{'loss': 1.0}\n", b"\r 40%|####"])
    assert printed == ["{'loss': 1.0}", " 40%|####"]
    assert follow([b"plain without newline"])[0] == ["plain without newline"]
