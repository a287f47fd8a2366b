"""``zlaunch logs``: any rank's output from the run directory, while the job runs or after.

Lines are printed as ``[host:rank] line``. Without ``--follow`` every selected rank's log is
printed, rank after rank. With ``--follow`` the files are polled every 0.1 s and new complete
lines are printed as they arrive (files of ranks that start later are picked up, a restart's
new attempt is followed); the command exits by itself once the run has ended and every file
is drained, or on Ctrl-C. A progress bar shows its latest state now and then while it is
redrawn and ends at its final state on its own line, as on the console, also when the script
wrote another line on the bar's stream before ending it (commands/followed_log.py).
"""

from __future__ import annotations

import collections
import os
import re
import sys
import time
from typing import IO

import click

from zlaunch.commands.followed_log import FollowedLog
from zlaunch.commands.runs_common import open_run, run_ended, run_options
from zlaunch.console import shown
from zlaunch.errors import UsageError
from zlaunch.rundir import RunDir, host_dirname
from zlaunch.wire import line_bytes, line_text

__all__ = ["command", "parse_ranks"]

POLL_INTERVAL = 0.1
READ_SIZE = 1 << 20
ENDED_POLLS = 3
FOLLOW_BAR_INTERVAL = 2.0
"""A progress bar still being redrawn is shown by `--follow` at most this often per rank."""


def parse_ranks(values: tuple[str, ...]) -> frozenset[int] | None:
    """``--rank 3 --rank 0,4-5`` -> {0, 3, 4, 5}; nothing given -> None (every rank)."""
    ranks: set[int] = set()
    for value in values:
        for part in value.split(","):
            part = part.strip()
            match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if not match:
                raise UsageError(f"--rank {value!r}: expected a rank, a list or a range like 0,3-5")
            low = int(match.group(1))
            high = int(match.group(2) or low)
            if high < low:
                raise UsageError(f"--rank {value!r}: empty range {low}-{high}")
            ranks.update(range(low, high + 1))
    return frozenset(ranks) if values else None


def _attempts(run: RunDir) -> list[int]:
    try:
        names = os.listdir(run.path)
    except FileNotFoundError:
        return []
    return sorted(
        int(n.split("-", 1)[1])
        for n in names
        if n.startswith("attempt-") and n.split("-", 1)[1].isdigit()
    )


class _Selection:
    def __init__(self, ranks: frozenset[int] | None, host: str | None):
        self.ranks = ranks
        self.host = host_dirname(host) if host else None

    def files(self, run: RunDir, attempt: int | None) -> list[tuple[int, str, str]]:
        """(rank, host dir, path) of the selected ranks' logs in that attempt (latest: None)."""
        if attempt is None and not _attempts(run):
            return []
        out = []
        for rank, path in run.rank_logs(attempt).items():
            host = os.path.basename(os.path.dirname(path))
            if self.ranks is not None and rank not in self.ranks:
                continue
            if self.host is not None and host != self.host:
                continue
            out.append((rank, host, path))
        return out


def _visible(line: bytes) -> bytes:
    """What a terminal shows of a line redrawn with carriage returns (tqdm): its last state.
    The rank log keeps every byte; this is the readable view."""
    if b"\r" not in line:
        return line
    segments = [segment for segment in line.split(b"\r") if segment.strip()]
    return segments[-1] if segments else b""


class _Printer:
    def __init__(self, out: IO[bytes], pattern: re.Pattern[bytes] | None):
        self.out = out
        self.pattern = pattern

    def lines(self, host: str, rank: int, lines: list[bytes]) -> None:
        prefix = f"[{host}:{rank}] ".encode()
        lines = [_visible(ln) for ln in lines]  # a progress bar's line: its final state
        keep = [ln for ln in lines if self.pattern is None or self.pattern.search(ln)]
        if keep:  # control characters escaped, as on the job's console (the log has the bytes)
            keep = [line_bytes(shown(line_text(ln))) for ln in keep]
            self.out.write(b"".join(prefix + ln + b"\n" for ln in keep))


def _print_all(files, printer: _Printer, tail: int | None) -> None:
    for rank, host, path in files:
        with open(path, "rb") as handle:
            if tail is None:
                for raw in handle:
                    printer.lines(host, rank, [raw.rstrip(b"\n")])
            else:
                kept = _filtered_tail(handle, printer.pattern, tail)
                printer.lines(host, rank, kept)


def _filtered_tail(handle: IO[bytes], pattern: re.Pattern[bytes] | None, n: int) -> list[bytes]:
    last: collections.deque[bytes] = collections.deque(maxlen=max(n, 0))
    for raw in handle:
        line = raw.rstrip(b"\n")
        if pattern is None or pattern.search(line):
            last.append(line)
    return list(last)


class _Follower:
    """Tails the selected rank files of one run; only complete lines are printed."""

    def __init__(self, run: RunDir, selection: _Selection, attempt: int | None, printer, tail):
        self.run = run
        self.selection = selection
        self.fixed_attempt = attempt
        self.printer = printer
        self.tail = tail
        self.current_attempt: int | None = None
        self.offsets: dict[str, int] = {}
        self.followed: dict[str, FollowedLog] = {}
        """path -> its unfinished line and progress bar (bars print on their own line)."""
        self.first_scan = True
        self.bar_shown: dict[str, tuple[float, bytes]] = {}
        """path -> (when, state) of the progress state last printed for its unfinished line."""

    def poll(self, final: bool = False) -> None:
        attempts = _attempts(self.run)
        attempt = self.fixed_attempt
        if attempt is None and attempts:
            attempt = attempts[-1]
        if attempt is None or attempt not in attempts:
            return
        if attempt != self.current_attempt:
            if self.current_attempt is not None:
                self.poll_files(self.current_attempt, final=True)  # finish the old attempt
            self.current_attempt = attempt
        self.poll_files(attempt, final=final)
        self.first_scan = False

    def poll_files(self, attempt: int, final: bool) -> None:
        for rank, host, path in self.selection.files(self.run, attempt):
            if path not in self.offsets:
                self.offsets[path] = 0
                if self.first_scan and self.tail is not None:
                    self._skip_to_tail(path, host, rank)
            self._read(path, host, rank, final)
        self.printer.out.flush()

    def _skip_to_tail(self, path: str, host: str, rank: int) -> None:
        with open(path, "rb") as handle:
            data = handle.read()
        end = data.rfind(b"\n") + 1
        lines = data[:end].split(b"\n")[:-1]
        self.offsets[path] = end
        kept = [
            ln for ln in lines if self.printer.pattern is None or self.printer.pattern.search(ln)
        ]
        self.printer.lines(host, rank, kept[-self.tail :] if self.tail else [])

    def _read(self, path: str, host: str, rank: int, final: bool) -> None:
        log = self.followed.setdefault(path, FollowedLog())
        try:
            with open(path, "rb") as handle:
                handle.seek(self.offsets[path])
                data = handle.read(READ_SIZE)
                while data:
                    self.offsets[path] += len(data)
                    self.printer.lines(host, rank, log.feed(data))
                    data = handle.read(READ_SIZE)
        except FileNotFoundError:
            return
        if final:
            self.printer.lines(host, rank, log.finish())
            return
        state = log.state()
        if state is not None:  # a progress bar redrawing its line: its latest state, throttled
            when, shown = self.bar_shown.get(path, (0.0, b""))
            now = time.monotonic()
            if state and state != shown and now - when >= FOLLOW_BAR_INTERVAL:
                self.bar_shown[path] = (now, state)
                self.printer.lines(host, rank, [state])


@click.command("logs")
@run_options
@click.option("--rank", "-r", "ranks", multiple=True, help="Only these ranks: 3, 0,2 or 4-7.")
@click.option("--host", help="Only the ranks of this host.")
@click.option(
    "--follow", "-f", is_flag=True, help="Print new lines as they come, until the run ends."
)
@click.option("--tail", "-n", type=click.IntRange(0), help="Only the last N lines of each rank.")
@click.option("--grep", "pattern", help="Only lines matching this regular expression.")
@click.option("--attempt", type=click.IntRange(0), help="This attempt (default: the latest).")
def command(
    run: str | None,
    log_dir: str | None,
    ranks: tuple[str, ...],
    host: str | None,
    follow: bool,
    tail: int | None,
    pattern: str | None,
    attempt: int | None,
) -> None:
    """Print the output of ranks of RUN (default: the latest run), tagged [host:rank]."""
    rundir = open_run(log_dir, run, "logs")
    selection = _Selection(parse_ranks(ranks), host)
    compiled = None
    if pattern is not None:
        try:
            compiled = re.compile(pattern.encode("utf-8", "surrogateescape"))
        except re.error as err:
            raise UsageError(f"--grep {pattern!r}: {err}") from None
    if attempt is not None and attempt not in _attempts(rundir):
        raise UsageError(f"run {rundir.run_id} has no attempt {attempt}")
    printer = _Printer(sys.stdout.buffer, compiled)
    try:
        if not follow:
            files = selection.files(rundir, attempt)
            if not files and (ranks or host):
                raise UsageError(f"run {rundir.run_id}: no rank log matches the selection")
            _print_all(files, printer, tail)
            sys.stdout.buffer.flush()
            return
        follower = _Follower(rundir, selection, attempt, printer, tail)
        ended_polls = 0
        while True:
            ended = run_ended(rundir.record())
            follower.poll(final=ended)
            # Several looks in a row, so that a run directory caught mid-update is not
            # taken for an ended run.
            ended_polls = ended_polls + 1 if ended else 0
            if ended_polls >= ENDED_POLLS:
                return
            time.sleep(POLL_INTERVAL)
    except BrokenPipeError:  # `zlaunch logs | head`
        os._exit(0)
    except KeyboardInterrupt:
        return
