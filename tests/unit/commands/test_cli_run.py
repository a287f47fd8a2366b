"""`zlaunch [OPTIONS] SCRIPT [ARGS]`: option parsing, checks before launch, --dry-run.

Everything here stops before any host is contacted: either at a usage/config error (exit 2)
or at the plan (--dry-run). The hand-off to the launcher is checked with a stand-in module
that records the options it receives.
"""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from zlaunch.cli import main
from zlaunch.commands.run import build_options, find_config_in_args, parse_ranks
from zlaunch.errors import UsageError

GOOD_CONFIG = {
    "train_batch_size": 4,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 1},
}


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A project directory with a script that would leave a marker if it ever ran."""
    project = tmp_path / "project"
    project.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "ran"
    (project / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (project / "ds.json").write_text(json.dumps(GOOD_CONFIG))
    (project / "hosts").write_text("node1 slots=2\nnode2 slots=2\nnode3 slots=2\n")
    monkeypatch.chdir(project)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU machine, whatever runs the tests
    monkeypatch.delitem(sys.modules, "zlaunch.launcher", raising=False)
    job = types.SimpleNamespace(dir=project, home=home, marker=marker)
    yield job
    assert not marker.exists(), "the script ran"


@pytest.fixture
def launcher(monkeypatch):
    """A stand-in zlaunch.launcher that records the options and returns a chosen code."""
    module = types.ModuleType("zlaunch.launcher")
    module.calls = []
    module.code = 0

    def launch(options):
        module.calls.append(options)
        return module.code

    module.launch = launch
    monkeypatch.setitem(sys.modules, "zlaunch.launcher", module)
    return module


def zlaunch(capsys, *args):
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return info.value.code, out, err


def env_line(out: str, name: str) -> str:
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith(f"{name}=")]
    assert lines, f"{name} not in plan"
    return lines[0].split("=", 1)[1]


# ---- --dry-run --------------------------------------------------------------------------------


def test_dry_run_local_default(job, capsys):
    code, out, err = zlaunch(capsys, "--dry-run", "train.py", "--steps", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].endswith("world size 1  nodes 1  master localhost:auto")
    assert f"node 0: localhost  ranks 0  slots 0  cwd {job.dir}" in lines
    assert f"  rank 0 (local 0, slot 0): {sys.executable} -u train.py --steps 3" in lines
    assert "zlaunch.launcher" not in sys.modules


def test_dry_run_hostfile_with_exclude(job, capsys):
    code, out, err = zlaunch(capsys, "--dry-run", "-H", "hosts", "-e", "node2:1", "train.py")
    assert code == 0, err
    assert "world size 5  nodes 3  master node1:auto" in out
    assert "node 0: node1  ranks 0-1  slots 0,1" in out
    assert "node 1: node2  ranks 2  slots 0" in out
    assert "node 2: node3  ranks 3-4  slots 0,1" in out
    assert env_line(out, "MASTER_ADDR") == "node1"
    assert "zlaunch.launcher" not in sys.modules


def test_dry_run_with_given_master(job, capsys):
    code, out, _ = zlaunch(
        capsys,
        "--dry-run",
        "-H",
        "hosts",
        "--master-addr",
        "10.1.1.1",
        "--master-port",
        "1234",
        "train.py",
    )
    assert code == 0
    assert "master 10.1.1.1:1234" in out
    assert env_line(out, "MASTER_PORT") == "1234"


@pytest.mark.parametrize(
    "flag", ["--num-gpus", "--num_gpus", "--nproc-per-node", "--nproc_per_node"]
)
def test_num_gpus_spellings(job, capsys, flag):
    code, out, _ = zlaunch(capsys, "--dry-run", flag, "3", "train.py")
    assert code == 0
    assert "world size 3  nodes 1" in out
    assert "slots 0,1,2" in out


@pytest.mark.parametrize("flag", ["--num-nodes", "--num_nodes"])
def test_num_nodes_spellings(job, capsys, flag):
    code, out, _ = zlaunch(
        capsys, "--dry-run", "-H", "hosts", flag, "2", "--num-gpus", "1", "train.py"
    )
    assert code == 0
    assert "world size 2  nodes 2" in out


def test_script_args_pass_through_untouched(job):
    args = ["--hostfile", "x", "-H", "y", "--dry-run", "-e", "a b", "--", "--config", "$(id)"]
    opts = build_options(script="train.py", script_args=args)
    assert opts.program == ("train.py", *args)
    assert opts.config_path is None  # '--' ends the script's options


def test_pass_local_rank_and_secrets_redacted(job, capsys):
    code, out, _ = zlaunch(
        capsys,
        "--dry-run",
        "--num-gpus",
        "2",
        "--pass-local-rank",
        "--env",
        "HF_TOKEN=hf_s3cret",
        "--env",
        "VISIBLE=yes",
        "train.py",
    )
    assert code == 0
    assert f"{sys.executable} -u train.py --local_rank=1" in out
    assert "hf_s3cret" not in out
    assert env_line(out, "HF_TOKEN") == "<redacted>"
    assert env_line(out, "VISIBLE") == "yes"


def test_env_file_in_cwd_reaches_workers(job, capsys):
    (job.dir / ".zlaunch_env").write_text("export FROM_FILE='$(touch /tmp/x); y'\n")
    (job.home / ".deepspeed_env").write_text("FROM_HOME=1\nFROM_FILE=home\n")
    opts = build_options(script="train.py", script_args=[])
    assert opts.env["FROM_FILE"] == "$(touch /tmp/x); y"
    assert opts.env["FROM_HOME"] == "1"


def test_module_and_no_python_skip_the_script_check(job, capsys):
    code, out, _ = zlaunch(capsys, "--dry-run", "-m", "pkg.train", "--x")
    assert code == 0
    assert f"{sys.executable} -u -m pkg.train --x" in out
    code, out, _ = zlaunch(capsys, "--dry-run", "--no-python", "/bin/echo", "hi there")
    assert code == 0
    assert "(local 0, slot 0): /bin/echo 'hi there'" in out


def test_chdir_resolves_script_and_config(job, tmp_path, capsys):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "run.py").write_text("")
    (other / "cfg.json").write_text(json.dumps(GOOD_CONFIG))
    code, out, err = zlaunch(
        capsys, "--dry-run", "--num-gpus", "2", "--chdir", other, "run.py", "--config", "cfg.json"
    )
    assert code == 0, err
    assert f"cwd {other}" in out
    assert env_line(out, "ZLAUNCH_CONFIG") == str(other / "cfg.json")


# ---- --config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--config", "ds.json"],
        ["--config=ds.json"],
        ["--deepspeed_config", "ds.json"],
        ["--deepspeed_config=ds.json"],
        ["--steps", "3", "--deepspeed", "--deepspeed_config", "ds.json", "--lr", "1"],
    ],
)
def test_config_found_in_script_args(job, capsys, args):
    code, out, err = zlaunch(capsys, "--dry-run", "--num-gpus", "2", "train.py", *args)
    assert code == 0, err
    assert env_line(out, "ZLAUNCH_CONFIG") == str(job.dir / "ds.json")
    assert f"-u train.py {' '.join(args)}" in out  # the script still gets its own args


def test_config_before_script(job, capsys):
    code, out, _ = zlaunch(
        capsys, "--dry-run", "--num-gpus", "2", "--config", "ds.json", "train.py"
    )
    assert code == 0
    assert env_line(out, "ZLAUNCH_CONFIG") == str(job.dir / "ds.json")
    assert "-u train.py\n" in out
    # Both given and the same file: fine. Different files: an error.
    code, _, _ = zlaunch(
        capsys,
        "--dry-run",
        "--num-gpus",
        "2",
        "--config",
        "ds.json",
        "train.py",
        "--config",
        str(job.dir / "ds.json"),
    )
    assert code == 0
    (job.dir / "other.json").write_text(json.dumps(GOOD_CONFIG))
    code, _, err = zlaunch(
        capsys, "--dry-run", "--config", "ds.json", "train.py", "--config", "other.json"
    )
    assert code == 2
    assert "differs from the script's config" in err


def test_find_config_in_args():
    assert find_config_in_args(["--a", "--config", "x", "--config=y"]) == "y"
    assert find_config_in_args(["--configs", "x", "--config_file", "y"]) is None
    assert find_config_in_args(["--", "--config", "x"]) is None
    with pytest.raises(UsageError, match="has no value"):
        find_config_in_args(["--deepspeed_config"])
    with pytest.raises(UsageError, match="is empty"):
        find_config_in_args(["--config="])


def write_config(job, data, name="bad.json"):
    path = job.dir / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_bad_config_names_file_and_key(job, capsys, launcher):
    path = write_config(job, {**GOOD_CONFIG, "zero_optimization": {"stage": 4}})
    code, out, err = zlaunch(capsys, "--num-gpus", "2", "train.py", "--config", "bad.json")
    assert code == 2
    assert err.startswith(f"error: {path}: zero_optimization.stage must be 0, 1, 2 or 3, got 4")
    assert launcher.calls == []
    path = write_config(job, {**GOOD_CONFIG, "zero_optimization": {"stag": 1}})
    code, _, err = zlaunch(capsys, "--num-gpus", "2", "train.py", "--deepspeed_config=bad.json")
    assert code == 2
    assert f"{path}: zero_optimization.stag" in err and "'stage'" in err


def test_batch_mismatch_fails_before_launch(job, capsys, launcher):
    code, _, err = zlaunch(capsys, "--num-gpus", "3", "train.py", "--config", "ds.json")
    assert code == 2
    assert str(job.dir / "ds.json") in err
    assert "train_batch_size 4" in err and "world size 3" in err
    assert launcher.calls == []


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda job: job.dir / "missing.json", "not found"),
        (lambda job: job.dir, "is not a file"),
        (lambda job: write_config(job, "{not json"), "invalid JSON"),
    ],
)
def test_unusable_config_files(job, capsys, launcher, make, words):
    path = make(job)
    code, _, err = zlaunch(capsys, "--config", path, "train.py")
    assert code == 2
    assert str(path) in err and words in err
    assert launcher.calls == []


def test_unknown_top_level_key_fails_before_launch(job, capsys, launcher):
    write_config(job, {**GOOD_CONFIG, "gradient_clipings": 1}, name="extra.json")
    code, _, err = zlaunch(capsys, "--num-gpus", "2", "train.py", "--config", "extra.json")
    assert code == 2 and launcher.calls == []
    assert "gradient_clipings is not a DeepSpeed config key" in err
    assert "did you mean 'gradient_clipping'?" in err and "Traceback" not in err


# ---- usage errors: exit 2, clear message, nothing started ------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["-H", "nope", "train.py"], "hostfile nope not found"),
        (["-i", "node1", "-e", "node2", "-H", "hosts", "train.py"], "--include and --exclude"),
        (["-H", "hosts", "-i", "node1", "--num-gpus", "1", "train.py"], "--num-gpus cannot be"),
        (["-H", "hosts", "-i", "node9", "train.py"], "host 'node9' is not in the hostfile"),
        (["-H", "hosts", "-i", "node1:2", "train.py"], "node1 has no slot 2"),
        (["-H", "hosts", "-e", "node3:5", "train.py"], "node3 has no slot 5"),
        (["-H", "hosts", "--num-nodes", "4", "train.py"], "--num-nodes 4 asks for more hosts"),
        (["missing.py"], "script missing.py not found"),
        (["--env", "RANK=3", "train.py"], "zlaunch sets RANK for every worker"),
        (["--env", "ZLAUNCH_SURELY_UNSET", "train.py"], "ZLAUNCH_SURELY_UNSET is not set"),
        (["--env", "BAD-NAME=1", "train.py"], "bad variable name 'BAD-NAME'"),
        (["--num-gpus", "2", "--ranks", "0,2", "train.py"], "--ranks: rank 2 does not exist"),
        (["--ranks", "x", "train.py"], "--ranks: bad rank 'x'"),
        (["-m", "--no-python", "pkg"], "--module and --no-python cannot be used together"),
        (["--python", "/usr/bin/python3", "--no-python", "/bin/true"], "--python has no effect"),
        (
            ["--chdir", "/nonexistent-dir", "train.py"],
            "--chdir /nonexistent-dir: no such directory",
        ),
        (["--ssh-config", "nope.cfg", "train.py"], "--ssh-config"),
        (["-I", "nope.key", "train.py"], "--identity"),
        (["--hostfle", "hosts", "train.py"], "no such option: --hostfle"),
        (["--num-gpus", "0", "train.py"], "--num-gpus must be 1 or more"),
        (["--grace-period", "-1", "train.py"], "--grace-period must be 0 or more"),
        (["--ssh-timeout", "0", "train.py"], "--ssh-timeout must be more than 0"),
    ],
)
def test_usage_errors(job, capsys, launcher, args, words):
    code, out, err = zlaunch(capsys, *args)
    assert code == 2, (out, err)
    assert words in err
    assert err.startswith("error: ")
    assert launcher.calls == []


def test_misspelled_option_suggests_the_right_one(job, capsys):
    code, _, err = zlaunch(capsys, "--hostfle", "hosts", "train.py")
    assert "hint: did you mean --hostfile?" in err


def test_bad_hostfile_line_named(job, capsys, launcher):
    (job.dir / "hosts").write_text("node1 slots=2\nnode2 slot=2\n")
    code, _, err = zlaunch(capsys, "-H", "hosts", "train.py")
    assert code == 2
    assert "error: hosts:2: unknown key 'slot'" in err
    assert "did you mean 'slots'?" in err


def test_click_level_errors_are_exit_2(job, capsys):
    assert zlaunch(capsys, "--master-port", "70000", "train.py")[0] == 2
    assert zlaunch(capsys, "--num-gpus", "two", "train.py")[0] == 2
    code, _, err = zlaunch(capsys, "--dry-run")
    assert code == 2 and "SCRIPT" in err


def test_parse_ranks():
    assert parse_ranks("0,3-5", 6) == frozenset({0, 3, 4, 5})
    assert parse_ranks(" 2 ", 3) == frozenset({2})
    with pytest.raises(UsageError, match="empty range"):
        parse_ranks("3-1", 6)


# ---- hand-off to the launcher -----------------------------------------------------------------


def test_launch_gets_typed_options_and_its_exit_code(job, capsys, launcher, monkeypatch):
    launcher.code = 3
    code, _, _ = zlaunch(
        capsys,
        "-H",
        "hosts",
        "-i",
        "node1:0@node3:1",
        "--master-port",
        "29501",
        "--ranks",
        "1",
        "--no-color",
        "--grace-period",
        "2.5",
        "--log-dir",
        "runs",
        "--ssh-timeout",
        "4",
        "--env",
        "A=1",
        "train.py",
        "--config",
        "ds.json",
        "x y",
    )
    assert code == 3
    [opts] = launcher.calls
    assert [(h.name, h.slots) for h in opts.hosts] == [("node1", (0,)), ("node3", (1,))]
    assert opts.program == ("train.py", "--config", "ds.json", "x y")
    assert opts.python == sys.executable
    assert (opts.module, opts.no_python, opts.dry_run) == (False, False, False)
    assert opts.config_path == str(job.dir / "ds.json")
    assert opts.cwd == str(job.dir)
    assert opts.env["A"] == "1"
    assert (opts.master_addr, opts.master_port) == (None, 29501)
    assert opts.ranks_filter == frozenset({1})
    assert opts.color is False
    assert opts.grace_period == 2.5
    assert opts.log_dir == str(job.dir / "runs")
    assert opts.ssh.timeout == 4.0
    launcher.code = 0
    monkeypatch.delenv("ZLAUNCH_LOG_DIR", raising=False)
    assert zlaunch(capsys, "train.py")[0] == 0
    assert launcher.calls[-1].color is None
    assert launcher.calls[-1].log_dir == os.path.join(str(job.dir), "zlaunch_runs")
    monkeypatch.setenv("ZLAUNCH_LOG_DIR", "~/elsewhere")
    assert zlaunch(capsys, "train.py")[0] == 0
    assert launcher.calls[-1].log_dir == str(job.home / "elsewhere")


def test_launcher_errors_keep_their_exit_code(job, capsys, launcher):
    from zlaunch.errors import WorkerFailed

    def failing(options):
        raise WorkerFailed("node2 rank 3 died (SIGKILL)", exit_code=137)

    launcher.launch = failing
    code, _, err = zlaunch(capsys, "train.py")
    assert code == 137
    assert "node2 rank 3 died" in err


def test_hostile_env_file_values_reach_every_worker_byte_for_byte(job):
    from zlaunch.job.plan import build_plan

    values = {
        "CMD": "$(touch /tmp/zlaunch-pwned)",
        "SEMI": "a; b && c",
        "QUOTES": 'it\'s "x" `y`',
        "NEWLINE": "one\ntwo",
        "UNICODE": "日本語 ✓ \u2028",
    }
    (job.dir / ".zlaunch_env").write_text(
        "CMD=$(touch /tmp/zlaunch-pwned)\n"
        "SEMI='a; b && c'\n"
        'export QUOTES="it\'s \\"x\\" \\`y\\`"\n'
        'NEWLINE="one\\ntwo"\n'
        "UNICODE='日本語 ✓ \u2028'\n"
    )
    opts = build_options(script="train.py", script_args=["$(id)", "a b"], hostfile="hosts")
    plan = build_plan(opts, opts.hosts, master_addr="node1", master_port=1, run_id="r", attempt=0)
    assert plan.world_size == 6
    for worker in plan.workers:
        assert {k: worker.env[k] for k in values} == values
        assert worker.argv == (sys.executable, "-u", "train.py", "$(id)", "a b")


@pytest.mark.parametrize(
    "flags, collapse", [((), None), (("--no-collapse",), False), (("--collapse",), True)]
)
def test_collapse_flags_reach_the_launch_options(job, capsys, launcher, flags, collapse):
    code, _, err = zlaunch(capsys, *flags, "--num-gpus", "2", "train.py")
    assert code == 0, err
    (options,) = launcher.calls
    assert options.collapse is collapse
