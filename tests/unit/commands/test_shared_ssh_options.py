"""`run` and `check` take the same SSH options (one decorator): the same spellings, types and
defaults, DeepSpeed's --ssh_port included; a missing key or config file is a usage error."""

from __future__ import annotations

import pytest

from zlaunch.commands.check import command as check_command
from zlaunch.commands.familiar import ssh_of
from zlaunch.commands.run import command as run_command
from zlaunch.errors import UsageError

SSH_PARAMS = ("ssh_config", "ssh_port", "identity", "ssh_timeout", "accept_new_hosts")


def _ssh_params(command):
    return {
        p.name: (tuple(p.opts), tuple(p.secondary_opts), p.type.name, p.default)
        for p in command.params
        if p.name in SSH_PARAMS
    }


def test_run_and_check_take_the_same_ssh_options():
    run, check = _ssh_params(run_command), _ssh_params(check_command)
    assert set(run) == set(SSH_PARAMS) and run == check
    assert run["ssh_port"][0] == ("--ssh-port", "--ssh_port")


def test_check_parses_deepspeed_s_ssh_port_spelling():
    ctx = check_command.make_context("check", ["--ssh_port", "2222"])
    assert ctx.params["ssh_port"] == 2222


def test_the_options_become_ssh_options_with_absolute_files(tmp_path):
    key = tmp_path / "id"
    key.write_text("k")
    ssh = ssh_of(None, 2222, str(key), 3.0, True)
    assert (ssh.config_file, ssh.port, ssh.identity) == (None, 2222, str(key))
    assert (ssh.timeout, ssh.accept_new_hosts) == (3.0, True)
    with pytest.raises(UsageError, match=r"--ssh-config .*/nope: no such file"):
        ssh_of(str(tmp_path / "nope"), None, None, 10.0, False)
