"""Run the Slurm test cluster by hand (root; from the repository root).

    python -m tests.cluster.slurm serve [-n 3]    start one, print how to use it, run until Ctrl-C/SIGTERM
    python -m tests.cluster.slurm down            remove leftovers of clusters whose owner died

While ``serve`` runs, in another terminal::

    export SLURM_CONF=<printed path>
    srun -N3 hostname
    salloc -N3 --ntasks-per-node=2 zlaunch examples/train_gpt.py --config examples/configs/zero2.json
"""

from __future__ import annotations

import argparse
import signal
import sys

from tests.cluster import reap_stale as reap_namespaces

from .cluster import SlurmCluster, reap_stale, unavailable_reason


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.slurm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a cluster in the foreground")
    serve.add_argument("-n", type=int, default=3, help="nodes (default 3)")
    sub.add_parser("down", help="remove leftovers of dead owners")
    args = parser.parse_args(argv)
    if args.command == "down":
        killed = reap_stale()
        gone = reap_namespaces()
        print(f"killed {len(killed)} daemon(s); removed {len(gone)} cluster(s): {' '.join(gone)}")
        return 0
    reason = unavailable_reason()
    if reason:
        print(f"cannot start: {reason}", file=sys.stderr)
        return 2
    stop: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: stop.append(signum))
    with SlurmCluster.start(n=args.n) as c:
        print(f"Slurm cluster {c.net.prefix}: nodes {', '.join(c.hosts)}, partition {c.partition}")
        print(f"  export SLURM_CONF={c.conf}")
        print(f"  ssh config (zlaunch --ssh-config): {c.net.ssh_config}")
        print("  Ctrl-C stops it and removes everything", flush=True)
        while not stop:
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
