"""The real controller (launch, Job, Attempt, recorder, console) against 1,024 fake ranks:
benchmarks/controller_sim.py replaces only the transport with one process that plays every
node's agent over the frame protocol.

Checked here, not taken from the harness's word: every rank log byte for byte and in order
(lines cut into two frames, non-UTF-8 bytes and stderr frames among them), ranks.json's last
word on every rank, and, with a console that reads too slowly, lines dropped from the console
only, each one counted and said, while every rank log keeps all of them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SIM_PATH = REPO / "benchmarks" / "controller_sim.py"


def _sim():
    spec = importlib.util.spec_from_file_location("controller_sim", SIM_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("controller_sim", module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


sim = _sim()


def run_sim(tmp_path: Path, load, *extra: str) -> tuple[dict, Path]:
    out = tmp_path / "result.jsonl"
    argv = [
        sys.executable, str(SIM_PATH),
        "--nodes", str(load.nodes), "--ranks-per-node", str(load.ranks_per_node),
        "--lines", str(load.lines), "--line-bytes", str(load.line_bytes),
        "--lines-per-frame", str(load.lines_per_frame),
        # Intake is under test, not liveness: a start slowed by a loaded machine must not
        # read as silent agents here.
        "--agent-silence", "600",
        "--keep", str(tmp_path / "sim"), "--json", str(out), *extra,
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.exists(), proc.stderr[-3000:]
    result = json.loads(out.read_text())
    return result, Path(result["run_dir"])


def assert_logs_exact(run_dir: Path, load) -> None:
    logs = sorted((run_dir / "attempt-0").glob("*/rank-*.log"))
    assert len(logs) == load.ranks
    for node in range(load.nodes):
        for local in range(load.ranks_per_node):
            rank = node * load.ranks_per_node + local
            path = run_dir / "attempt-0" / f"sim{node:04d}" / f"rank-{rank}.log"
            got = path.read_bytes()
            want = b"".join(
                sim.line_of(rank, i, load.line_bytes) + b"\n" for i in range(load.lines)
            )
            assert got == want, f"rank {rank}'s log differs ({len(got)} bytes, {len(want)})"


def test_1024_ranks_every_rank_log_is_byte_exact_and_ranks_json_has_every_end(tmp_path):
    # 66 lines of 4-line frames: line 63 is cut into two frames, line 49 is not UTF-8.
    load = sim.Load(nodes=64, ranks_per_node=16, lines=66, line_bytes=40, lines_per_frame=4)
    result, run_dir = run_sim(tmp_path, load)
    assert result["code"] == 0, result
    assert_logs_exact(run_dir, load)
    ranks = json.loads((run_dir / "ranks.json").read_text())["ranks"]
    assert [row["rank"] for row in ranks] == list(range(1024))
    assert {(row["state"], row["exit_code"]) for row in ranks} == {("exited", 0)}
    assert result["peak_rss_mib"] < 1024


def test_a_slow_console_drops_and_counts_lines_and_every_rank_log_keeps_them(tmp_path):
    load = sim.Load(nodes=16, ranks_per_node=16, lines=100, line_bytes=100, lines_per_frame=8)
    # stdout read at 200 kB/s, the console holding 100 kB before it drops: 2.6 MB of lines.
    # --no-collapse: each console line is one rank line, so the count adds up exactly (a
    # collapsed line that is dropped counts once, for all the ranks it names).
    result, run_dir = run_sim(
        tmp_path, load, "--console", "slow:200000", "--console-limit", "100000", "--no-collapse"
    )
    assert result["code"] == 0, result
    assert_logs_exact(run_dir, load)
    dropped, shown = result["console_dropped"], result["console_lines"]
    assert dropped > 0 and shown > 0
    assert shown + dropped == result["console_expected"]  # every line shown or counted
    assert result["console_dropped_said"] == dropped  # and the total said at the end
