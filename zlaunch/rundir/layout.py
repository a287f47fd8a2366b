"""The run directory: what a job leaves on disk, and how to read it back.

Layout (``<log_dir>`` defaults to ``./zlaunch_runs``)::

    <log_dir>/<run-id>/run.json                   plan, config, status, exit code, times, hosts
    <log_dir>/<run-id>/attempt-<n>/<host>/rank-<r>.log   every line of rank r, stdout and stderr
    <log_dir>/<run-id>/failure.json               root cause and every failed rank
    <log_dir>/<run-id>/metrics.jsonl              one JSON row per "metrics" event of a worker
    <log_dir>/<run-id>/ranks.json                 per rank: host, pid, alive, exit or lost, last step
    <log_dir>/<run-id>/controller.lock            locked by the live controller (fcntl)
    <log_dir>/latest -> <run-id>

The directory and everything in it is private to the user (0700 folders, 0600 files): rank
logs hold whatever the workers print. Environment values are recorded only for an allow-list
of names (zlaunch/text/redact.py), secret-looking arguments are redacted.

Rank logs hold the raw lines (no prefix), stdout and stderr in the order they arrived, and are
never filtered by ``--ranks``. Run ids sort by start time. ``run.json`` is rewritten atomically
on every status change, so a reader never sees half a file.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from zlaunch.job import Plan, new_run_id
from zlaunch.rundir.records import FailureReport, RanksFile, RunStatus
from zlaunch.rundir.root import (
    make_private_dir,
    open_log_root,
    open_private_file,
    read_json_at,
    temp_name,
    write_json_atomic,
)
from zlaunch.rundir.run_record import RunRecordError, checked_run_record, writable_run_record
from zlaunch.text import recorded_env_value, redact_argv

__all__ = [
    "RunDir",
    "process_identity",
    "lock_holder",
    "RunStatus",
    "new_run_id",
    "find_run",
    "list_runs",
    "run_paths",
    "host_dirname",
    "plan_record",
]

RUN_FILE = "run.json"
FAILURE_FILE = "failure.json"
METRICS_FILE = "metrics.jsonl"
RANKS_FILE = "ranks.json"
COLLECTIVES_FILE = "collectives.json"  # each rank's last collectives, as its agent last sent
LATEST = "latest"
CONTROLLER_LOCK = "controller.lock"
MAX_RUN_FILE_BYTES = 64 * 1024 * 1024  # a plan of 100,000 ranks is far below this
# struct flock on Linux (x86-64, arm64): l_type, l_whence, l_start, l_len, l_pid, padding.
_FLOCK = "hhqqi4x"


def host_dirname(host: str) -> str:
    """A host name as a directory name (IPv6 colons and odd characters become '_')."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", host) or "_"


def plan_record(plan: Plan) -> dict[str, Any]:
    """The plan as JSON for run.json: env names, and values only where allow-listed."""
    # Ranks share most of their environment and their argv: each distinct one is redacted
    # once (the regular expressions per rank were most of a 16,384-rank job's start).
    values: dict[tuple[str, str], str] = {}
    argvs: dict[tuple[str, ...], list[str]] = {}

    def value(name: str, text: str) -> str:
        key = (name, text)
        if key not in values:
            values[key] = recorded_env_value(name, text)
        return values[key]

    def argv(args: tuple[str, ...]) -> list[str]:
        if args not in argvs:
            argvs[args] = redact_argv(args)
        return list(argvs[args])

    return {
        "run_id": plan.run_id,
        "attempt": plan.attempt,
        "world_size": plan.world_size,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "nodes": [
            {
                "node_rank": node.node_rank,
                "host": node.host.name,
                "slots": list(node.host.slots),
                "cwd": node.cwd,
                "workers": [
                    {
                        "rank": w.rank,
                        "local_rank": w.local_rank,
                        "slot": w.slot,
                        "argv": argv(tuple(w.argv)),
                        "env": {k: value(k, v) for k, v in sorted(w.env.items())},
                    }
                    for w in node.workers
                ],
            }
            for node in plan.nodes
        ],
    }


def process_identity(pid: int) -> dict[str, Any] | None:
    """What tells this process from a later one with the same pid: its start time (clock
    ticks since boot) and the boot it started in. None when there is no such live process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot_id = handle.read().strip()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return {"pid": pid, "start_ticks": int(fields[19]), "boot_id": boot_id}


def _hold_controller_lock(dir_fd: int, name: str) -> int:
    """Lock ``path`` for as long as this process lives (never closed: closing would unlock).

    A POSIX lock, because F_GETLK tells another process who holds it. It also drops when this
    process closes *any* descriptor of the file: nothing in the controller opens it again.
    """
    fd = open_private_file(dir_fd, name, os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def lock_holder(run_path: str) -> int | None:
    """The pid that holds the run's controller lock: the live controller, or None."""
    try:
        fd = os.open(os.path.join(run_path, CONTROLLER_LOCK), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return None
    finally:
        os.close(fd)
    kind, _, _, _, pid = struct.unpack(_FLOCK, answer)
    return pid if kind != fcntl.F_UNLCK and pid > 0 else None


@dataclass
class RunDir:
    """One run's directory. The controller writes it; ``zlaunch logs/status/stop`` read it."""

    path: str
    run_id: str
    _lock_fd: int | None = None
    _dir_fd: int | None = None
    """The writer's hold on the directory: every file is opened relative to it."""
    problems: list[str] = field(default_factory=list)
    """What the last read of run.json found wrong (fields left out)."""

    # ---- writing (controller) -----------------------------------------------------------

    @classmethod
    def create(cls, log_dir: str, run_id: str, record: dict[str, Any]) -> RunDir:
        root = os.path.abspath(log_dir)
        root_fd = open_log_root(root)  # the user's own, or LogRootError (zlaunch/rundir/root.py)
        try:
            run = cls(os.path.join(root, run_id), run_id, None, make_private_dir(root_fd, run_id))
            # `zlaunch stop` and `stacks` signal only the process that holds this lock and
            # matches the identity recorded below: never a process that merely reuses the pid.
            run._lock_fd = _hold_controller_lock(run._fd(), CONTROLLER_LOCK)
            run.write_record(
                {
                    "run_id": run_id,
                    "status": RunStatus.STARTING,
                    "controller_pid": os.getpid(),
                    "controller": process_identity(os.getpid()),
                    "start_time": time.time(),
                    "end_time": None,
                    "exit_code": None,
                    **record,
                }
            )
            _point_latest(root_fd, run_id)
        finally:
            os.close(root_fd)
        return run

    def _fd(self) -> int:
        """The directory's descriptor (opened once, never through a link)."""
        if self._dir_fd is None:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            self._dir_fd = os.open(self.path, flags)
        return self._dir_fd

    def write_record(self, record: dict[str, Any]) -> None:
        """run.json, rewritten atomically; only fields its readers know (run_record.py)."""
        write_json_atomic(self._fd(), RUN_FILE, writable_run_record(record))

    def update(self, **fields: Any) -> dict[str, Any]:
        record = self.record()
        record.update(fields)
        self.write_record(record)
        return record

    def rank_log_path(self, attempt: int, host: str, rank: int) -> str:
        return os.path.join(self.path, f"attempt-{attempt}", host_dirname(host), f"rank-{rank}.log")

    def open_rank_log(self, attempt: int, host: str, rank: int) -> IO[bytes]:
        attempt_fd = make_private_dir(self._fd(), f"attempt-{attempt}", exist_ok=True)
        try:
            host_fd = make_private_dir(attempt_fd, host_dirname(host), exist_ok=True)
        finally:
            os.close(attempt_fd)
        try:
            fd = open_private_file(host_fd, f"rank-{rank}.log", os.O_WRONLY | os.O_APPEND)
        finally:
            os.close(host_fd)
        # Unbuffered: each batch of lines reaches the file at once, so `zlaunch logs --follow`
        # in another terminal sees it within its poll interval.
        return open(fd, "ab", buffering=0)

    def write_failure(self, report: FailureReport) -> None:
        write_json_atomic(self._fd(), FAILURE_FILE, report.to_json())

    def open_metrics(self) -> IO[str]:
        fd = open_private_file(self._fd(), METRICS_FILE, os.O_WRONLY | os.O_APPEND)
        return open(fd, "a", encoding="utf-8")

    def write_ranks(self, ranks: RanksFile) -> None:
        """Every rank's current state (read by `zlaunch status`); rewritten atomically."""
        write_json_atomic(self._fd(), RANKS_FILE, ranks.to_json(), levels=2)  # a rank a line

    def write_collectives(self, by_rank: dict[int, Any]) -> None:
        data = {str(rank): value for rank, value in sorted(by_rank.items())}
        write_json_atomic(self._fd(), COLLECTIVES_FILE, data)

    # ---- reading (any process) ----------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """run.json. The writer reads back its own; a reader gets it checked field by field
        (zlaunch/rundir/run_record.py: bad fields left out and listed in ``problems``), and
        RunRecordError (a ValueError) for a file that is not a run's record."""
        if self._dir_fd is not None:  # the writer reads back through its own hold
            return read_json_at(self._dir_fd, RUN_FILE)
        data = _read_json_file(os.path.join(self.path, RUN_FILE), MAX_RUN_FILE_BYTES)
        record, self.problems = checked_run_record(data, self.run_id)
        return record

    def collectives(self) -> dict[int, Any]:
        """Rank -> {"records": [...], "received": unix time} (`zlaunch stacks` reads it)."""
        data = self._read_json(COLLECTIVES_FILE)
        if not isinstance(data, dict):
            return {}
        return {int(k): v for k, v in data.items() if k.isdigit() and isinstance(v, dict)}

    def ranks(self) -> RanksFile | None:
        data = self._read_json(RANKS_FILE)
        return RanksFile.from_json(data) if isinstance(data, dict) else None

    def failure(self) -> FailureReport | None:
        data = self._read_json(FAILURE_FILE)
        return FailureReport.from_json(data) if isinstance(data, dict) else None

    def _read_json(self, name: str) -> Any:
        try:
            with open(os.path.join(self.path, name), encoding="utf-8") as handle:
                return json.load(handle)
        except FileNotFoundError:
            return None

    def metrics(self) -> Iterable[dict[str, Any]]:
        try:
            with open(os.path.join(self.path, METRICS_FILE), encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        yield json.loads(line)
        except FileNotFoundError:
            return

    def rank_logs(self, attempt: int | None = None) -> dict[int, str]:
        """rank -> log path, for the given attempt (default: the latest one)."""
        attempts = sorted(
            int(name.split("-", 1)[1])
            for name in os.listdir(self.path)
            if name.startswith("attempt-") and name.split("-", 1)[1].isdigit()
        )
        if not attempts:
            return {}
        chosen = attempts[-1] if attempt is None else attempt
        root = os.path.join(self.path, f"attempt-{chosen}")
        logs: dict[int, str] = {}
        for host in sorted(os.listdir(root)):
            for name in os.listdir(os.path.join(root, host)):
                match = re.fullmatch(r"rank-(\d+)\.log", name)
                if match:
                    logs[int(match.group(1))] = os.path.join(root, host, name)
        return dict(sorted(logs.items()))


def _read_json_file(path: str, limit: int) -> Any:
    """A JSON file a reader did not write: a regular file (a FIFO in its place would block),
    at most ``limit`` bytes, nested no deeper than the parser's stack allows. OSError or
    RunRecordError (a ValueError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RunRecordError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise RunRecordError(f"{path} is {info.st_size} bytes (more than {limit})")
        raw = handle.read(info.st_size + 1)  # read(n) allocates n bytes up front
    try:
        return json.loads(raw)
    except RecursionError:
        raise RunRecordError(f"{path}: nested too deeply") from None
    except ValueError as err:
        raise RunRecordError(f"{path}: not JSON ({err})") from None


def _point_latest(root_fd: int, run_id: str) -> None:
    tmp = temp_name(LATEST)
    try:
        os.symlink(run_id, tmp, dir_fd=root_fd)
        os.replace(tmp, LATEST, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    except OSError:  # file systems without symlinks: find_run falls back to sorting ids
        try:
            os.unlink(tmp, dir_fd=root_fd)
        except OSError:
            pass


def find_run(log_dir: str, run_id: str | None = None) -> RunDir:
    """The run with this id (or unique id prefix), or the latest one. FileNotFoundError if none."""
    log_dir = os.path.abspath(log_dir)
    if run_id is None:
        link = os.path.join(log_dir, LATEST)
        try:
            target = os.readlink(link)  # another run may replace the link meanwhile
        except OSError:
            target = None
        if target is not None and os.path.isfile(os.path.join(log_dir, target, RUN_FILE)):
            return RunDir(os.path.join(log_dir, target), os.path.basename(target))
        ids = _run_ids(log_dir)
        if not ids:
            raise FileNotFoundError(f"no runs in {log_dir}")
        return RunDir(os.path.join(log_dir, ids[-1]), ids[-1])
    ids = [i for i in _run_ids(log_dir) if i == run_id] or [
        i for i in _run_ids(log_dir) if i.startswith(run_id)
    ]
    if len(ids) != 1:
        what = "no run" if not ids else f"{len(ids)} runs"
        raise FileNotFoundError(f"{what} matching {run_id!r} in {log_dir}")
    return RunDir(os.path.join(log_dir, ids[0]), ids[0])


def _run_ids(log_dir: str) -> list[str]:
    try:
        names = os.listdir(log_dir)
    except OSError:  # missing, unreadable right now, not a directory: no runs to show
        return []
    return sorted(
        n for n in names if n != LATEST and os.path.isfile(os.path.join(log_dir, n, RUN_FILE))
    )


def run_paths(log_dir: str) -> list[str]:
    """The directory of every run under log_dir, by directory name (what run.json says of
    itself does not choose a path)."""
    root = os.path.abspath(log_dir)
    return [os.path.join(root, run_id) for run_id in _run_ids(log_dir)]


def list_runs(log_dir: str) -> list[dict[str, Any]]:
    """The run.json of every run under log_dir, oldest first (unreadable ones skipped)."""
    runs = []
    for path in run_paths(log_dir):
        try:
            runs.append(RunDir(path, os.path.basename(path)).record())
        except (OSError, ValueError):
            continue
    return runs
