"""What collapsing identical lines costs the controller per rank line (zlaunch/console/collapse.py).

Feeds the controller's output path (``RankOutput.lines``: log write, tail, progress, noise,
console) the lines of many ranks, in process, with collapsing off and on alternately (off, on,
off, on, ...: load on the host hits both alike), and prints the best time per line of each,
the ratio on/off and how many console lines each wrote::

    python benchmarks/collapse_overhead.py [--ranks 1024] [--lines 20] [--shared 4] [--repeats 5]

Every rank writes ``--lines`` lines, one per frame (the controller's worst case: frames of
one line); every ``--shared``-th of them is the same text on every rank (an import warning),
the rest are each rank's own. The rank logs are a sink that keeps nothing and the console a
buffer in memory, so the numbers are the controller's own cost, not a disk's or a terminal's.
"""

from __future__ import annotations

import argparse
import io
import time

from zlaunch.console.job_view import JobView
from zlaunch.console.terminal import Console
from zlaunch.launcher.rank_output import RankOutput
from zlaunch.wire import protocol


class _Discard:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def once(collapse: bool, ranks: int, lines: int, shared: int) -> tuple[float, int, int]:
    """(seconds, rank lines fed, console lines written) of one pass."""
    out = io.BytesIO()
    console = Console(color=False, out=out, err=io.StringIO())
    output = RankOutput(console, JobView(console), collapse)
    for rank in range(ranks):
        output.add_rank(rank, f"node{rank // 8:03d}", _Discard())
    frames = []
    for i in range(lines):
        for rank in range(ranks):
            if i % shared == 0:
                frames.append((rank, protocol.STDERR, [f"UserWarning: the same words {i}"]))
            else:
                frames.append((rank, protocol.STDOUT, [f"rank {rank} line {i} loss 1.{rank}{i}"]))
    start = time.perf_counter()
    for rank, stream, text in frames:
        output.lines(rank, stream, text, False)
        output.tick(time.monotonic())
    output.close()
    return time.perf_counter() - start, len(frames), out.getvalue().count(b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--shared", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    best: dict[bool, float] = {}
    shown: dict[bool, int] = {}
    fed = 0
    for _ in range(args.repeats):
        for collapse in (False, True):
            seconds, fed, shown[collapse] = once(collapse, args.ranks, args.lines, args.shared)
            best[collapse] = min(best.get(collapse, seconds), seconds)
    off, on = best[False] * 1e6 / fed, best[True] * 1e6 / fed
    print(f"{args.ranks} ranks, {fed} rank lines (every {args.shared}th the same on every rank)")
    print(f"  collapse off: {off:.1f} us/line, {shown[False]} console lines")
    print(f"  collapse on : {on:.1f} us/line, {shown[True]} console lines")
    print(f"  ratio on/off: {on / off:.2f}")


if __name__ == "__main__":
    main()
