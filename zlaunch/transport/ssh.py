"""SSH transport: fabric for the connection (ssh config, users, ports, keys, jump hosts), then
a raw paramiko session channel so the agent's stdin and stdout stream both ways at once.

Never prompts: no passwords, no keyboard-interactive; keys come from ``-I/--identity``, the ssh
config's ``IdentityFile``, the default key files and a running ssh-agent.

Host keys are checked as OpenSSH does: the known_hosts files the ssh config names
(``UserKnownHostsFile``, ``GlobalKnownHostsFile``, else ``~/.ssh/known_hosts`` and
``/etc/ssh/ssh_known_hosts``) are read, and a host whose key differs from the one recorded
there is refused. An unknown host is refused too, as OpenSSH does in batch mode (nothing can be
asked, and the spec sent next carries every secret of the job): unless ``--accept-new-hosts``
or the ssh config's ``StrictHostKeyChecking accept-new`` (or ``no``) says to trust it, in which
case its key is appended to the first ``UserKnownHostsFile`` and checked on every later run.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
from collections.abc import Sequence

from zlaunch.errors import HostUnreachable
from zlaunch.job import Host, SshOptions
from zlaunch.transport.link import Link

__all__ = ["SshLink", "reachable", "remote_command"]

_DEFAULT_KNOWN_HOSTS = {
    "userknownhostsfile": "~/.ssh/known_hosts ~/.ssh/known_hosts2",
    "globalknownhostsfile": "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2",
}


# StrictHostKeyChecking values under which OpenSSH records an unknown key and goes on.
_ACCEPT_NEW = frozenset({"accept-new", "no", "off"})
# Connections open in parallel: one writer at a time appends to known_hosts.
_KNOWN_HOSTS_LOCK = threading.Lock()
# paramiko logs a failed handshake with two tracebacks from its own thread (through logging's
# last-resort handler, as nothing else is configured); zlaunch reports each failure once itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class _UnknownHostKey(Exception):
    """A host key found in no known_hosts file, and no permission to trust a new one."""

    def __init__(self, hostname: str, key) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


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


def _user_known_hosts(ssh_config) -> str:
    """Where a newly trusted key is written: the first UserKnownHostsFile, as OpenSSH does."""
    value = ssh_config.get("userknownhostsfile", _DEFAULT_KNOWN_HOSTS["userknownhostsfile"])
    names = value if isinstance(value, list) else str(value).split()
    return os.path.expanduser(names[0])


def _record_host_key(path: str, hostname: str, key) -> None:
    """Append ``hostname``'s key to known_hosts (a new file and its folder private)."""
    folder = os.path.dirname(path) or "."
    with _KNOWN_HOSTS_LOCK:
        if not os.path.isdir(folder):
            os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def fingerprint(key) -> str:
    """``ssh-keygen -l`` style: SHA256:base64, what a user compares with the host's."""
    import base64
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _check_host_keys(connection, accept_new: bool) -> None:
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
    trust_new = accept_new or strict in _ACCEPT_NEW
    known_hosts = _user_known_hosts(connection.ssh_config)

    class Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            if not trust_new:
                raise _UnknownHostKey(hostname, key)
            try:
                _record_host_key(known_hosts, hostname, key)
            except OSError as err:
                raise HostUnreachable(
                    f"cannot record the host key of {hostname} in {known_hosts}: "
                    f"{err.strerror or err}"
                ) from None
            client.get_host_keys().add(hostname, key.get_name(), key)

    client.set_missing_host_key_policy(Policy())


def remote_command(argv: Sequence[str]) -> str:
    """The shell command run by sshd: no env, no secrets, just the interpreter and module.

    ``cd /`` so that a stale or unmounted login directory cannot break the start; workers get
    their own cwd from the spec. An interpreter starting with '-' would be read as one of exec's
    options (``exec -c`` clears the environment; dash has no ``exec --``): refused here, and
    `--python` refuses it at the command line.
    """
    if argv[0].startswith("-"):
        raise ValueError(f"the interpreter {argv[0]!r} would be read as an option of exec")
    return "cd / && exec " + shlex.join(argv)


def _connection(host: Host, ssh: SshOptions):
    """A fabric connection to ``host`` (not opened yet): keys and agent as ssh uses them, and
    every wait bounded by --ssh-timeout (zlaunch never prompts)."""
    import fabric

    config = fabric.Config(runtime_ssh_path=ssh.config_file) if ssh.config_file else fabric.Config()
    connect_kwargs = {
        "look_for_keys": True,
        "allow_agent": True,
        "banner_timeout": ssh.timeout,
        "auth_timeout": ssh.timeout,
        "channel_timeout": ssh.timeout,
    }
    if ssh.identity:
        connect_kwargs["key_filename"] = [ssh.identity]
    return fabric.Connection(
        host.name,
        user=host.user,
        port=host.port or ssh.port,
        config=config,
        connect_timeout=ssh.timeout,
        connect_kwargs=connect_kwargs,
    )


def _unreachable(err: BaseException, host: Host, ssh: SshOptions, connection) -> HostUnreachable:
    """Why the agent on ``host`` could not be started, said for the user, with what to check."""
    import paramiko

    where = host.display
    if isinstance(err, paramiko.BadHostKeyException):
        return HostUnreachable.of(
            host.name,
            f"ssh to {where} refused: its host key changed ({err.key.get_name()} "
            f"{err.key.get_fingerprint().hex()}, known_hosts has "
            f"{err.expected_key.get_fingerprint().hex()})",
            hint="if the host was reinstalled, remove the old key: ssh-keygen -R "
            f"{err.hostname}; otherwise someone may be intercepting the connection",
        )
    if isinstance(err, _UnknownHostKey):
        known = _user_known_hosts(connection.ssh_config)
        return HostUnreachable.of(
            host.name,
            f"ssh to {where} refused: its host key ({err.key.get_name()} "
            f"{fingerprint(err.key)}) is not in known_hosts, so nothing proves the host "
            "is the one meant",
            hint=f"check the fingerprint with the host's admin, then rerun with "
            f"--accept-new-hosts to record it in {known}, or add it yourself: "
            f"ssh-keyscan {err.hostname} >> {known}",
        )
    if isinstance(err, paramiko.AuthenticationException):
        return HostUnreachable.of(
            host.name,
            f"ssh to {where} failed: authentication refused ({err})",
            hint="check the user and key (-I/--identity, --ssh-config); zlaunch never prompts",
        )
    if isinstance(err, TimeoutError):
        return HostUnreachable.of(
            host.name,
            f"ssh to {where} timed out after {ssh.timeout:g}s",
            hint="check the address and that sshd runs there; --ssh-timeout sets the limit",
        )
    if isinstance(err, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = sorted({e.strerror or str(e) for e in err.errors.values()})
        ports = sorted({addr[1] for addr in err.errors})
        return HostUnreachable.of(
            host.name,
            f"ssh to {where} failed: cannot connect to port "
            f"{', '.join(map(str, ports))} ({'; '.join(reasons)})",
            hint="check that sshd listens there (hostfile port=, --ssh-port, ssh config Port)",
        )
    if isinstance(err, paramiko.SSHException):
        return _no_handshake(err, host, ssh, connection)
    return HostUnreachable.of(host.name, f"ssh to {where} failed: {str(err) or type(err).__name__}")


def _no_handshake(err: Exception, host: Host, ssh: SshOptions, connection) -> HostUnreachable:
    # The handshake never completed: paramiko says so as a banner error, or (when its start
    # timeout and banner timeout race) as "No existing session" at the first auth.
    if "protocol banner" not in str(err) and "No existing session" not in str(err):
        return HostUnreachable.of(host.name, f"ssh to {host.display} failed: {err}")
    port = host.port or ssh.port or connection.port
    return HostUnreachable.of(
        host.name,
        f"ssh to {host.display} failed: no SSH server answered on port {port} "
        f"within {ssh.timeout:g}s",
        hint=f"check that port {port} is sshd's (ssh -p {port} {host.name}); a busy sshd "
        "drops new connections (MaxStartups): retry, or raise --ssh-timeout",
    )


def reachable(host: Host, ssh: SshOptions) -> str | None:
    """One SSH login to ``host`` within ``ssh.timeout``, closed at once (nothing runs there):
    None when it succeeded, else why not, in the words a failed start uses. The probe of a
    host that may join a growing job (zlaunch/launcher/host_probe.py)."""
    import paramiko

    connection = _connection(host, ssh)
    try:
        _check_host_keys(connection, ssh.accept_new_hosts)
        connection.open()
        return None
    except (_UnknownHostKey, paramiko.SSHException, OSError, EOFError, ValueError) as err:
        return _unreachable(err, host, ssh, connection).message
    except HostUnreachable as err:
        return err.message
    finally:
        connection.close()


class SshLink(Link):
    def __init__(self, host: Host, connection, channel):
        super().__init__(host)
        self.connection = connection
        self.channel = channel
        self._exit_status: int | None = None
        self._start_stderr_thread(lambda: channel.recv_stderr(65536))

    @classmethod
    def start(cls, host: Host, argv: Sequence[str], ssh: SshOptions) -> SshLink:
        import paramiko

        connection = _connection(host, ssh)
        _check_host_keys(connection, ssh.accept_new_hosts)
        try:
            connection.open()
            transport = connection.client.get_transport()
            transport.set_keepalive(5)
            channel = transport.open_session(timeout=ssh.timeout)
            channel.exec_command(remote_command(argv))
        except HostUnreachable:
            connection.close()
            raise
        except (_UnknownHostKey, paramiko.SSHException, OSError, EOFError, ValueError) as err:
            connection.close()
            cause = None if isinstance(err, _UnknownHostKey) else err
            raise _unreachable(err, host, ssh, connection) from cause
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

    def running(self) -> bool:
        """sshd sends the command's exit status as it ends; a connection that died (keepalive
        unanswered, reset) runs nothing zlaunch can still talk to."""
        transport = self.channel.get_transport()
        alive = transport is not None and transport.is_active()
        return alive and not self.channel.closed and not self.channel.exit_status_ready()

    def terminate(self, wait: float = 5.0) -> None:
        self.close_stdin()
        self.closed = True
        self.wait(wait)
        try:
            self.channel.close()
        finally:
            self.connection.close()
