"""A failed rank's last lines: real tqdm output, cut into frames as the agent cuts it."""

from __future__ import annotations

import traceback

from tqdm import tqdm

from zlaunch.console.progress import ProgressTracker
from zlaunch.launcher.rank_tail import TRACEBACK_START, RankTail
from zlaunch.wire import frames


class Chunks:
    """A file that keeps every write() apart, as the rank's pipe delivers them."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, text: str) -> None:
        self.writes.append(text.encode())

    def flush(self) -> None:
        pass


def agent_frames(writes: list[bytes]) -> list[tuple[list[str], bool]]:
    """(lines, partial) per OUT frame, as the agent (zlaunch.agent.output) forwards a stream: each read's lines,
    then a carriage-return tail as a piece (every one is due here)."""
    splitter = frames.LineSplitter(frames.MAX_PIECE_BYTES)
    out = []
    for chunk in writes:
        lines = splitter.feed(chunk)
        if lines:
            out.append(([frames.line_text(raw) for raw in lines], splitter.partial))
        if splitter.has_return():
            out.append(([frames.line_text(splitter.take_tail())], True))
    lines = splitter.finish()
    if lines:
        out.append(([frames.line_text(raw) for raw in lines], splitter.partial))
    return out


def trainer_like_output(steps: int = 16, fail: bool = True) -> list[bytes]:
    """A bar over ``steps`` steps with a logged line in the middle, then a traceback."""
    err = Chunks()
    bar = tqdm(total=steps, file=err, mininterval=0, miniters=1, ascii=True, desc="train")
    for step in range(steps):
        bar.update(1)
        if step == steps // 2:
            bar.write("{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}", file=err)
    if fail:
        try:
            raise RuntimeError("CUDA out of memory (simulated)")
        except RuntimeError:
            err.write(traceback.format_exc())
        bar.disable = True  # the process dies here: nobody closes the bar
    else:
        bar.close()
    return err.writes


def traceback_lines() -> list[str]:
    """The traceback trainer_like_output writes, line by line (its file paths are this one)."""
    [text] = [w.decode() for w in trainer_like_output(steps=1) if w.startswith(b"Traceback")]
    return text.rstrip("\n").split("\n")


def tail_of(writes: list[bytes], shown: int = 20) -> tuple[str, ...]:
    tail = RankTail(shown)
    for lines, partial in agent_frames(writes):
        tail.add("e", lines, partial)
    return tail.lines()


def test_a_bar_is_one_line_at_its_latest_state_and_the_traceback_is_whole():
    writes = trainer_like_output()
    assert sum(w.count(b"\r") for w in writes) >= 16  # really redrawn, many times
    lines = tail_of(writes)
    # tqdm.write cleared the bar at 9/16 and wrote the line in its place, as on a terminal;
    # the bar, redrawn below it, stays at its last state on its own line, the traceback after
    tb = traceback_lines()
    assert lines[0] == "{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}"
    assert lines[1].startswith("train: 100%|##########| 16/16 [")
    assert list(lines[2:]) == tb
    assert lines[-1] == "RuntimeError: CUDA out of memory (simulated)"


def test_a_finished_bar_keeps_its_final_state():
    lines = tail_of(trainer_like_output(fail=False))
    assert lines[0] == "{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}"
    assert len(lines) == 2 and lines[1].startswith("train: 100%|##########| 16/16 [")


def test_tracebacks_come_first_when_the_lines_do_not_fit():
    tail = RankTail(shown=6)
    tail.add("o", [f"log line {i}" for i in range(50)], False)
    tb = [TRACEBACK_START, '  File "train.py", line 3, in <module>', "ValueError: bad"]
    tail.add("e", tb, False)
    tail.add("o", ["after 1"], False)
    assert tail.lines() == ("log line 48", "log line 49", *tb, "after 1")


def test_a_traceback_longer_than_the_room_keeps_its_first_and_last_lines():
    tail = RankTail(shown=4)
    frames_ = [f'  File "m{i}.py", line {i}, in f{i}' for i in range(30)]
    tail.add("e", ["noise"] * 10 + [TRACEBACK_START, *frames_, "KeyError: 'x'"], False)
    assert tail.lines() == (TRACEBACK_START, frames_[-2], frames_[-1], "KeyError: 'x'")


def test_without_a_traceback_the_last_lines_are_kept():
    tail = RankTail(shown=3)
    tail.add("o", [str(i) for i in range(10)], False)
    assert tail.lines() == ("7", "8", "9")


def test_the_console_prints_the_same_lines_and_a_bar_interrupted_by_a_log_line_ends_first():
    tracker = ProgressTracker()
    printed = []
    for lines, partial in agent_frames(trainer_like_output()):
        printed += tracker.feed(0, "e", lines, partial)[0]
    assert printed[0] == "{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}"
    assert printed[1].startswith("train: 100%|##########| 16/16 [")
    assert printed[2:] == traceback_lines()
    # a logger writing on the bar's stream without tqdm.write: the bar keeps its own line
    glued = agent_frames([b"\rtrain:  40%|####", b"\rtrain:  50%|#####", b"saving\n", b"next\n"])
    printed = [line for f in glued for line in tracker.feed(1, "e", *f)[0]]
    assert printed == ["train:  50%|#####", "saving", "next"]
