"""Slurm's hostlist grammar: ``gpu-a[001-004,007],gpu-b12`` <-> a list of host names (stdlib only).

What ``SLURM_JOB_NODELIST`` and ``scontrol show hostnames`` speak:

- entries are separated by commas (or whitespace) outside brackets; empty entries are skipped;
- a bracket group holds comma-separated numbers and ``lo-hi`` ranges; every number keeps the
  width of the lower bound's digits (``[001-004]`` -> 001 002 003 004, ``[8-10]`` -> 8 9 10);
- text may surround a group (``n[1-2]-ib``), and several groups in one entry give every
  combination, the first group varying slowest (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2);
- order and duplicates are kept, as Slurm keeps them.

The runtime reads rank 0's host from it (``first_host``); the launcher expands the allocation.
"""

from __future__ import annotations

import itertools
import re

__all__ = ["HostlistError", "MAX_HOSTS", "compress", "expand", "first_host"]

#: Expanding more names than this is refused (a typo like ``n[0-999999999]`` must not eat memory).
MAX_HOSTS = 1 << 20
#: A host name longer than DNS allows is no host; with MAX_HOSTS it bounds the memory used.
MAX_NAME = 255
#: Digits of one number in brackets (int() refuses 4,300+ of them, and no host needs 19).
MAX_DIGITS = 18

_SEPARATORS = ", \t\n"
_NUMBER = re.compile(r"[0-9]+")


class HostlistError(ValueError):
    """A malformed hostlist; the message quotes the list and says what is wrong where. Each
    side says it as its own error (the controller a usage error, a rank a DistInitError)."""


def expand(text: str) -> list[str]:
    """Every host name of ``text``, in order (``[]`` for an empty or blank list)."""
    hosts: list[str] = []
    for entry in _entries(text):
        names = _expand_entry(entry, text)
        if len(hosts) + len(names) > MAX_HOSTS:
            raise HostlistError(f"hostlist {_show(text)} names more than {MAX_HOSTS} hosts")
        hosts.extend(names)
    return hosts


def first_host(text: str) -> str:
    """The first host of ``text`` without expanding the rest. HostlistError when it is empty."""
    for entry in _entries(text):
        groups = _groups(entry, text)
        return "".join(part if isinstance(part, str) else _first(part) for part in groups)
    raise HostlistError(f"hostlist {_show(text)} is empty")


def compress(hosts: list[str]) -> str:
    """A short hostlist naming ``hosts`` in the same order: runs of consecutive numbers that
    share a prefix and digit width become one bracket group (``n1,n2,n3,x`` -> ``n[1-3],x``)."""
    out: list[str] = []
    i = 0
    while i < len(hosts):
        m = _split_number(hosts[i])
        if m is None:
            out.append(hosts[i])
            i += 1
            continue
        prefix, digits = m
        items = [digits]
        j = i + 1
        while j < len(hosts):
            n = _split_number(hosts[j])
            # one prefix and one digit width: the lower bound's width re-creates every item
            if n is None or n[0] != prefix or len(n[1]) != len(digits):
                break
            items.append(n[1])
            j += 1
        if len(items) == 1:
            out.append(hosts[i])
        else:
            out.append(f"{prefix}[{_ranges(items)}]")
        i = j
    return ",".join(out)


# -- parsing --------------------------------------------------------------------------------


def _entries(text: str) -> list[str]:
    """Split at separators outside brackets; bracket balance is checked here."""
    if not isinstance(text, str):
        raise HostlistError(f"a hostlist must be text, got {type(text).__name__}")
    entries: list[str] = []
    depth = 0
    start = 0
    for pos, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise HostlistError(
                    f"hostlist {_show(text)}: nested '[' at position {pos} (brackets do not nest)"
                )
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"hostlist {_show(text)}: ']' at position {pos} has no '['")
            depth = 0
        elif ch in _SEPARATORS and not depth:
            if pos > start:
                entries.append(text[start:pos])
            start = pos + 1
    if depth:
        raise HostlistError(f"hostlist {_show(text)}: '[' is never closed")
    if len(text) > start:
        entries.append(text[start:])
    return entries


Group = list[tuple[int, int, int]]
"""A bracket group as ranges ``(low, high, width)``; a single number is a range of one."""


def _groups(entry: str, text: str) -> list[str | Group]:
    """``entry`` as literal text pieces and bracket groups."""
    parts: list[str | Group] = []
    pos = 0
    while pos < len(entry):
        open_at = entry.find("[", pos)
        if open_at < 0:
            parts.append(entry[pos:])
            break
        if open_at > pos:
            parts.append(entry[pos:open_at])
        close_at = entry.index("]", open_at)  # balanced: checked by _entries
        parts.append(_parse_group(entry[open_at + 1 : close_at], entry, text))
        pos = close_at + 1
    return parts


def _parse_group(body: str, entry: str, text: str) -> Group:
    where = f"hostlist {_show(text)}, group [{_cut(body)}] of {_show(entry)}"
    if not body:
        raise HostlistError(f"{where}: empty brackets")
    ranges: Group = []
    for item in body.split(","):
        lo, dash, hi = item.partition("-")
        if len(lo) > MAX_DIGITS or len(hi) > MAX_DIGITS:
            raise HostlistError(f"{where}: {_show(item)} has more than {MAX_DIGITS} digits")
        if not _NUMBER.fullmatch(lo) or (dash and not _NUMBER.fullmatch(hi)):
            raise HostlistError(
                f"{where}: {_show(item)} is not a number or a range lo-hi of numbers "
                "(write e.g. [1-4,7] or [001-016])"
            )
        low = int(lo)
        high = int(hi) if dash else low
        if low > high:
            raise HostlistError(f"{where}: range {item!r} runs backwards ({low} > {high})")
        ranges.append((low, high, len(lo)))
    return ranges


def _first(group: Group) -> str:
    low, _, width = group[0]
    return str(low).zfill(width)


def _values(group: Group, where: str) -> list[str]:
    if sum(high - low + 1 for low, high, _ in group) > MAX_HOSTS:
        raise HostlistError(f"{where} names more than {MAX_HOSTS} hosts")
    return [str(n).zfill(width) for low, high, width in group for n in range(low, high + 1)]


def _expand_entry(entry: str, text: str) -> list[str]:
    where = f"hostlist {_show(text)}: {_show(entry)}"
    parts = _groups(entry, text)
    longest = sum(
        len(part) if isinstance(part, str) else max(max(w, len(str(hi))) for _, hi, w in part)
        for part in parts
    )
    if longest > MAX_NAME:
        raise HostlistError(
            f"{where} makes host names of {longest} characters (at most {MAX_NAME})"
        )
    count = 1
    for part in parts:
        if not isinstance(part, str):
            count *= sum(high - low + 1 for low, high, _ in part)
            if count > MAX_HOSTS:
                raise HostlistError(f"{where} names more than {MAX_HOSTS} hosts")
    choices = [[part] if isinstance(part, str) else _values(part, where) for part in parts]
    return ["".join(combo) for combo in itertools.product(*choices)]


def _cut(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _show(text: str) -> str:
    return repr(_cut(text))


# -- compressing ----------------------------------------------------------------------------

_TRAILING_NUMBER = re.compile(r"^(.*?)([0-9]+)$")


def _split_number(host: str) -> tuple[str, str] | None:
    m = _TRAILING_NUMBER.match(host)
    if m is None or any(c in host for c in "[]," + _SEPARATORS):
        return None
    return m.group(1), m.group(2)


def _ranges(items: list[str]) -> str:
    """``["001","002","003","007"]`` -> ``"001-003,007"`` (every item has the same width)."""
    pieces = []
    start = prev = items[0]
    for item in items[1:]:
        if int(item) == int(prev) + 1:
            prev = item
            continue
        pieces.append(start if start == prev else f"{start}-{prev}")
        start = prev = item
    pieces.append(start if start == prev else f"{start}-{prev}")
    return ",".join(pieces)
