"""zlaunch.commands.run_options: command-line values -> LaunchOptions, step by step."""

from __future__ import annotations

import os
import sys

import pytest

from zlaunch.commands.run_options import RunArguments, build_options
from zlaunch.errors import UsageError


def options(tmp_path, **values):
    (tmp_path / "train.py").write_text("print('hi')\n")
    environ = {"PATH": os.environ.get("PATH", "")}
    values = {"script": "train.py", "script_args": (), **values}
    return build_options(chdir=str(tmp_path), environ=environ, home=str(tmp_path), **values)


def test_arguments_default_to_this_process_environment_and_home():
    args = RunArguments(script="train.py", script_args=())
    assert args.environ is os.environ
    assert args.home == os.path.expanduser("~")


def test_a_value_that_is_no_option_is_refused():
    with pytest.raises(TypeError):
        build_options(script="train.py", script_args=(), no_such_option=1)


def test_defaults_make_one_local_worker(tmp_path):
    opts = options(tmp_path)
    assert opts.world_size == 1 and opts.cwd == str(tmp_path)
    assert opts.program == ("train.py",) and opts.python == sys.executable
    assert opts.launcher == "ssh" and opts.launcher_args == ()
    assert opts.config_path is None and opts.hang_timeout == 900.0


def test_module_runs_with_dash_m(tmp_path):
    opts = options(tmp_path, module=True, script_args=("--x",))
    assert opts.program == ("-m", "train.py", "--x")


def test_the_config_in_script_args_is_relative_to_chdir(tmp_path):
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 1}')
    opts = options(tmp_path, script_args=("--deepspeed_config", "ds.json"))
    assert opts.config_path == str(tmp_path / "ds.json")


def test_two_different_configs_are_refused(tmp_path):
    (tmp_path / "ds.json").write_text("{}")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(UsageError, match="differs from the script's config"):
        options(tmp_path, config=str(tmp_path / "other.json"), script_args=("--config", "ds.json"))


def test_program_checks_come_before_the_hosts(tmp_path):
    with pytest.raises(UsageError, match="--module and --no-python"):
        options(tmp_path, module=True, no_python=True, hostfile=str(tmp_path / "missing"))


def test_mfu_and_peak_tflops_ask_the_ranks_for_the_flop_count(tmp_path):
    assert "ZLAUNCH_MFU" not in options(tmp_path).env
    assert options(tmp_path, mfu=True).env["ZLAUNCH_MFU"] == "1"
    given = options(tmp_path, peak_tflops=2.0).env
    assert given["ZLAUNCH_MFU"] == "1" and given["ZLAUNCH_PEAK_TFLOPS"] == "2.0"
