"""Manage test clusters from a shell (run from the repository root).

    python -m tests.cluster up [-n 3] [--json]   start one in the background, print how to use it
    python -m tests.cluster status [--json]      list clusters on this machine
    python -m tests.cluster down PREFIX [...]    stop the clusters named (and remove leftovers
                                                 of dead owners)
    python -m tests.cluster down --all           stop every background cluster on this machine
    python -m tests.cluster serve [-n 3]         run one in the foreground until Ctrl-C/SIGTERM

``up`` starts ``serve`` as a detached process that owns the cluster; ``down`` sends it SIGTERM,
which removes everything the cluster made.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from .cluster import Cluster, ClusterError
from .naming import owner_alive, owner_of, state_dir
from .netns import destroy, find_prefixes, reap_stale

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _info(prefix: str) -> dict:
    try:
        with open(os.path.join(state_dir(prefix), "cluster.json")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        info = {"prefix": prefix, "owner_pid": owner_of(prefix), "hosts": [], "detached": False}
    info["owner_alive"] = owner_alive(owner_of(prefix))
    return info


def _print_usage(info: dict) -> None:
    print(f"cluster {info['prefix']} (owner pid {info['owner_pid']})")
    for host in info["hosts"]:
        print(f"  {host:8s} {info['addresses'][host]:15s} netns {info['namespaces'][host]}")
    print(f"  ssh_config: {info['ssh_config']}")
    if info.get("hostfile"):
        print(f"  hostfile:   {info['hostfile']}")
        with open(info["hostfile"]) as f:
            for line in f.read().splitlines():
                print(f"      {line}")
    print(f"  try:  ssh -F {info['ssh_config']} {info['hosts'][0]} hostname")
    if info.get("hostfile"):
        print(
            f"        zlaunch --hostfile {info['hostfile']} --ssh-config {info['ssh_config']}"
            " examples/train_gpt.py --config examples/configs/zero2.json"
        )
    print(f"  stop: python -m tests.cluster down {info['prefix']}")


def serve(n: int, ready_file: str | None) -> int:
    stop = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: stop.append(signum))
    with Cluster.start(n=n, detached=True) as cluster:
        info = cluster.describe()
        info["hostfile"] = cluster.hostfile(slots=2)
        if ready_file:
            tmp = ready_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(info, f)
            os.replace(tmp, ready_file)
        else:
            _print_usage(info)
            print("Ctrl-C stops it.", flush=True)
        while not stop:
            signal.pause()
    return 0


def up(n: int, as_json: bool) -> int:
    ready = os.path.join("/tmp", f"zlaunch-cluster-ready-{os.getpid()}.json")
    log = os.path.join("/tmp", f"zlaunch-cluster-serve-{os.getpid()}.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster", "serve", "-n", str(n), "--ready-file", ready],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    try:
        while not os.path.exists(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log) as f:
                    sys.stderr.write(f.read())
                print("test cluster failed to start", file=sys.stderr)
                proc.kill()
                return 1
            time.sleep(0.05)
        with open(ready) as f:
            info = json.load(f)
    finally:
        for path in (ready, log):
            if os.path.exists(path):
                os.unlink(path)
    if as_json:
        print(json.dumps(info, indent=2))
    else:
        _print_usage(info)
    return 0


def status(as_json: bool) -> int:
    infos = [_info(p) for p in sorted(find_prefixes())]
    if as_json:
        print(json.dumps(infos, indent=2))
        return 0
    if not infos:
        print("no test clusters on this machine")
    for info in infos:
        kind = "background" if info.get("detached") else "owned by a process"
        state = "alive" if info["owner_alive"] else "owner dead: leftovers"
        hosts = ",".join(info.get("hosts", []))
        print(f"{info['prefix']}  owner {info['owner_pid']} ({kind}, {state})  hosts {hosts}")
    return 0


def down(prefixes: list[str], everything: bool = False) -> int:
    """Stop the clusters named (or with ``everything``, every background one on the machine).

    A bare ``down`` stops nothing alive: other people's clusters (and test runs) on the same
    machine are not ours to stop. It still removes leftovers of dead owners, and says how to
    name a live cluster.
    """
    live = [i for i in (_info(p) for p in sorted(find_prefixes())) if i["owner_alive"]]
    if everything:
        prefixes = [i["prefix"] for i in live if i.get("detached")]
    unknown = [p for p in prefixes if p not in find_prefixes()]
    if unknown:
        print(f"no test cluster {', '.join(unknown)} on this machine", file=sys.stderr)
        print("  see: python -m tests.cluster status", file=sys.stderr)
        return 2
    wanted = prefixes
    for prefix in wanted:
        pid = owner_of(prefix)
        if owner_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while owner_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        destroy(prefix)  # whatever the owner left, or all of it if it is gone
        print(f"removed {prefix}")
    for prefix in reap_stale():
        print(f"removed leftovers of {prefix}")
    if not prefixes and not everything:
        background = [i for i in live if i.get("detached")]
        if background:
            print(
                "not stopping clusters that were not named: "
                + ", ".join(i["prefix"] for i in background),
                file=sys.stderr,
            )
            print(
                "  name one (python -m tests.cluster down PREFIX) or stop all with --all",
                file=sys.stderr,
            )
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start a cluster in the background")
    p_up.add_argument("-n", type=int, default=3, help="number of hosts (default 3)")
    p_up.add_argument("--json", action="store_true")
    p_serve = sub.add_parser("serve", help="run a cluster in the foreground")
    p_serve.add_argument("-n", type=int, default=3)
    p_serve.add_argument("--ready-file", help=argparse.SUPPRESS)
    p_status = sub.add_parser("status", help="list clusters on this machine")
    p_status.add_argument("--json", action="store_true")
    p_down = sub.add_parser("down", help="stop the clusters named and reap leftovers")
    p_down.add_argument("prefixes", nargs="*", metavar="PREFIX")
    p_down.add_argument(
        "--all", action="store_true", help="stop every background cluster on this machine"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return up(args.n, args.json)
        if args.command == "serve":
            return serve(args.n, args.ready_file)
        if args.command == "status":
            return status(args.json)
        return down(args.prefixes, args.all)
    except ClusterError as exc:
        print(f"test cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
