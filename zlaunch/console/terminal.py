"""What the user sees: rank-tagged output lines, controller notes, failure reports, tables.

Rank output goes to stdout, one line per rank line, prefixed ``[host:rank]``; a line the worker
wrote to stderr carries ``!`` right after the prefix (``[node2:3]! Traceback ...``), so that
stderr stays visible in a pipe or a file without colors. On a TTY the prefix is colored per
rank and the ``!`` is red; with ``NO_COLOR``, ``--no-color`` or when stdout is not a TTY there
are no escape codes at all, and a rank's own control characters are shown escaped
(console/safe_text.py: a rank cannot move the cursor or erase another rank's line; its colours
stay on a colour console). Lines are written whole by the single thread that owns the console,
a batch of lines per ``write``, so they are never broken or merged. Plain escape codes do the
coloring here: rendering 100k+ lines through rich would cost more than the job's own output.
rich is imported only for tables (``zlaunch check``).

Controller messages (notes, the failure report) go to stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from zlaunch.console.collapse import Shown
from zlaunch.console.safe_text import shown as safe
from zlaunch.console.safe_text import shown_block as safe_block
from zlaunch.console.writer import BackgroundWriter, TextWriter
from zlaunch.rundir import Failure, FailureReport
from zlaunch.text import host_ranges, rank_ranges
from zlaunch.wire import frames, protocol

__all__ = [
    "Console",
    "color_enabled",
    "format_failure",
    "format_hang",
    "is_terminal",
    "print_table",
]


_RESET = "\x1b[0m"
_RED = "\x1b[31m"
_BOLD_RED = "\x1b[1;31m"
_DIM = "\x1b[2m"
_BOLD = "\x1b[1m"
SHARED_RANKS_CHARS = 60
"""A collapsed line's rank list longer than this is cut (``0,2,4,...,1022 (512 ranks)``)."""
# Six well-separated foreground colors, then their bright variants: 12 ranks before a repeat.
_PALETTE = (36, 33, 35, 32, 34, 31, 96, 93, 95, 92, 94, 91)


def color_enabled(stream: IO[Any], requested: bool | None) -> bool:
    """``requested`` True/False wins; None means: a TTY and no (non-empty) NO_COLOR."""
    if requested is not None:
        return requested
    if os.environ.get("NO_COLOR"):
        return False
    return is_terminal(stream)


def is_terminal(stream: Any) -> bool:
    """The stream is a terminal (False for anything without a working ``isatty``)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Console:
    """Writes rank output and controller notes. Use from one thread only."""

    def __init__(
        self,
        *,
        color: bool | None = None,
        ranks: frozenset[int] | None = None,
        out: IO[bytes] | None = None,
        err: IO[str] | None = None,
    ):
        self._writers: list[BackgroundWriter] = []
        self.out = out if out is not None else self._unblocking_bytes(sys.stdout.buffer)
        self.err = err if err is not None else self._unblocking_text(sys.stderr)
        self.color = color_enabled(self.out, color)
        self.err_color = color_enabled(self.err, color)
        self.ranks = ranks
        self._prefixes: dict[tuple[str, int, str], bytes] = {}
        self.dropped_elsewhere = 0
        """Rank lines a view that took over the output dropped (the live panel's)."""

    # A pipe or file is written from a thread of its own (zlaunch.console.writer), so that a
    # reader that stops reading never blocks the controller; a terminal is written directly.
    def _unblocking_bytes(self, stream: IO[bytes]) -> Any:
        if is_terminal(stream):
            return stream
        writer = BackgroundWriter(stream)
        self._writers.append(writer)
        return writer

    def _unblocking_text(self, stream: IO[str]) -> Any:
        buffer = getattr(stream, "buffer", None)
        if is_terminal(stream) or buffer is None:
            return stream
        writer = BackgroundWriter(buffer)
        self._writers.append(writer)
        return TextWriter(writer, getattr(stream, "encoding", None) or "utf-8")

    def close(self, timeout: float | None = None) -> None:
        """Write out what is queued (at the end of the job: the report must be complete), and
        say how many rank lines the console could not show."""
        for writer in self._writers:
            writer.drain(timeout)
        dropped = self.dropped_lines
        if dropped:
            self.note(
                f"{dropped} line(s) of rank output were not shown on this console, which fell "
                "behind; every line is in the rank logs (zlaunch logs)",
                error=True,
            )
        for writer in self._writers:
            writer.close(timeout)

    @property
    def dropped_lines(self) -> int:
        """Rank lines this console dropped because its reader fell behind."""
        writers = [*self._writers, self.out]  # the out stream a test may have given
        mine = {id(w): w.dropped for w in writers if isinstance(w, BackgroundWriter)}
        return sum(mine.values()) + self.dropped_elsewhere

    def _prefix(self, host: str, rank: int, stream: str) -> bytes:
        key = (host, rank, stream)
        prefix = self._prefixes.get(key)
        if prefix is None:
            tag = f"[{host}:{rank}]"
            mark = "!" if stream == protocol.STDERR else ""
            if self.color:
                code = _PALETTE[rank % len(_PALETTE)]
                tag = f"\x1b[{code}m{tag}{_RESET}"
                if mark:
                    mark = f"{_RED}{mark}{_RESET}"
            prefix = f"{tag}{mark} ".encode()
            self._prefixes[key] = prefix
        return prefix

    def shows(self, rank: int) -> bool:
        """The rank's lines are shown (``--ranks``; none once the reader has gone)."""
        return self.ranks is None or rank in self.ranks

    def lines(self, host: str, rank: int, stream: str, lines: Sequence[str]) -> None:
        """Show a batch of complete lines of one rank (unless filtered out by ``--ranks``)."""
        if not lines or not self.shows(rank):
            return
        prefix = self._prefix(host, rank, stream)
        # One encode and one replace for the batch; a line holds no newline (the agent cut
        # the stream at them), so each one gets its prefix. Control characters escaped: no
        # rank drives the terminal (console/safe_text.py).
        text = frames.line_bytes("\n".join(safe(line, self.color) for line in lines))
        self._write_out(prefix + text.replace(b"\n", b"\n" + prefix) + b"\n")

    def collapsed(self, shown: Sequence[Shown], hosts: Mapping[int, str]) -> None:
        """Lines from the collapser (zlaunch.console.collapse): a line of one rank with its
        ``[host:rank]`` tag, a line several ranks said once as ``[ranks 0-3,5]``."""
        data = []
        for line in shown:
            ranks = [r for r in line.ranks if self.shows(r)]
            if len(ranks) == 1:
                prefix = self._prefix(hosts[ranks[0]], ranks[0], line.stream)
            elif ranks:
                prefix = self._shared_prefix(ranks, line.stream)
            else:
                continue
            data.append(prefix + frames.line_bytes(safe(line.text, self.color)) + b"\n")
        if data:
            self._write_out(b"".join(data))

    def _shared_prefix(self, ranks: Sequence[int], stream: str) -> bytes:
        tag = f"[ranks {rank_ranges(ranks, limit=SHARED_RANKS_CHARS)}]"
        mark = "!" if stream == protocol.STDERR else ""
        if self.color:
            tag = f"{_BOLD}{tag}{_RESET}"
            if mark:
                mark = f"{_RED}{mark}{_RESET}"
        return f"{tag}{mark} ".encode()

    def _write_out(self, data: bytes) -> None:
        try:
            self.out.write(data)
            self.out.flush()
        except BrokenPipeError:  # `zlaunch ... | head`: stop showing, keep the job's logs
            self.ranks = frozenset()
        if getattr(self.out, "broken", False):  # the same, seen by a background writer
            self.ranks = frozenset()

    def note(self, text: str, *, error: bool = False) -> None:
        """A message from zlaunch itself (stderr); what it quotes of a rank is escaped."""
        text = safe_block(text)
        if self.err_color:
            text = f"{_BOLD_RED if error else _DIM}{text}{_RESET}"
        try:
            self.err.write(f"zlaunch: {text}\n")
            self.err.flush()
        except (BrokenPipeError, ValueError):
            pass

    def failure_report(self, report: FailureReport) -> None:
        """The torchelastic-style summary: every failed rank, the root cause marked."""
        self._write_err(format_failure(report, color=self.err_color))

    def _write_err(self, text: str) -> None:
        try:
            self.err.write(text)
            self.err.flush()
        except (BrokenPipeError, ValueError):
            pass


def _exit_text(failure: Failure) -> str:
    if failure.signal:
        return f"signal {failure.signal_name} (exit code {failure.exit_code})"
    return f"exit code {failure.exit_code}"


REPORT_LIST_CHARS = 60
"""A rank, pid or host list in the failure report longer than this is cut, with its count
(failure.json keeps every one)."""
REPORT_STACK_GROUPS = 8
"""Stack groups the failure report shows, largest first (`zlaunch stacks` shows them all)."""


def format_failure(report: FailureReport, *, color: bool = False) -> str:
    red, bold, reset = (_BOLD_RED, "\x1b[1m", _RESET) if color else ("", "", "")
    rule = "=" * 72
    out = [
        rule,
        f"{red}zlaunch: job {report.run_id} failed{reset}",
        f"  {report.summary}".rstrip(),
        "Root cause (first failure):",
    ]
    for index, failure in enumerate(report.failures or (report.root_cause,)):
        if index == 1:
            out.append("Other failures:")
        rank = _ranks_text(failure.rank)
        host = _hosts_text(failure.host)
        out.append(f"  [{index}] {bold}host {host}  rank {rank}{reset}")
        out.append(f"      local_rank: {failure.local_rank}")
        out.append(f"      pid       : {_pids_text(failure.pid)}")
        out.append(f"      exit      : {_exit_text(failure)}")
        if failure.time:
            out.append(f"      time      : {failure.time}")
        # what a rank wrote (its last lines, what its records and stacks say): escaped
        if failure.message:
            out.append(f"      message   : {safe_block(failure.message)}")
        if failure.hang:  # a hang: where every rank stands (zlaunch/launcher/hang.py)
            out.extend(map(safe, format_hang(failure, max_groups=REPORT_STACK_GROUPS)))
        if failure.last_lines:
            out.append(f"      last {len(failure.last_lines)} lines of rank {rank} output:")
            out.extend(f"        | {safe(line, color)}" for line in failure.last_lines)
    if report.stopped_ranks:
        out.append(f"Stopped by zlaunch: ranks {rank_ranges(report.stopped_ranks, limit=200)}")
    if report.log_dir:
        out.append(f"Logs: {report.log_dir}")
    out.append(rule)
    return "\n".join(out) + "\n"


def _ranks_text(value: object) -> str:
    """A failure's rank: one, several (a hang's suspects, as ranges) or "all"."""
    if isinstance(value, list):
        return rank_ranges(value, limit=REPORT_LIST_CHARS)
    return str(value)


def _pids_text(value: object) -> str:
    """A failure's pid, or its suspects' pids: the first few and how many."""
    if not isinstance(value, list):
        return str(value)
    shown = ", ".join(map(str, value[:8]))
    return shown if len(value) <= 8 else f"{shown}, ... ({len(value)} pids)"


def _hosts_text(hosts: str) -> str:
    """A failure's host: one, or a hang's ("n1, n2, ...")."""
    return _hosts_words(hosts.split(", "))


def _hosts_words(hosts: Sequence[str]) -> str:
    """A few hosts by name, more as a hostlist ("node[000-127]"), cut with its count."""
    if len(hosts) <= 4:
        return ", ".join(hosts)
    return host_ranges(hosts, limit=REPORT_LIST_CHARS)


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *, color: bool | None = None
) -> None:
    """A table on stdout: rich on a TTY, plain aligned text otherwise."""
    if color_enabled(sys.stdout, color):
        from rich.console import Console as RichConsole
        from rich.table import Table

        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        RichConsole().print(table)
        return
    widths = [max([len(str(c)), *(len(str(r[i])) for r in rows)]) for i, c in enumerate(columns)]
    print(title)
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def format_hang(failure: Failure, max_groups: int | None = None) -> list[str]:
    """Lines for the console's failure report: the stack groups (the ``max_groups`` largest;
    all when None), the collective groups, the silent ranks. Rank and host lists are ranges
    ("ranks 0-1019 (node[000-127])"), cut with their count when long."""
    hang = failure.hang or {}
    out = []
    groups = hang.get("stack_groups", [])
    shown = groups if max_groups is None else groups[:max_groups]
    for group in shown:
        ranks = rank_ranges(group["ranks"], limit=REPORT_LIST_CHARS)
        out.append(f"      ranks {ranks} ({_hosts_words(group['hosts'])}):")
        main = next((t for t in group["threads"] if t["thread"] == "main"), None)
        for frame in (main or {"frames": []})["frames"][:6]:
            out.append(f"        {frame}")
    if len(groups) > len(shown):
        rest = [r for group in groups[len(shown) :] for r in group["ranks"]]
        out.append(
            f"      ... {len(groups) - len(shown)} more stack groups, ranks "
            f"{rank_ranges(rest, limit=REPORT_LIST_CHARS)} (`zlaunch stacks` shows them all)"
        )
    for group in hang.get("collective_groups", []):  # each rank's last collectives
        ranks = rank_ranges(group["ranks"], limit=REPORT_LIST_CHARS)
        out.append(f"      collectives of ranks {ranks} (last first):")
        for rec in reversed(group["records"][-4:]):
            state = "waiting" if rec["state"] == "issued" else "completed"
            out.append(
                f"        {rec['op']} #{rec['seq']} group {rec['group']} {rec['sizes']} {state}"
            )
    if hang.get("no_dump"):
        out.append(
            f"      no stacks from rank(s) {rank_ranges(hang['no_dump'], limit=REPORT_LIST_CHARS)}"
            " (stopped, or stuck outside Python)"
        )
    return out
