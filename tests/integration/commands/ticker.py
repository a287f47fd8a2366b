"""A worker that prints timestamped lines, for log-following tests (no torch).

``python ticker.py --count N --interval S [--go-file PATH] [--hang]``: every rank prints N
lines ``rank=R seq=K t=<unix time>``, alternating stdout and stderr, flushing each one, one every
S seconds; then exits 0, or with ``--hang`` sleeps until it is killed. With ``--go-file`` the
lines after the first wait until PATH exists (a test's signal that its reader is live).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--go-file")
    args = p.parse_args()
    rank = os.environ.get("RANK", "?")
    for seq in range(args.count):
        stream = sys.stdout if seq % 2 == 0 else sys.stderr
        stream.write(f"rank={rank} seq={seq} t={time.time():.6f}\n")
        stream.flush()
        time.sleep(args.interval)
        while seq == 0 and args.go_file and not os.path.exists(args.go_file):
            time.sleep(0.01)
    if args.hang:
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
