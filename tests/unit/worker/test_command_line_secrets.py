"""No secret on a command line zlaunch builds: salloc's (``--nodes`` from a login node), the
srun/mpirun extras, and a Python worker's. Values that look secret are shown redacted there and
travel whole in an environment only the user can read (zlaunch/commands/allocation_args.py,
zlaunch/worker/argv.py); the end-to-end check is in tests/integration/text/test_secrets.py.
"""

from __future__ import annotations

import json
import sys

import pytest

from zlaunch.commands import allocation_args
from zlaunch.commands.run import _allocation_request
from zlaunch.commands.run_options import _launcher
from zlaunch.errors import UsageError
from zlaunch.text.redact import REDACTED, redact_argv
from zlaunch.wire import protocol
from zlaunch.worker.argv import ArgsMismatch, hide, restore

HF = "hf_" + "Ab3" * 12
ARGS = [
    "--nodes", "2", "--env", "NCCL_IB_TOKEN=ibsecret", "--env=PLAIN=notsecretbutanenvvalue",
    "--env", "FROM_ENV", "train.py", f"--hf_token={HF}", "--db", "postgres://u:pw99@h/x",
]  # fmt: skip


def test_every_env_value_is_hidden_on_a_command_line_whatever_its_name():
    assert allocation_args.shown(ARGS) == [
        "--nodes", "2", "--env", f"NCCL_IB_TOKEN={REDACTED}", f"--env=PLAIN={REDACTED}",
        "--env", "FROM_ENV", "train.py", f"--hf_token={REDACTED}", "--db",
        f"postgres://u:{REDACTED}@h/x",
    ]  # fmt: skip
    assert redact_argv(["--env", "A=b"]) == ["--env", "A=b"]  # only where asked


def test_the_salloc_line_shows_the_arguments_redacted(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["zlaunch", *ARGS])
    values = {"nodes": 2, "partition": None, "time_limit": None, "account": None}
    salloc = _allocation_request(values, {})
    line = " ".join(salloc)
    assert salloc[0] == "salloc" and "train.py" in line
    for secret in ("ibsecret", "notsecretbutanenvvalue", HF, "pw99"):
        assert secret not in line


def test_the_whole_arguments_reach_the_zlaunch_in_the_allocation_and_nothing_after_it():
    environ = {"PATH": "/bin"}
    shown = allocation_args.hand_over(ARGS, environ)
    inside = {**environ, protocol.SALLOC_ENV: "1"}
    assert allocation_args.take_back(shown, inside) == ARGS
    assert protocol.SALLOC_ARGS_ENV not in inside  # srun would pass it on to every node


def test_arguments_of_another_command_line_are_refused():
    environ = {}
    allocation_args.hand_over(ARGS, environ)
    with pytest.raises(UsageError, match="arguments of another command line"):
        allocation_args.take_back(["train.py"], environ)
    with pytest.raises(UsageError, match="not a JSON list"):
        allocation_args.take_back(["x"], {protocol.SALLOC_ARGS_ENV: '{"a": 1}'})


def test_redacted_arguments_without_the_whole_ones_never_run():
    shown = allocation_args.shown(ARGS)
    with pytest.raises(UsageError, match="did not reach the allocation"):
        allocation_args.take_back(shown, {protocol.SALLOC_ENV: "1"})
    # outside zlaunch's allocation a literal "<redacted>" is the user's own argument
    assert allocation_args.take_back(shown, {}) == shown


@pytest.mark.parametrize(
    ("launcher", "text", "program"),
    [
        ("mpi", f"-x HF_TOKEN={HF} --bind-to none", "mpirun"),
        ("slurm", "--export=ALL,WANDB_API_KEY=abc123", "srun"),
    ],
)
def test_srun_and_mpirun_extras_that_look_secret_are_refused(launcher, text, program):
    slurm, mpi = (text, None) if launcher == "slurm" else (None, text)
    with pytest.raises(UsageError) as err:
        _launcher(launcher, None, slurm, mpi, {"SLURM_JOB_ID": "5"})
    assert f"on {program}'s command line, which every user of this machine can read" in str(
        err.value
    )
    assert HF not in str(err.value) and "abc123" not in str(err.value)
    assert "--env NAME=VALUE" in err.value.hint


def test_srun_extras_that_look_like_nothing_pass():
    assert _launcher("slurm", None, "--gres=gpu:8 --exclusive", None, {"SLURM_JOB_ID": "5"}) == (
        "slurm",
        ("--gres=gpu:8", "--exclusive"),
    )


BOOTED = ["python3", "-u", "-m", "zlaunch.worker.boot", "train.py"]


def test_a_workers_secret_looking_arguments_wait_in_its_environment():
    args = ["--lr", "3", f"--hf_token={HF}", "--password", "hunter2"]
    env: dict[str, str] = {}
    argv = hide([*BOOTED, *args], len(args), env)
    assert argv == [*BOOTED, "--lr", "3", f"--hf_token={REDACTED}", "--password", REDACTED]
    assert json.loads(env[protocol.WORKER_ARGS_ENV]) == args
    # the boot's view: SCRIPT ARGS...
    assert restore(argv[4:], env) == ["train.py", *args]
    assert protocol.WORKER_ARGS_ENV not in env  # nothing the script starts inherits them


def test_arguments_that_look_like_nothing_stay_where_they_are():
    env: dict[str, str] = {}
    assert hide([*BOOTED, "--lr", "3"], 2, env) == [*BOOTED, "--lr", "3"]
    assert env == {}
    assert restore(["train.py", "--lr", "3"], env) == ["train.py", "--lr", "3"]
    huge = ["--token", "x" * 200_000]  # beyond what one environment string may hold
    assert hide([*BOOTED, *huge], 2, env) == [*BOOTED, *huge] and env == {}


def test_arguments_that_do_not_fit_the_command_line_are_refused():
    env = {protocol.WORKER_ARGS_ENV: json.dumps(["--password", "hunter2"])}
    with pytest.raises(ArgsMismatch, match="another command line"):
        restore(["train.py", "--password", "other"], dict(env))
    with pytest.raises(ArgsMismatch, match="more arguments"):
        restore(["train.py"], dict(env))
    with pytest.raises(ArgsMismatch, match="not a JSON list"):
        restore(["train.py"], {protocol.WORKER_ARGS_ENV: "[1]"})


def test_a_program_started_as_is_with_secret_looking_arguments_is_warned_of(capsys):
    from types import SimpleNamespace

    from zlaunch.commands.run import _warn_of_visible_secrets

    _warn_of_visible_secrets(SimpleNamespace(no_python=True, program=("./run.sh", "--lr", "3")))
    assert capsys.readouterr().err == ""
    _warn_of_visible_secrets(
        SimpleNamespace(no_python=True, program=("./run.sh", "--password", "hunter2"))
    )
    err = capsys.readouterr().err
    assert "--no-python starts the program as is" in err and "hunter2" not in err
    assert REDACTED in err
