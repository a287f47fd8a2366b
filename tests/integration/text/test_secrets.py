"""Secrets never reach the run directory or the dry-run plan, and the run
directory is private. Through the real ``zlaunch`` command."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.commands.hostile_input import write_script, zlaunch
from zlaunch.text.redact import NOT_RECORDED, REDACTED

SECRET = "hunter2x"
# Names that the old TOKEN|SECRET|PASSWORD|KEY pattern missed, and a value-borne secret.
ENV = {
    "DB_PASSWD": SECRET,
    "DATABASE_URL": f"postgres://app:{SECRET}@db.internal:5432/prod",
    "GH_PAT": f"ghp_{SECRET}",  # hidden by its name (the value is not a token's shape)
    "AUTH_BEARER": SECRET,
    "INNOCENT_LOOKING": SECRET,
}
ARGS = (f"--api-token={SECRET}", "--password", SECRET, "--lr", "0.1")


def _env_args() -> list[str]:
    args = []
    for name in ENV:
        args += ["--env", name]  # value from the environment: not visible in `ps`
    return args


def test_run_directory_holds_no_secret_and_is_private(tmp_path):
    script = write_script(tmp_path, "w.py", "print('hello')\n")
    result = zlaunch(
        tmp_path, "--log-dir", "runs", "--num-gpus", "2", *_env_args(), script, *ARGS, env=ENV
    )
    assert result.returncode == 0, result.stderr.decode()
    runs = tmp_path / "runs"
    seen = []
    for root, dirs, files in os.walk(runs):
        for name in dirs:
            mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
            assert mode == 0o700, (os.path.join(root, name), oct(mode))
        for name in files:
            path = os.path.join(root, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
            with open(path, "rb") as f:
                assert SECRET.encode() not in f.read(), path
            seen.append(name)
    assert stat.S_IMODE(os.stat(runs).st_mode) == 0o700
    assert "run.json" in seen and "rank-1.log" in seen
    record = (next(runs.glob("*/run.json"))).read_text()
    assert "DB_PASSWD" in record and NOT_RECORDED in record  # names stay, values do not


def test_dry_run_shows_no_secret(tmp_path):
    script = write_script(tmp_path, "w.py", "pass\n")
    result = zlaunch(tmp_path, "--dry-run", "--num-gpus", "2", *_env_args(), script, *ARGS, env=ENV)
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    for name in ("DB_PASSWD", "GH_PAT", "AUTH_BEARER", "DATABASE_URL"):
        assert name in out
    assert "postgres://app:<redacted>@db.internal:5432/prod" in out
    # INNOCENT_LOOKING cannot be told from a harmless name: the user sees it in their own plan.
    assert out.count(SECRET) == out.count(f"INNOCENT_LOOKING={SECRET}") == 1


# ---- no secret on a command line zlaunch builds ------------------------------------------------

HF_TOKEN = "hf_" + "Ab3" * 12
PASSWORD = "pa55wordZ"
IB_TOKEN = "ibsecret77"
# A stand-in salloc: records its arguments, then runs the command as salloc does, inside a
# one-node "allocation". A stand-in srun: records its arguments, runs the agent here.
FAKE_SALLOC = """#!{python}
import json, os, sys
args = sys.argv[1:]
first = next(i for i, a in enumerate(args) if not a.startswith("-"))
with open(os.environ["FAKE_RECORDS"] + "/salloc.json", "w") as f:
    json.dump(args, f)
env = {{**os.environ, "SLURM_JOB_ID": "78", "SLURM_JOB_NODELIST": "nodeA",
       "SLURM_TASKS_PER_NODE": "2"}}
os.execvpe(args[first], args[first:], env)
"""
FAKE_SRUN = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORDS"] + "/srun.json", "w") as f:
    json.dump(args, f)
cut = args.index("--")
os.execvpe(args[cut + 1], args[cut + 1:], {{**os.environ, "SLURMD_NODENAME": "nodeA"}})
"""


def _stand_ins(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("salloc", FAKE_SALLOC), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _command_lines_holding(secrets_: tuple[str, ...]) -> list[str]:
    """Every process's command line on this machine that holds one of ``secrets_``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if any(s in line for s in secrets_):
            found.append(f"{entry}: {line[:300]}")
    return found


def test_no_secret_reaches_a_command_line_from_salloc_to_the_workers(tmp_path):
    from tests.integration.launcher import fake_worker

    records = tmp_path / "records"
    records.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(
        PATH=f"{_stand_ins(tmp_path)}{os.pathsep}{env['PATH']}",
        FAKE_RECORDS=str(records),
        PYTHONPATH=str(Path(__file__).resolve().parents[3]),
        HOME=str(tmp_path),
    )
    script_args = [f"--hf_token={HF_TOKEN}", "--db", f"postgres://app:{PASSWORD}@db:5432/x"]
    argv = [
        sys.executable, "-m", "zlaunch", "--nodes", "1", "--num-gpus", "2",
        "--env", f"NCCL_IB_TOKEN={IB_TOKEN}", "--log-dir", str(tmp_path / "runs"),
        fake_worker.__file__, "--record-dir", str(records), "--delay", "3", *script_args,
    ]  # fmt: skip
    secrets_ = (HF_TOKEN, PASSWORD, IB_TOKEN)
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not all((records / f"rank-{r}.json").exists() for r in (0, 1)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.05)
        # every process of the job is up: salloc, zlaunch in it, srun, the agent, the ranks
        assert _command_lines_holding(secrets_) == []
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err.decode()[-3000:]
    salloc = json.loads((records / "salloc.json").read_text())
    assert salloc[:2] == ["--nodes=1", "--ntasks-per-node=2"]
    assert f"NCCL_IB_TOKEN={REDACTED}" in salloc and f"--hf_token={REDACTED}" in salloc
    assert f"postgres://app:{REDACTED}@db:5432/x" in salloc
    srun = json.loads((records / "srun.json").read_text())
    assert not any(s in " ".join(srun) for s in secrets_)
    for rank in (0, 1):  # ... and every rank got what the user typed, and nothing more
        record = json.loads((records / f"rank-{rank}.json").read_text())
        assert record["argv"][-3:] == script_args
        assert record["env"]["NCCL_IB_TOKEN"] == IB_TOKEN
        assert not any(name.startswith("ZLAUNCH_") and "ARGS" in name for name in record["env"])
    for path in (tmp_path / "runs").rglob("*"):
        if path.is_file():
            assert not any(s.encode() in path.read_bytes() for s in secrets_), path
