"""Choosing hosts and slots: DeepSpeed's --include/--exclude grammar, --num-nodes, --num-gpus.

A selector is one or more host terms joined by '@'::

    node1                 every slot of node1
    node1:0,2             slots 0 and 2 of node1
    node1:0-3             slots 0, 1, 2 and 3 (ranges are inclusive)
    node1:0-1,6@node2     several hosts
    [fe80::1]:0           IPv6 hosts in brackets, as in the hostfile

`--include` keeps only what it names; `--exclude` removes what it names (a host with slots
removes only those slots). Every host and slot named must exist in the hostfile. The result
keeps hostfile order and slot order, which is rank order.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import replace

from zlaunch.errors import UsageError
from zlaunch.job.hostfile import Host
from zlaunch.text import clip

__all__ = ["select_hosts", "parse_selector"]


def select_hosts(
    hosts: Sequence[Host],
    include: str | None,
    exclude: str | None,
    num_nodes: int | None,
    num_gpus: int | None,
) -> list[Host]:
    """Apply the selectors to `hosts` and return the selected hosts with their slots."""
    selector_flag = _check_combination(include, exclude, num_nodes, num_gpus)
    selected = _by_selector(list(hosts), include, exclude)
    if num_nodes is not None:
        selected = _first_nodes(selected, num_nodes)
    if num_gpus is not None:
        selected = _first_slots(selected, num_gpus)
    if not selected:
        raise UsageError(
            f"{selector_flag} {clip(exclude)} leaves no hosts to run on"
            if exclude
            else "no hosts selected",
            hint="check the selector against the hostfile",
        )
    return selected


def _check_combination(
    include: str | None, exclude: str | None, num_nodes: int | None, num_gpus: int | None
) -> str | None:
    """Refuse selectors that contradict each other; the selector flag in use, if any."""
    if include and exclude:
        raise UsageError(
            "--include and --exclude cannot be used together",
            hint="name what to run on with --include, or what to skip with --exclude",
        )
    selector_flag = "--include" if include else "--exclude" if exclude else None
    if selector_flag and (num_nodes is not None or num_gpus is not None):
        counts = "--num-nodes" if num_nodes is not None else "--num-gpus"
        raise UsageError(
            f"{counts} cannot be combined with {selector_flag}",
            hint=f"say exactly which hosts and slots to use in {selector_flag}, e.g. node1:0-3",
        )
    return selector_flag


def _by_selector(hosts: list[Host], include: str | None, exclude: str | None) -> list[Host]:
    """The hosts --include names (with its slots), or all but what --exclude names."""
    if include:
        wanted = parse_selector(include, hosts, "--include")
        selected = [
            replace(host, slots=tuple(s for s in host.slots if s in wanted[host.name]))
            for host in hosts
            if host.name in wanted
        ]
    elif exclude:
        unwanted = parse_selector(exclude, hosts, "--exclude")
        selected = [
            replace(
                host, slots=tuple(s for s in host.slots if s not in unwanted.get(host.name, ()))
            )
            for host in hosts
        ]
    else:
        selected = hosts
    return [host for host in selected if host.slots]


def _first_nodes(selected: list[Host], num_nodes: int) -> list[Host]:
    """--num-nodes: the first hosts, in hostfile order."""
    if num_nodes < 1:
        raise UsageError(
            f"--num-nodes must be 1 or more, got {num_nodes}", hint="leave it out for all hosts"
        )
    if num_nodes > len(selected):
        raise UsageError(
            f"--num-nodes {num_nodes} asks for more hosts than the {len(selected)} available",
            hint="add hosts to the hostfile or lower --num-nodes",
        )
    return selected[:num_nodes]


def _first_slots(selected: list[Host], num_gpus: int) -> list[Host]:
    """--num-gpus: the first slots of every host; each must have that many."""
    if num_gpus < 1:
        raise UsageError(
            f"--num-gpus must be 1 or more, got {num_gpus}", hint="leave it out for all slots"
        )
    short = [host for host in selected if len(host.slots) < num_gpus]
    if short:
        listing = ", ".join(f"{h.display} has {len(h.slots)}" for h in short)
        raise UsageError(
            f"--num-gpus {num_gpus} asks for more slots than some hosts have ({listing})",
            hint="lower --num-gpus or raise slots= for those hosts in the hostfile",
        )
    return [replace(host, slots=host.slots[:num_gpus]) for host in selected]


def parse_selector(text: str, hosts: Sequence[Host], flag: str) -> dict[str, frozenset[int]]:
    """Parse a selector into {host name: slots}; a bare host means all of its slots.

    Hosts and slots are checked against `hosts`; `flag` names the option in errors.
    """
    by_name = {host.name: host for host in hosts}
    result: dict[str, set[int]] = {}
    if not text.strip():
        raise UsageError(f"{flag} is empty", hint="name hosts like node1 or node1:0,1@node2")
    for term in text.split("@"):
        term = term.strip()
        if not term:
            raise UsageError(
                f"{flag} {clip(text)}: empty host between '@'",
                hint="join hosts with a single '@', e.g. node1@node2",
            )
        name, slot_text = _split_term(term, text, flag)
        host = by_name.get(name)
        if host is None:
            near = difflib.get_close_matches(name, list(by_name), n=1, cutoff=0.6)
            known = ", ".join(h.display for h in hosts)
            raise UsageError(
                f"{flag}: host {clip(name)} is not in the hostfile",
                hint=f"did you mean {near[0]!r}?" if near else f"hosts are: {known}",
            )
        if slot_text is None:
            result.setdefault(name, set()).update(host.slots)
            continue
        slots = _parse_slots(slot_text, term, flag, host)
        missing = sorted(slots - set(host.slots))
        if missing:
            raise UsageError(
                f"{flag}: {host.display} has no slot {', '.join(map(str, missing))}",
                hint=f"{host.display} has slots {_slot_list(host.slots)}",
            )
        result.setdefault(name, set()).update(slots)
    return {name: frozenset(slots) for name, slots in result.items()}


def _split_term(term: str, text: str, flag: str) -> tuple[str, str | None]:
    """'node1:0,1' -> ('node1', '0,1'); '[::1]:0' -> ('::1', '0'); 'node1' -> ('node1', None)."""
    if term.startswith("["):
        close = term.find("]")
        if close < 0:
            raise UsageError(f"{flag}: '[' without ']' in {clip(term)}")
        name, rest = term[1:close], term[close + 1 :]
        if not rest:
            return name, None
        if not rest.startswith(":"):
            raise UsageError(f"{flag}: expected ':' after {clip(term[: close + 1])}")
        return name, rest[1:]
    name, sep, slots = term.partition(":")
    if ":" in slots:
        raise UsageError(
            f"{flag}: too many ':' in {clip(term)}",
            hint="put IPv6 hosts in brackets, e.g. [fe80::1]:0,1",
        )
    return name, (slots if sep else None)


def _parse_slots(text: str, term: str, flag: str, host: Host) -> set[int]:
    slots: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        low, dash, high = item.partition("-")
        if not _number(low) or (dash and not _number(high)):
            raise UsageError(
                f"{flag}: bad slot {clip(item)} in {clip(term)}",
                hint="slots are numbers or ranges joined by ',', e.g. node1:0,2-3",
            )
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise UsageError(
                f"{flag}: empty slot range {clip(item)} in {clip(term)}",
                hint=f"write the range low-high, e.g. {last}-{first}",
            )
        if last > max(host.slots):
            # Checked before expanding, so a typo like 0-99999999 cannot eat memory.
            raise UsageError(
                f"{flag}: {host.display} has no slot {last}",
                hint=f"{host.display} has slots {_slot_list(host.slots)}",
            )
        slots.update(range(first, last + 1))
    return slots


def _number(text: str) -> bool:
    """ASCII digits, few enough for int() (str.isdigit() also takes '²', which int() refuses)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _slot_list(slots: Sequence[int]) -> str:
    ordered = sorted(slots)
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))
