"""What a failed SSH start says: every paramiko failure becomes one HostUnreachable naming the
host, the cause and what to check (the cluster tests reach these through real sshd hosts)."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import paramiko
import pytest

from zlaunch.errors import HostUnreachable
from zlaunch.job.hostfile import Host
from zlaunch.job.options import SshOptions
from zlaunch.transport.ssh import _UnknownHostKey, _unreachable

HOST = Host("node7", (0,), port=2222)
SSH = SshOptions(timeout=4.0)
CONNECTION = SimpleNamespace(port=22, ssh_config={})


class FakeKey:
    def get_name(self):
        return "ssh-ed25519"

    def get_fingerprint(self):
        return b"\xab\xcd"

    def asbytes(self):
        return b"key"


def _refused():
    return paramiko.ssh_exception.NoValidConnectionsError(
        {("10.0.0.7", 2222): OSError(errno.ECONNREFUSED, "Connection refused")}
    )


@pytest.mark.parametrize(
    ("err", "message", "hint"),
    [
        (paramiko.BadHostKeyException("node7", FakeKey(), FakeKey()), "host key changed", "ssh-keygen -R node7"),
        (_UnknownHostKey("node7", FakeKey()), "is not in known_hosts", "--accept-new-hosts"),
        (paramiko.AuthenticationException("no keys"), "authentication refused (no keys)", "--identity"),
        (TimeoutError(), "timed out after 4s", "--ssh-timeout"),
        (_refused(), "cannot connect to port 2222 (Connection refused)", "sshd listens"),
        (paramiko.SSHException("Error reading SSH protocol banner"), "no SSH server answered on port 2222 within 4s", "MaxStartups"),
        (paramiko.SSHException("No existing session"), "no SSH server answered", "MaxStartups"),
        (paramiko.SSHException("channel closed"), "failed: channel closed", None),
        (EOFError(), "failed: EOFError", None),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "Network is unreachable", None),
    ],
)  # fmt: skip
def test_each_ssh_failure_is_said_once_with_what_to_check(err, message, hint):
    unreachable = _unreachable(err, HOST, SSH, CONNECTION)
    assert isinstance(unreachable, HostUnreachable)
    assert unreachable.message.startswith("ssh to node7 ")
    assert message in unreachable.message
    if hint is None:
        assert not unreachable.hint
    else:
        assert hint in unreachable.hint
