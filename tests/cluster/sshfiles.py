"""Keys and configuration files for the cluster's sshd servers and its ssh clients.

Everything lives in the cluster's state directory: one host key per node, one client key, the
``authorized_keys`` holding it, a ``known_hosts`` pre-filled with every node's host key (listed
under both its name and its address, plain text, which OpenSSH and paramiko both read), one
``sshd_config`` per node and the client ``ssh_config``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

__all__ = [
    "SSHD",
    "SSH_KEYGEN",
    "etc_hosts",
    "generate_key",
    "ssh_config",
    "sshd_config",
]

SSHD = shutil.which("sshd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or ""
SSH_KEYGEN = shutil.which("ssh-keygen") or ""


def generate_key(path: str, comment: str) -> str:
    """Write an ed25519 key pair (``path``, ``path.pub``); returns the public key line."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    with open(path + ".pub") as f:
        return f.read().strip()


def sshd_config(*, host_key: str, authorized_keys: str, pid_file: str, ipv6: bool) -> str:
    listen = ["AddressFamily any", "ListenAddress 0.0.0.0", "ListenAddress ::"]
    return "\n".join(
        [
            "Port 22",
            *(listen if ipv6 else ["AddressFamily inet", "ListenAddress 0.0.0.0"]),
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # No PAM and no ownership checks: the keys live in a temporary directory, and a
            # minimal container may have no PAM stack for sshd.
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "AcceptEnv LANG LC_*",
            # A launcher opens one connection per node at once, and tests run many launches.
            "MaxStartups 200",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def ssh_config(
    *,
    addresses: Mapping[str, str],
    identity_file: str,
    known_hosts: str,
    comment: str,
) -> str:
    lines = [f"# {comment}", ""]
    for host, address in addresses.items():
        lines += [f"Host {host} {address}", f"    HostName {address}", ""]
    lines += [
        "Host *",
        "    User root",
        "    Port 22",
        f"    IdentityFile {identity_file}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {known_hosts}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    BatchMode yes",
        "    ConnectTimeout 5",
        # The post-quantum default key exchange costs ~0.1 s of CPU per connection, which adds
        # up on a loaded 2-core test machine; the nodes are local, so plain curve25519 will do.
        "    KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org",
        "    LogLevel ERROR",
        "",
    ]
    return "\n".join(lines)


def etc_hosts(addresses: Mapping[str, str], controller: str) -> str:
    lines = [
        "127.0.0.1 localhost",
        "::1 localhost ip6-localhost ip6-loopback",
        f"{controller} controller",
    ]
    lines += [f"{address} {host}" for host, address in addresses.items()]
    return "\n".join(lines) + "\n"
