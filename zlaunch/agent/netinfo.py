"""Which network interface leads to an address (stdlib only; used by the agent on every node).

gloo and NCCL pick an interface by themselves and often pick the wrong one on hosts with
several (docker bridges, management networks). The agent asks the kernel which source address
it would use to reach the master (a connected UDP socket sends nothing) and names the interface
that holds that address, so ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` point at the route the
rendezvous itself will take.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

__all__ = ["source_address", "interface_for", "interface_addresses"]

_SIOCGIFADDR = 0x8915


def source_address(dest: str) -> str:
    """The local address the kernel would use to send to ``dest`` (a name or an address)."""
    infos = socket.getaddrinfo(dest, 1, type=socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"cannot resolve {dest!r}")
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(sockaddr)
        return sock.getsockname()[0]


def interface_addresses() -> dict[str, list[str]]:
    """Interface name -> its IPv4 (via ioctl) and IPv6 (via /proc) addresses."""
    found: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
            found.setdefault(name, []).append(socket.inet_ntoa(reply[20:24]))
    try:
        with open("/proc/net/if_inet6") as table:
            for row in table:
                fields = row.split()
                if len(fields) >= 6:
                    addr = str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
                    found.setdefault(fields[5], []).append(addr)
    except OSError:
        pass
    return found


def interface_for(dest: str) -> str | None:
    """Name of the interface whose address is the source address towards ``dest``."""
    src = ipaddress.ip_address(source_address(dest).split("%")[0])
    for name, addrs in interface_addresses().items():
        if any(ipaddress.ip_address(a) == src for a in addrs):
            return name
    if src.is_loopback:
        return "lo"
    return None
