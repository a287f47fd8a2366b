"""What a working directory other users can write to may put into a job: nothing it runs.

The interpreters zlaunch starts never have the working directory on sys.path before their
own imports, the workers' PYTHONPATH has no empty entry (the working directory, to Python,
while it starts), a script's folder is the one ``python SCRIPT`` would put there (its links
resolved), and an env file is read only when it is the user's own.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest

from zlaunch.agent.workers import _safe_pythonpath
from zlaunch.errors import UsageError
from zlaunch.job.envfile import check_env_file_owner, load_env_file
from zlaunch.job.hostfile import Host
from zlaunch.job.options import LaunchOptions
from zlaunch.job.plan import build_plan, dropped_pythonpath_entries
from zlaunch.transport import agent_argv
from zlaunch.worker.boot import script_path_entry
from zlaunch.worker.python_start import SAFE_PATH, module_argv, module_code, without_empty_entries


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (["", "/site"], ["/site"]),  # what -c puts first
        (["/site", ""], ["/site", ""]),  # an entry of the user's own PYTHONPATH: not ours
        (["/site"], ["/site"]),  # PYTHONSAFEPATH kept it off already
        ([], []),
    ],
)
def test_safe_path_drops_only_the_entry_that_dash_c_puts_first(before, after):
    saved = sys.path[:]
    try:
        sys.path[:] = before
        exec(SAFE_PATH, {})
        assert sys.path == after
    finally:
        sys.path[:] = saved


def test_every_interpreter_zlaunch_starts_runs_its_module_without_dash_m():
    agent = agent_argv("/opt/py/bin/python3")
    assert agent[:3] == ["/opt/py/bin/python3", "-u", "-c"] and "-m" not in agent
    assert agent[3].startswith(SAFE_PATH + ";") and agent[3].endswith(
        'runpy._run_module_as_main("zlaunch.agent")'
    )
    assert module_argv("py", "zlaunch", "run", "x.py", flags=()) == [
        "py", "-c", module_code("zlaunch"), "run", "x.py",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        module_code("zlaunch.agent'); import os; os.system('x")


@pytest.mark.parametrize(
    ("given", "kept", "dropped"),
    [
        ("/a:/b", "/a:/b", False),
        ("/a:", "/a", True),
        (":/a", "/a", True),
        ("/a::/b", "/a:/b", True),
        (".:/a", ".:/a", False),  # written: the user means the working directory
        ("", "", False),  # set but empty: Python reads no entry from it
    ],
)
def test_empty_pythonpath_entries_are_dropped_and_said(given, kept, dropped):
    assert without_empty_entries(given) == (kept, dropped)


def _options(env):
    return LaunchOptions(
        hosts=(Host("localhost", (0, 1)),), program=("t.py",), python="py", env=env
    )


def test_the_ranks_pythonpath_has_no_empty_entry_whatever_the_controller_had():
    options = _options({"PYTHONPATH": "/proj/src:"})
    assert dropped_pythonpath_entries(options)
    plan = build_plan(options, options.hosts, master_addr="h", master_port=1, run_id="r", attempt=0)
    assert {w.env["PYTHONPATH"] for w in plan.workers} == {"/proj/src"}
    assert not dropped_pythonpath_entries(_options({"PYTHONPATH": "/proj/src"}))
    assert not dropped_pythonpath_entries(_options({}))


def test_the_agent_drops_empty_entries_its_node_adds():
    env = {"PYTHONPATH": ":/node/lib"}
    _safe_pythonpath(env)
    assert env == {"PYTHONPATH": "/node/lib"}
    env = {"PATH": "/bin"}
    _safe_pythonpath(env)
    assert env == {"PATH": "/bin"}


def test_the_script_folder_is_where_the_script_really_lives(tmp_path):
    real = tmp_path / "home" / "proj"
    real.mkdir(parents=True)
    (real / "train.py").write_text("print(1)\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "train.py").symlink_to(real / "train.py")
    # python resolves the link: the shared folder (where the link is) is not on sys.path
    assert script_path_entry(["train.py"], str(shared)) == str(real)
    assert script_path_entry([str(real / "train.py")], "/") == str(real)
    assert script_path_entry(["-m", "pkg.main"], str(shared)) == str(shared)  # as python -m
    assert script_path_entry(["train.py"], str(shared), safe_path=True) is None  # as -P
    (real / "app").mkdir()
    (real / "app" / "__main__.py").write_text("print(1)\n")
    assert script_path_entry([str(real / "app")], "/") is None  # runpy adds the folder itself


def _stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, 0, 10, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "uid", "refused"),
    [
        (stat.S_IFREG | 0o644, 1000, None),
        (stat.S_IFREG | 0o600, 0, None),  # root's, as /etc files are
        (stat.S_IFREG | 0o644, 4242, "belongs to"),
        (stat.S_IFREG | 0o664, 1000, "can be changed by other users (mode 0664)"),
        (stat.S_IFREG | 0o646, 1000, "can be changed by other users"),
        (stat.S_IFIFO | 0o600, 1000, "is not a regular file"),
    ],
)
def test_an_env_file_is_read_only_when_it_is_the_users_own(mode, uid, refused):
    if refused is None:
        check_env_file_owner("/w/.zlaunch_env", _stat(mode, uid), 1000)
        return
    with pytest.raises(UsageError, match="/w/.zlaunch_env") as caught:
        check_env_file_owner("/w/.zlaunch_env", _stat(mode, uid), 1000)
    assert refused in str(caught.value) and caught.value.hint


def test_a_fifo_in_an_env_files_place_is_refused_without_waiting(tmp_path):
    path = tmp_path / ".zlaunch_env"
    os.mkfifo(path)
    with pytest.raises(UsageError, match="not a regular file"):
        load_env_file(path)  # nobody writes the FIFO: a blocking open would wait for ever


def test_an_own_env_file_still_loads(tmp_path):
    path = tmp_path / ".zlaunch_env"
    path.write_text("A=1\nexport B='two'\n")
    path.chmod(0o644)
    assert load_env_file(path) == {"A": "1", "B": "two"}
