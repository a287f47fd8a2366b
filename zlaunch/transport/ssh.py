"""SSH transport: fabric for the connection (ssh config, users, ports, keys, jump hosts), then
a raw paramiko session channel so the agent's stdin and stdout stream both ways at once.

Never prompts: no passwords, no keyboard-interactive; keys come from ``-I/--identity``, the ssh
config's ``IdentityFile``, the default key files and a running ssh-agent.

Host keys are checked as OpenSSH does: the known_hosts files the ssh config names
(``UserKnownHostsFile``, ``GlobalKnownHostsFile``, else ``~/.ssh/known_hosts`` and
``/etc/ssh/ssh_known_hosts``) are read, and a host whose key differs from the one recorded
there is refused. An unknown host is refused under ``StrictHostKeyChecking yes`` and otherwise
accepted for this run (``accept-new`` without writing the file: nothing can be asked).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from zlaunch.errors import HostUnreachable
from zlaunch.hostfile import Host
from zlaunch.options import SshOptions
from zlaunch.transport import Link

__all__ = ["SshLink", "remote_command"]

_DEFAULT_KNOWN_HOSTS = {
    "userknownhostsfile": "~/.ssh/known_hosts ~/.ssh/known_hosts2",
    "globalknownhostsfile": "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2",
}


class _UnknownHostKey(Exception):
    """A host key found in no known_hosts file, under StrictHostKeyChecking yes."""


def _known_hosts_files(ssh_config) -> list[str]:
    """The known_hosts files OpenSSH would read for this host, those that exist."""
    files = []
    for key, default in _DEFAULT_KNOWN_HOSTS.items():
        value = ssh_config.get(key, default)
        names = value if isinstance(value, list) else str(value).split()
        for name in names:
            path = os.path.expanduser(name)
            if path.lower() != "none" and os.path.isfile(path):
                files.append(path)
    return files


def _check_host_keys(connection) -> None:
    """Load the recorded host keys into the connection and pick the unknown-host policy."""
    import paramiko

    client = connection.client
    for path in _known_hosts_files(connection.ssh_config):
        try:
            client.load_system_host_keys(path)
        except (OSError, paramiko.SSHException, ValueError) as err:
            raise HostUnreachable(
                f"cannot read known_hosts file {path}: {err}",
                hint="fix or remove the broken line (ssh-keygen -R HOST -f FILE)",
            ) from err
    strict = str(connection.ssh_config.get("stricthostkeychecking", "")).lower()
    if strict == "yes":

        class Reject(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client, hostname, key):
                raise _UnknownHostKey(hostname)

        client.set_missing_host_key_policy(Reject())


def remote_command(argv: Sequence[str]) -> str:
    """The shell command run by sshd: no env, no secrets, just the interpreter and module.

    ``cd /`` so that a stale or unmounted login directory cannot break the start; workers get
    their own cwd from the spec.
    """
    return "cd / && exec " + shlex.join(argv)


class SshLink(Link):
    def __init__(self, host: Host, connection, channel):
        super().__init__(host)
        self.connection = connection
        self.channel = channel
        self._exit_status: int | None = None
        self._start_stderr_thread(lambda: channel.recv_stderr(65536))

    @classmethod
    def start(cls, host: Host, argv: Sequence[str], ssh: SshOptions) -> SshLink:
        import fabric
        import paramiko

        config = (
            fabric.Config(runtime_ssh_path=ssh.config_file) if ssh.config_file else fabric.Config()
        )
        connect_kwargs = {
            "look_for_keys": True,
            "allow_agent": True,
            "banner_timeout": ssh.timeout,
            "auth_timeout": ssh.timeout,
            "channel_timeout": ssh.timeout,
        }
        if ssh.identity:
            connect_kwargs["key_filename"] = [ssh.identity]
        connection = fabric.Connection(
            host.name,
            user=host.user,
            port=host.port or ssh.port,
            config=config,
            connect_timeout=ssh.timeout,
            connect_kwargs=connect_kwargs,
        )
        where = host.display
        _check_host_keys(connection)
        try:
            connection.open()
            transport = connection.client.get_transport()
            transport.set_keepalive(5)
            channel = transport.open_session(timeout=ssh.timeout)
            channel.exec_command(remote_command(argv))
        except paramiko.BadHostKeyException as err:
            connection.close()
            raise HostUnreachable(
                f"ssh to {where} refused: its host key changed ({err.key.get_name()} "
                f"{err.key.get_fingerprint().hex()}, known_hosts has "
                f"{err.expected_key.get_fingerprint().hex()})",
                hint="if the host was reinstalled, remove the old key: ssh-keygen -R "
                f"{err.hostname}; otherwise someone may be intercepting the connection",
            ) from err
        except _UnknownHostKey as err:
            connection.close()
            raise HostUnreachable(
                f"ssh to {where} refused: host key of {err} is not in known_hosts "
                "(StrictHostKeyChecking yes)",
                hint=f"add it first: ssh-keyscan {err} >> ~/.ssh/known_hosts "
                "(or the file UserKnownHostsFile names)",
            ) from err
        except paramiko.AuthenticationException as err:
            connection.close()
            raise HostUnreachable(
                f"ssh to {where} failed: authentication refused ({err})",
                hint="check the user and key (-I/--identity, --ssh-config); zlaunch never prompts",
            ) from err
        except TimeoutError as err:
            connection.close()
            raise HostUnreachable(
                f"ssh to {where} timed out after {ssh.timeout:g}s",
                hint="check the address and that sshd runs there; --ssh-timeout sets the limit",
            ) from err
        except paramiko.ssh_exception.NoValidConnectionsError as err:
            connection.close()
            reasons = sorted({e.strerror or str(e) for e in err.errors.values()})
            ports = sorted({addr[1] for addr in err.errors})
            raise HostUnreachable(
                f"ssh to {where} failed: cannot connect to port "
                f"{', '.join(map(str, ports))} ({'; '.join(reasons)})",
                hint="check that sshd listens there (hostfile port=, --ssh-port, ssh config Port)",
            ) from err
        except (OSError, paramiko.SSHException, EOFError, ValueError) as err:
            connection.close()
            text = str(err) or type(err).__name__
            raise HostUnreachable(f"ssh to {where} failed: {text}") from err
        return cls(host, connection, channel)

    def _write(self, data: bytes) -> None:
        self.channel.sendall(data)

    def read(self, size: int = 65536) -> bytes:
        try:
            return self.channel.recv(size)
        except (OSError, EOFError):
            return b""

    def close_stdin(self) -> None:
        with self._send_lock:
            try:
                self.channel.shutdown_write()
            except (OSError, EOFError):
                pass

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.channel.status_event.wait(timeout):
            return None
        return self.channel.exit_status

    def terminate(self, wait: float = 5.0) -> None:
        self.close_stdin()
        self.closed = True
        self.wait(wait)
        try:
            self.channel.close()
        finally:
            self.connection.close()
