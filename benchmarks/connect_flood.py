"""How long a real agent takes to get in to the connect-back listener (zlaunch/transport/
connect_back.py) with hostile connections on its port, beside the same with none::

    python benchmarks/connect_flood.py [--silent 1000] [--garbage 1000] [--rounds 5] [--free 24]

The controller's side runs in a process of its own whose soft descriptor limit is 1,024 and,
with ``--free N``, whose other descriptors take all but N as the wait begins (so the flood
really runs it out of descriptors). The hostile peers are two processes of their own (one
silent, one sending an HTTP request per connection); the agent is ``connect_back`` in this
process. Three cases per round, in turn (load on the host hits them alike):

* ``quiet``  -- no hostile peer;
* ``after``  -- the agent dials once every hostile connection is open;
* ``during`` -- the agent dials while the hostile processes are still opening theirs.

Prints each case's median seconds and its ratio to ``quiet``, and how many tries the agent
needed at most (a try is shed under the flood; the agent tries again).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from zlaunch.agent import connect  # noqa: E402
from zlaunch.wire import protocol  # noqa: E402

TOKEN = "5" * 64

CONTROLLER = """
import json, os, resource, sys, time
from zlaunch.job.hostfile import Host
from zlaunch.transport.connect_back import Listener
from zlaunch.transport.roster import HostRoster
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, soft), hard))
listener = Listener("127.0.0.1", sys.argv[1])
print(listener.address, flush=True)
held, notes = [], []
def squeeze():
    if not held and int(sys.argv[2]):
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        for fd in held[:int(sys.argv[2])]:
            os.close(fd)
    return False
missing = listener.accept_agents(
    HostRoster([Host("nodeA", (0,))]), time.monotonic() + 120, lambda i, s, a: None,
    notes.append, squeeze,
)
print(json.dumps({"missing": missing, "notes": notes}), flush=True)
"""

HOSTILE = """
import socket, sys, time
host, port, n, garbage = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
socks = []
for _ in range(n):
    s = socket.create_connection((host, port), timeout=30)
    if garbage:
        s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    socks.append(s)
print("open", flush=True)
sys.stdin.read()
"""


def _raise_own_limit(want: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def once(case: str, silent: int, garbage: int, free: int) -> tuple[float, int]:
    """(seconds until the agent was in, tries it took) of one case."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, TOKEN, str(free)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    address = controller.stdout.readline().strip()
    host, port = address.rsplit(":", 1)
    hostile = []
    if case != "quiet":
        for n, bad in ((silent, "0"), (garbage, "1")):
            hostile.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOSTILE, host, port, str(n), bad],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )  # fmt: skip
            )
        if case == "after":
            for proc in hostile:
                proc.stdout.readline()
        else:
            time.sleep(0.5)  # the hostile processes are up and opening connections
    tries = 0
    real_try = connect._try

    def counted(*args, **kwargs):
        nonlocal tries
        tries += 1
        return real_try(*args, **kwargs)

    connect._try = counted
    try:
        start = time.monotonic()
        sock = connect.connect_back(
            address, {protocol.CONNECT_TOKEN_ENV: TOKEN, "SLURMD_NODENAME": "nodeA"}
        )
        took = time.monotonic() - start
        sock.close()
    finally:
        connect._try = real_try
    report = json.loads(controller.communicate(timeout=60)[0])
    for proc in hostile:
        proc.kill()
        proc.wait()
    assert report["missing"] == [], report
    return took, tries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--silent", type=int, default=1000)
    parser.add_argument("--garbage", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--free", type=int, default=24)
    args = parser.parse_args()
    _raise_own_limit(4096)
    cases = ("quiet", "after", "during")
    times: dict[str, list[float]] = {case: [] for case in cases}
    tries: dict[str, int] = dict.fromkeys(cases, 0)
    for _ in range(args.rounds):
        for case in cases:
            took, n = once(case, args.silent, args.garbage, args.free)
            times[case].append(took)
            tries[case] = max(tries[case], n)
    quiet = statistics.median(times["quiet"])
    squeezed = f", the controller's descriptors squeezed to {args.free} free" if args.free else ""
    print(
        f"{args.silent} silent + {args.garbage} garbage connections, {args.rounds} rounds{squeezed}"
    )
    for case in cases:
        median = statistics.median(times[case])
        print(
            f"{case:>7}: median {median * 1000:8.1f} ms  (max {max(times[case]) * 1000:8.1f} ms, "
            f"ratio to quiet {median / quiet:6.1f}x, at most {tries[case]} tries)"
        )


if __name__ == "__main__":
    main()
