"""The live view in a real terminal: a 2-rank runtime job inside tmux (120x40), pane captured
while it runs and after it ended. Rank lines must scroll whole above one pinned panel.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.console.test_live_view import tmux  # shared with the unit half

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]

TRAIN = str(Path(__file__).parents[1] / "observe" / "train_tiny.py")
STEPS = 12
RANK_LINE = re.compile(r"^\[localhost:([01])\] rank \1 step (\d+) loss \d+\.\d{4}$")
TOP, BOTTOM = "╭─ zlaunch ", "╰"


def capture(session: str, history: bool = False) -> list[str]:
    argv = [*tmux(session), "capture-pane", "-p", "-t", session]
    if history:
        argv += ["-S", "-"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout
    return out.splitlines()


def panel_of(lines: list[str]) -> list[str]:
    """The one panel (top border to bottom border); asserts there is exactly one."""
    tops = [i for i, line in enumerate(lines) if line.startswith(TOP)]
    assert len(tops) == 1, "\n".join(lines)
    start = tops[0]
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(BOTTOM))
    body = lines[start : end + 1]
    assert all(line.startswith("│") and line.rstrip().endswith("│") for line in body[1:-1]), body
    assert all(not line.strip() for line in lines[end + 1 :] if "ZL-DONE" not in line), lines
    return body


def check_rank_lines(lines: list[str]) -> list[tuple[int, int]]:
    lines = [line for line in lines if line.strip()]
    if lines and lines[0].startswith("zlaunch: run "):
        # The run's id and log directory come first (wrapped when the path is long).
        first = next(i for i, line in enumerate(lines) if RANK_LINE.match(line))
        assert first <= 3, lines
        lines = lines[first:]
    seen = []
    for line in lines:
        if not line.strip():
            continue
        match = RANK_LINE.match(line)
        assert match, f"garbled or unexpected line above the panel: {line!r}"
        seen.append((int(match.group(1)), int(match.group(2))))
    return seen


def test_live_view_in_tmux_shows_logs_progress_and_metrics_ungarbled(tmp_path):
    session = f"zlv{os.getpid()}"
    command = " ".join(
        shlex.quote(a)
        for a in [
            sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--log-dir", str(tmp_path / "runs"),
            TRAIN, str(tmp_path), "--steps", str(STEPS), "--print-every", "2", "--lines",
            "--sleep", "0.3",
        ]
    )  # fmt: skip
    env = ["env", "-u", "NO_COLOR", "-u", "ZLAUNCH_LIVE", "-u", "COLUMNS", "-u", "LINES"]
    env.append("TERM=xterm-256color")
    shell = (
        f"cd {shlex.quote(str(tmp_path))} && {' '.join(env)} {command}; echo ZL-DONE-$?; sleep 120"
    )
    subprocess.run(
        [*tmux(session), "new-session", "-d", "-s", session, "-x", "120", "-y", "40", shell],
        check=True,
    )
    try:
        # While it runs: a progress bar part way, the metrics, both ranks alive.
        deadline = time.monotonic() + 90
        mid = None
        while time.monotonic() < deadline:
            lines = capture(session)
            text = "\n".join(lines)
            if re.search(r"step ([4-9]|10)/12", text) and "ZL-DONE" not in text:
                mid = lines
                break
            time.sleep(0.2)
        assert mid is not None, "\n".join(capture(session))
        panel = panel_of(mid)
        assert len(panel[0]) == 120, panel  # the panel spans the 120-column terminal
        above = mid[: mid.index(panel[0])]
        assert check_rank_lines(above), mid
        body = "\n".join(panel)
        assert re.search(r"[━╸╺]+ +step \d+/12 +\d+% +ETA \d+:\d\d +elapsed", body), body
        for label in ("loss ", "lr ", "grad norm ", "loss scale ", "samples/s ", "tokens/s ",
                      "step time ", "mem ", "comm ", "custom_value 1.5",
                      "ranks alive: localhost 2/2"):  # fmt: skip
            assert label in body, (label, body)
        assert panel[-1].rstrip().endswith("running ─╯"), panel[-1]

        # After the end: every rank line exactly once, the final panel once, below them.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("ZL-DONE" in ln for ln in capture(session)):
            time.sleep(0.2)
        final = capture(session, history=True)
        assert "ZL-DONE-0" in "\n".join(final), "\n".join(final)
        panel = panel_of(final)
        seen = check_rank_lines(final[: final.index(panel[0])])
        assert sorted(seen) == [(r, s) for r in (0, 1) for s in range(1, STEPS + 1)]
        body = "\n".join(panel)
        assert re.search(r"step 12/12 +100%", body), body
        assert "ranks alive: localhost 0/2" in body and panel[-1].rstrip().endswith("succeeded ─╯")
        print("\n" + "\n".join(final))
    finally:
        subprocess.run([*tmux(session), "kill-server"], capture_output=True)


def test_ctrl_c_in_tmux_leaves_one_panel_saying_stopped_not_failed(tmp_path):
    """Ctrl-C: the ranks zlaunch stopped are "stopped", not "failed"; the echoed ^C no longer
    shifts the panel (no stray top border), and the terminal echoes again afterwards."""
    session = f"zlc{os.getpid()}"
    ticker = str(Path(__file__).parents[1] / "commands" / "ticker.py")
    command = " ".join(
        shlex.quote(a)
        for a in [
            sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--log-dir", str(tmp_path / "runs"),
            ticker, "--count", "1000", "--interval", "0.2",
        ]
    )  # fmt: skip
    env = "env -u NO_COLOR -u ZLAUNCH_LIVE -u COLUMNS -u LINES TERM=xterm-256color"
    shell = (
        f"cd {shlex.quote(str(tmp_path))} && {env} {command}; echo ZL-DONE-$?; "
        "stty -a | grep -o ' -*echo ' | sed 's/^/ZL-STTY/'; sleep 120"
    )
    subprocess.run(
        [*tmux(session), "new-session", "-d", "-s", session, "-x", "120", "-y", "40", shell],
        check=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "seq=6 " not in "\n".join(capture(session)):
            time.sleep(0.2)
        subprocess.run([*tmux(session), "send-keys", "-t", session, "C-c"], check=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "ZL-STTY" not in "\n".join(capture(session)):
            time.sleep(0.2)
        final = capture(session, history=True)
        text = "\n".join(final)
        assert "ZL-DONE-130" in text and "ZL-STTY echo" in text, text
        after = ("ZL-STTY", "error: stopped by SIGINT")  # printed below the final panel
        panel = panel_of([line for line in final if not line.startswith(after)])
        body = "\n".join(panel)
        assert "stopped ranks: 0-1" in body and "failed ranks" not in body, body
        assert panel[-1].rstrip().endswith("interrupted ─╯"), panel[-1]
        print("\n" + text)
    finally:
        subprocess.run([*tmux(session), "kill-server"], capture_output=True)
