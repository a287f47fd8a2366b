"""A worker with a tqdm-style bar (no tqdm needed): ``\\r NN%|###   | i/N`` redrawn on stderr.

``python bar.py [--steps N] [--interval S]``: prints ``rank R starting``, redraws the bar N
times one every S seconds, ends it with a newline, prints ``rank R done``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--interval", type=float, default=0.1)
    args = p.parse_args()
    rank = os.environ.get("RANK", "0")
    print(f"rank {rank} starting", flush=True)
    for i in range(args.steps + 1):
        pct = 100 * i // args.steps
        sys.stderr.write(f"\r{pct:3d}%|{'#' * (10 * i // args.steps):<10}| {i}/{args.steps}")
        sys.stderr.flush()
        time.sleep(args.interval)
    sys.stderr.write("\n")
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
