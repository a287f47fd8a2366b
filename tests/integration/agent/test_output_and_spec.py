"""Output of any size and bytes, big environments and NUL bytes never
end or hang a job. Each case runs the real ``zlaunch`` command on localhost."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from tests.integration.commands.hostile_input import assert_usage_error, write_script, zlaunch

# Bytes a worker writes without a single newline: every invalid UTF-8 byte costs 6 bytes of
# JSON, so the old frames were ~6x this, far over the 8 MiB frame limit.
HOSTILE_BYTES = 10 * 1024 * 1024

BINARY_WORKER = """
import os, random, sys
rng = random.Random(int(os.environ["RANK"]))
data = bytes(rng.randrange(0x80, 0x100) for _ in range(256 * 1024))
out = sys.stdout.buffer
sent = 0
while sent < {size}:
    out.write(data)
    sent += len(data)
out.write(b"\\rprogress 100%\\r")  # a tqdm bar ends without a newline too
out.flush()
print("after", file=sys.stderr)
"""


def _rank_log(runs: Path, rank: int) -> bytes:
    run = runs / os.readlink(runs / "latest")
    (log,) = (run / "attempt-0").glob(f"*/rank-{rank}.log")
    return log.read_bytes()


def test_output_without_newlines_of_any_bytes_reaches_the_log_and_the_job_succeeds(tmp_path):
    script = write_script(tmp_path, "binary.py", BINARY_WORKER.format(size=HOSTILE_BYTES))
    result = zlaunch(tmp_path, "--log-dir", "runs", "--num-gpus", "1", script)
    assert result.returncode == 0, result.stderr.decode("utf-8", "replace")[-3000:]
    rng = random.Random(0)
    data = bytes(rng.randrange(0x80, 0x100) for _ in range(256 * 1024))
    expected = data * (HOSTILE_BYTES // len(data)) + b"\rprogress 100%\r"
    log = _rank_log(tmp_path / "runs", 0)
    # stderr's line lands between two pieces of stdout's: only stdout's bytes are ordered
    assert log.replace(b"after\n", b"", 1) == expected
    assert b"after\n" in log


def test_a_big_env_file_shared_by_many_slots_starts_the_job(tmp_path):
    # 1 MiB shared by 12 workers: sent once per node, not once per worker (was 12 MiB: the
    # agent could not read its spec and the job sat in "starting" forever).
    # (Many names: Linux takes at most 128 KiB per variable.)
    lines = "".join(f"BIG_{i}={'v' * 32 * 1024}\n" for i in range(32))
    (tmp_path / ".zlaunch_env").write_text(lines)
    script = write_script(
        tmp_path, "env.py", "import os; assert len(os.environ['BIG_31']) == 1 << 15\n"
    )
    result = zlaunch(tmp_path, "--log-dir", "runs", "--num-gpus", "12", script, timeout=120)
    assert result.returncode == 0, result.stderr.decode()[-3000:]


def test_a_spec_over_the_limit_fails_fast_naming_the_variable_not_its_value(tmp_path):
    (tmp_path / ".zlaunch_env").write_text("HUGE=" + "s3cr3t" * (1_500_000) + "\nSMALL=1\n")
    script = write_script(tmp_path, "ok.py", "pass\n")
    result = zlaunch(tmp_path, "--log-dir", "runs", "--num-gpus", "1", script, timeout=60)
    err = assert_usage_error(result, "HUGE", "MiB")
    assert "s3cr3t" not in err and "s3cr3t" not in result.stdout.decode()
    record = json.loads(next((tmp_path / "runs").glob("*/run.json")).read_text())
    assert record["status"] == "failed" and record["exit_code"] == 2


def test_a_nul_byte_in_an_env_file_is_refused_at_its_line(tmp_path):
    (tmp_path / ".zlaunch_env").write_bytes(b"A=1\nB=x\x00y\n")
    script = write_script(tmp_path, "ok.py", "pass\n")
    result = zlaunch(tmp_path, "--log-dir", "runs", "--num-gpus", "1", script, timeout=60)
    assert_usage_error(result, ".zlaunch_env:2", "B", "NUL")
    assert not (tmp_path / "runs").exists()  # refused before anything started
