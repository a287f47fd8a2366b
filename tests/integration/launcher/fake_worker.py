"""A fake training worker for launcher tests.

Run as ``python fake_worker.py --record-dir DIR [mode flags]``. It always first writes
``DIR/rank-<RANK>.json`` (atomically: temp file, fsync, rename) holding its full environment,
argv, pid, ppid, pgid, sid, hostname and cwd, so a test can assert exactly what the launcher gave
each rank. Then, in this order:

``--lines N``      print N numbered lines fast, even ones to stdout and odd ones to stderr, each
                   ``rank=R seq=NNNNNN stream=out|err payload`` (see :func:`line`), so tests can
                   check order and integrity per stream;
``--allreduce``    init gloo from the env (``env://``), all_reduce ``rank + 1`` and rewrite the
                   record with ``"allreduce": <sum>``;
``--delay S``      sleep S seconds before the mode acts;
then the mode: ``--exit CODE`` | ``--signal NAME`` (kill itself with it) | ``--hang`` (sleep
forever; with ``--ignore-sigterm`` it survives SIGTERM and appends a line to
``DIR/rank-<RANK>.sigterm`` each time one arrives) | nothing (exit 0).

``--only-rank R`` applies the mode to rank R alone; the other ranks exit 0 (``--others exit0``,
the default) or hang (``--others hang``, honouring ``--ignore-sigterm``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import sys
import time

__all__ = ["line", "main", "record_path"]


def record_path(record_dir: str, rank: str | int) -> str:
    return os.path.join(record_dir, f"rank-{rank}.json")


def line(rank: str | int, seq: int) -> str:
    """The ``seq``-th output line of ``rank`` (without newline); tests rebuild it to compare."""
    stream = "out" if seq % 2 == 0 else "err"
    payload = hashlib.sha256(f"{rank}:{seq}".encode()).hexdigest()[:32]
    return f"rank={rank} seq={seq:06d} stream={stream} {payload}"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    # No abbreviations: launchers append their own flags (``--local_rank=N``), never ours.
    p = argparse.ArgumentParser(
        description="fake training worker for launcher tests", allow_abbrev=False
    )
    p.add_argument("--record-dir", required=True, help="where rank-<RANK>.json is written")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--exit", type=int, metavar="CODE", help="exit with CODE")
    mode.add_argument(
        "--signal", metavar="NAME", help="kill itself with signal NAME (TERM, SIGKILL, 9)"
    )
    mode.add_argument("--hang", action="store_true", help="sleep forever")
    p.add_argument("--ignore-sigterm", action="store_true", help="with a hang: survive SIGTERM")
    p.add_argument("--lines", type=int, default=0, metavar="N", help="print N numbered lines")
    p.add_argument("--only-rank", type=int, metavar="R", help="apply the mode on rank R only")
    p.add_argument("--others", choices=("exit0", "hang"), default="exit0")
    p.add_argument("--delay", type=float, default=0.0, metavar="S", help="wait S s before the mode")
    p.add_argument("--allreduce", action="store_true", help="gloo all_reduce of rank+1")
    args, extra = p.parse_known_args(argv)
    args.extra = extra  # launchers append their own arguments; record them, ignore them
    return args


def _signal_number(name: str) -> int:
    if name.isdigit():
        return int(name)
    name = name.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(getattr(signal.Signals, name))
    except AttributeError:
        sys.exit(f"fake_worker: unknown signal {name!r}")


def _write_record(path: str, record: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _print_lines(rank: str, count: int) -> None:
    for seq in range(count):
        stream = sys.stdout if seq % 2 == 0 else sys.stderr
        stream.write(line(rank, seq) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()


def _allreduce() -> int:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        return int(value.item())
    finally:
        dist.destroy_process_group()


def _ignore_sigterm(record_dir: str, rank: str) -> None:
    marker = os.path.join(record_dir, f"rank-{rank}.sigterm")

    def note(signum: int, frame: object) -> None:
        with open(marker, "a") as f:
            f.write(f"SIGTERM at {time.time():.3f}\n")
        print(f"rank={rank} ignoring SIGTERM", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, note)


def _hang() -> None:
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank = os.environ.get("RANK", "0")
    os.makedirs(args.record_dir, exist_ok=True)
    path = record_path(args.record_dir, rank)
    acting = args.only_rank is None or str(args.only_rank) == rank
    hangs = args.hang if acting else args.others == "hang"
    if hangs and args.ignore_sigterm:
        # Before the record: once a test sees the record, SIGTERM is already ignored.
        _ignore_sigterm(args.record_dir, rank)
    record = {
        "rank": rank,
        "env": dict(os.environ),
        "argv": sys.argv,
        "extra_args": args.extra,
        "executable": sys.executable,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "hostname": socket.gethostname(),
        "cwd": os.getcwd(),
        "started_at": time.time(),
        "allreduce": None,
    }
    _write_record(path, record)

    if args.lines:
        _print_lines(rank, args.lines)
    if args.allreduce:
        record["allreduce"] = _allreduce()
        _write_record(path, record)

    if args.delay:
        time.sleep(args.delay)
    if not acting:
        if args.others == "hang":
            _hang()
        return 0
    if args.exit is not None:
        return args.exit
    if args.signal:
        signum = _signal_number(args.signal)
        sys.stdout.flush()
        sys.stderr.flush()
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught anyway
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(10)  # a signal whose default action is not to terminate
        return 125
    if args.hang:
        _hang()
    return 0


if __name__ == "__main__":
    sys.exit(main())
