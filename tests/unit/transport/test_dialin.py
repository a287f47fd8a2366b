"""--launcher dialin's pieces that need no process: the token file both sides read (written
private, refused when others may read it), the agent's arguments, the roster any agent fills,
and the options (nodes named in the order they join; what does not apply is refused)."""

from __future__ import annotations

import os
import re
import stat

import pytest

from zlaunch.agent.connect import ConnectFailed, parse_argv, read_token_file
from zlaunch.commands.run_options import build_options
from zlaunch.errors import UsageError
from zlaunch.transport.dialin import AnyRoster, Rendezvous, token_from_file
from zlaunch.transport.preauth import Refusal
from zlaunch.wire import Answer


def _options(tmp_path, **values):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return build_options(
        script=str(script), script_args=(), environ={"PATH": os.environ.get("PATH", "")},
        home=str(tmp_path), launcher="dialin", **values,
    )  # fmt: skip


def test_the_controller_writes_a_new_private_token_once_and_reads_it_back(tmp_path):
    path = tmp_path / "job.token"
    token = token_from_file(str(path))
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token_from_file(str(path)) == token  # the next attempt, or another controller
    assert read_token_file(str(path)) == token  # what an agent reads from its copy
    assert token_from_file(str(tmp_path / "other.token")) != token


def test_a_token_file_others_may_read_is_refused_on_both_sides(tmp_path):
    path = tmp_path / "job.token"
    path.write_text("a" * 64 + "\n")
    path.chmod(0o644)
    with pytest.raises(UsageError, match=r"job.token: its mode 0644 lets others read it") as err:
        token_from_file(str(path))
    assert "chmod 600" in err.value.hint
    with pytest.raises(ConnectFailed, match=r"other users may read or write it \(mode 0644\)"):
        read_token_file(str(path))
    path.chmod(0o440)  # a Secret mounted for the pod's group: the agent may read it
    assert read_token_file(str(path)) == "a" * 64


@pytest.mark.parametrize("text", ["", "short\n", "two words " * 8, "x" * 2000])
def test_a_token_file_that_holds_no_token_is_refused(tmp_path, text):
    path = tmp_path / "job.token"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConnectFailed, match="expected one line of 32-1024 printable"):
        read_token_file(str(path))
    with pytest.raises(UsageError, match="expected one line"):
        token_from_file(str(path))


def test_a_missing_token_file_names_the_path(tmp_path):
    with pytest.raises(ConnectFailed, match=r"--token-file .*nope: cannot open: No such file"):
        read_token_file(str(tmp_path / "nope"))


def test_the_agent_takes_connect_and_token_file_and_nothing_else():
    assert parse_argv([]) == (None, None)
    assert parse_argv(["--connect", "h:1"]) == ("h:1", None)
    assert parse_argv(["--connect=h:1", "--token-file", "/t"]) == ("h:1", "/t")
    for bad in (["--token", "x"], ["--connect", "h:1", "--connect", "h:2"], ["--connect"]):
        with pytest.raises(ConnectFailed):
            parse_argv(bad)
    with pytest.raises(ConnectFailed, match="--token-file goes with --connect"):
        parse_argv(["--token-file", "/t"])


def test_any_agent_fills_the_next_free_node_until_all_are_taken():
    roster = AnyRoster(2)
    answer = Answer(node="vm", task=None, nonce="0" * 64)
    assert roster.place(answer) == 0
    roster.joined(0)
    assert roster.place(answer) == 1  # the same host name again: another node of the job
    roster.joined(1)
    assert roster.place(answer) is Refusal.TWICE and roster.missing() == []


def test_a_scheduler_gets_the_whole_agent_command_with_its_own_token_path():
    meeting = Rendezvous("10.0.0.1:29400", "t" * 64, "/c/tok", ("py", "-m", "zlaunch.agent"), 3)
    command = meeting.command("/var/run/secrets/zlaunch/token")
    assert command == ["py", "-m", "zlaunch.agent", "--connect", "10.0.0.1:29400",
                       "--token-file", "/var/run/secrets/zlaunch/token"]  # fmt: skip
    assert meeting.token not in " ".join(command)


def test_dialin_options_name_the_nodes_in_joining_order(tmp_path):
    options = _options(tmp_path, num_nodes=3, num_gpus=2, token_file="tok", controller_port=29400)
    assert [h.name for h in options.hosts] == ["agent-0", "agent-1", "agent-2"]
    assert {h.slots for h in options.hosts} == {(0, 1)}
    assert options.token_file == os.path.abspath("tok") and options.controller_port == 29400


def test_with_min_nodes_a_restart_waits_for_fewer_agents(tmp_path):
    options = _options(tmp_path, num_nodes=3, token_file="t", min_nodes=2, max_restarts=1)
    assert (len(options.hosts), options.min_nodes, options.spare_hosts) == (3, 2, ())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"token_file": "tok"}, "--launcher dialin needs --nodes N"),
        ({"num_nodes": 2}, "--launcher dialin needs --token-file FILE"),
        ({"num_nodes": 2, "token_file": "t", "hostfile": "h"}, "--hostfile has no effect"),
        ({"num_nodes": 2, "token_file": "t", "include": "n1"}, "--include has no effect"),
    ],
)
def test_dialin_refuses_what_does_not_apply(tmp_path, values, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        _options(tmp_path, **values)


def test_token_file_and_port_belong_to_dialin(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    for values, flag in (
        ({"token_file": "t"}, "--token-file"),
        ({"controller_port": 5}, "--controller-port"),
    ):
        with pytest.raises(UsageError, match=f"{flag} has no effect with --launcher ssh"):
            build_options(
                script=str(tmp_path / "train.py"), script_args=(), home=str(tmp_path),
                environ={"PATH": os.environ.get("PATH", "")}, launcher="ssh", **values,
            )  # fmt: skip
