"""Who may connect back: the agents one attempt waits for, as the connect-back listener
(transport/connect_back.py) asks of each agent that has proven the job's token. The listener
knows sockets and the handshake; a roster knows which agents the scheduler placed. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from zlaunch.job import Host
from zlaunch.transport.preauth import Refusal
from zlaunch.wire import Answer

__all__ = ["HostRoster", "Roster"]


class Roster(Protocol):
    """The slots that authenticated agents fill, by index.

    ``place`` answers without changing anything (the proof may still fail to reach the agent);
    ``joined`` records that the agent of ``index`` is in; ``missing`` lists the slots still
    empty, and the listener waits while there are any."""

    def place(self, answer: Answer) -> int | Refusal: ...

    def joined(self, index: int) -> None: ...

    def missing(self) -> list[int]: ...


class HostRoster:
    """One agent per host of ``hosts``, matched by the node name it reports: the full name,
    or the short one where no other host shares it (an agent outside Slurm reports its host
    name, which may lack the domain)."""

    def __init__(self, hosts: Sequence[Host]):
        self.hosts = list(hosts)
        self._index = _index_by_name(self.hosts)
        self._missing = set(range(len(self.hosts)))

    def place(self, answer: Answer) -> int | Refusal:
        index = self._index.get(answer.node)
        if index is None:
            return Refusal.NOT_A_NODE
        if index not in self._missing:
            return Refusal.TWICE
        return index

    def joined(self, index: int) -> None:
        self._missing.discard(index)

    def missing(self) -> list[int]:
        return sorted(self._missing)


def _index_by_name(hosts: Sequence[Host]) -> dict[str, int]:
    index = {host.name: i for i, host in enumerate(hosts)}
    shorts: dict[str, list[int]] = {}
    for i, host in enumerate(hosts):
        shorts.setdefault(host.name.split(".")[0], []).append(i)
    for short, found in shorts.items():
        if len(found) == 1:
            index.setdefault(short, found[0])
    return index
