"""A rank for scale runs: imports no torch, prints a known amount of known output, one line at a
time (flushed), so every rank's log can be checked byte for byte against ``expected_log``.

    python worker.py --records DIR [--lines N] [--line-bytes B] [--hold] [--fail-rank R]
                     [--rank R] [--tag T]

The rank is ``--rank`` or ``$RANK`` (zlaunch and DeepSpeed set it). Before its first line the
worker writes the time into ``DIR/start-<rank>`` (the log itself stays deterministic). Without
``--hold`` it exits 0 after its lines. With ``--hold`` it writes ``DIR/ready-<rank>`` and waits;
``--fail-rank R``: rank R waits for the file ``DIR/go``, writes the time into ``DIR/fail-<R>`` and
exits 3; every other rank sleeps until it is stopped. ``--tag`` is only carried on the command
line (to find the processes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
FAIL_CODE = 3


def line(rank: int, index: int, size: int) -> bytes:
    """Line ``index`` of ``rank``: ``size`` bytes with its newline, different for every rank and
    line (a merged, cut or misplaced line shows)."""
    head = f"rank {rank} line {index:06d} "
    shift = (rank * 7 + index) % len(ALPHABET)
    body = (ALPHABET[shift:] + ALPHABET[:shift]) * (size // len(ALPHABET) + 1)
    return (head + body)[: max(size - 1, len(head))].encode() + b"\n"


def expected_log(rank: int, lines: int, size: int) -> bytes:
    return b"".join(line(rank, i, size) for i in range(lines))


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True)
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument("--line-bytes", type=int, default=100)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--tag", default="")
    args, _ = parser.parse_known_args(argv)  # DeepSpeed adds --local_rank=N
    rank = args.rank if args.rank is not None else int(os.environ["RANK"])
    _write(os.path.join(args.records, f"start-{rank}"), repr(time.time()))
    out = sys.stdout.buffer
    for index in range(args.lines):
        out.write(line(rank, index, args.line_bytes))
        out.flush()
    if not args.hold:
        return 0
    _write(os.path.join(args.records, f"ready-{rank}"), repr(time.time()))
    if rank == args.fail_rank:
        go = os.path.join(args.records, "go")
        while not os.path.exists(go):
            time.sleep(0.05)
        _write(os.path.join(args.records, f"fail-{rank}"), repr(time.time()))
        return FAIL_CODE
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
