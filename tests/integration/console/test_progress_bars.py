"""Progress bars (lines redrawn with carriage returns) through the real `zlaunch` command:
live on a terminal under the rank prefix (tmux), the latest state in
`zlaunch status` with each rank's last output, a short readable record when piped, and every
byte in the rank logs.
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

from tests.integration.commands.helpers import ranks_state, wait_for
from tests.integration.console.test_live_view import capture, panel_of, tmux

BAR = str(Path(__file__).with_name("bar.py"))
pytestmark = pytest.mark.multirank
LIVE_BAR = re.compile(r"^\[localhost:([01])\] +(\d+)%\|#* *\| \d+/\d+$")


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", *args],
        cwd=cwd, env={**os.environ, "ZLAUNCH_LIVE": "0"},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_bars_update_live_under_the_rank_prefix_in_tmux(tmp_path):
    session = f"zlp{os.getpid()}"
    command = " ".join(
        shlex.quote(a)
        for a in [sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--log-dir",
                  str(tmp_path / "runs"), BAR, "--steps", "60", "--interval", "0.1"]
    )  # fmt: skip
    env = "env -u NO_COLOR -u ZLAUNCH_LIVE -u COLUMNS -u LINES TERM=xterm-256color"
    shell = f"cd {shlex.quote(str(tmp_path))} && {env} {command}; echo ZL-DONE-$?; sleep 120"
    subprocess.run(
        [*tmux(session), "new-session", "-d", "-s", session, "-x", "120", "-y", "40", shell],
        check=True,
    )
    try:
        seen: dict[int, set[int]] = {0: set(), 1: set()}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = capture(session)
            if any("ZL-DONE" in line for line in lines):
                break
            for line in lines:
                match = LIVE_BAR.match(line)
                if match:
                    seen[int(match.group(1))].add(int(match.group(2)))
            time.sleep(0.2)
        # Both ranks' bars were seen part way, several states each, while the job ran.
        for rank in (0, 1):
            mid = {p for p in seen[rank] if 0 < p < 100}
            assert len(mid) >= 3, seen
        final = capture(session, history=True)
        text = "\n".join(final)
        assert "ZL-DONE-0" in text, text
        # Afterwards: each rank's final state once, as a line, and one final panel.
        for rank in (0, 1):
            assert text.count(f"[localhost:{rank}]! 100%|##########| 60/60") == 1, text
        panel_of([line for line in final if "ZL-DONE" not in line])
    finally:
        subprocess.run([*tmux(session), "kill-server"], capture_output=True)
    for rank in (0, 1):
        log = next((tmp_path / "runs" / "latest").glob(f"attempt-0/*/rank-{rank}.log"))
        direct = subprocess.run(
            [sys.executable, BAR, "--steps", "60", "--interval", "0"],
            env={**os.environ, "RANK": str(rank)}, capture_output=True,
        )  # fmt: skip
        # Every byte the worker wrote (stdout lines around the bar on stderr).
        assert (
            log.read_bytes()
            == direct.stdout.split(b"\n", 1)[0]
            + b"\n"
            + direct.stderr
            + (direct.stdout.split(b"\n", 1)[1])
        )


def test_piped_record_is_short_and_status_shows_the_bar_and_last_output(tmp_path):
    runs = tmp_path / "runs"
    job = subprocess.Popen(
        [sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--log-dir", str(runs),
         BAR, "--steps", "80", "--interval", "0.1"],
        cwd=tmp_path, env={**os.environ, "ZLAUNCH_LIVE": "0"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(
            lambda: any(r.get("progress") for r in ranks_state(runs)), 60, "a bar in ranks.json"
        )
        follower = subprocess.Popen(
            [sys.executable, "-m", "zlaunch", "logs", "--log-dir", str(runs), "-f", "-r", "0"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        status = cli("status", "--log-dir", str(runs), "--no-color", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert "LAST OUTPUT" in status.stdout
        assert re.search(r"^  \[localhost:[01]\] +\d+%\|", status.stdout, re.M), status.stdout
        assert re.search(r"alive +- +\d+s ago", status.stdout), status.stdout
        out, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0
    lines = out.splitlines()
    # 8 s of bar: a state at most every 5 s per rank, then the final one; no huge lines.
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[localhost:{rank}]!")]
        assert 2 <= len(mine) <= 4, lines
        assert mine[-1] == f"[localhost:{rank}]! 100%|##########| 80/80"
    assert max(len(line) for line in lines) < 100
    # `logs --follow` showed the bar while it ran (throttled), then its final state; no \r.
    followed, _ = follower.communicate(timeout=30)
    states = [line for line in followed.splitlines() if "%|" in line]
    assert "\r" not in followed and states[-1] == "[localhost:0] 100%|##########| 80/80"
    assert any(not line.endswith("80/80") for line in states), followed
