"""The controller alone at 1,024 to 16,384 ranks: fake agents speaking the frame protocol.

The real controller runs (``zlaunch.launcher.launch``: the real ``Job``, ``Attempt``,
recorder, rank logs and console) in a process of its own; only its transport is replaced. Its
agents are one *farm* process that answers every node's spec the way an agent does (HELLO,
then STARTED per rank, OUT frames at the chosen rate and size, EXITED per rank, BYE, and an
echo of every heartbeat), over one pipe pair per node. No process per rank, no SSH: what is
measured is the controller's own intake.

Reported per run (one JSON object, ``--json`` appends it to a file):

- ``start_s``: the controller's start -> the last node's spec in the farm (run directory,
  links, hellos, plan, 16,384 rank logs opened);
- ``stream_s``: the first OUT frame the farm sent -> the controller's end of the attempt
  (every BYE taken); ``lines_per_s``, ``frames_per_s``, ``mb_per_s`` over that window;
- ``lag_s``: the farm's last OUT frame -> the controller's end (how far behind it was);
- ``cpu_s`` (user + system of the controller process, every thread), ``start_cpu_s`` (its
  part until the specs were sent) and ``cpu_us_per_line`` (the rest, per line): CPU time
  stays meaningful on a machine others load, where wall times do not;
- ``peak_rss_mib`` (the controller's ``ru_maxrss``) and ``peak_queue``: the most items
  waiting in the controller's frame queue (sampled every 50 ms);
- ``farm_cpu_s``: the fake agents' CPU (when it is near ``stream_s`` the farm, not the
  controller, was the limit);
- ``logs_exact``: every rank log compared byte for byte with what its rank wrote, in order;
  ``console_lines`` shown on stdout and ``console_dropped``, the lines the console said it
  did not show (``--console slow:BYTES_PER_S`` reads stdout that slowly).

Lines are deterministic per (rank, index): the checker regenerates them. One line in 50 holds
non-UTF-8 bytes and one in 64 is cut into two frames (the first ``partial``), as a long line
is; one frame in 8 is stderr. Run from the repository root::

    python benchmarks/controller_sim.py --nodes 64 --ranks-per-node 16 --lines 200
    python benchmarks/controller_sim.py --nodes 256 --ranks-per-node 16 --lines 50 \\
        --rate 20 --json benchmarks/results/controller_sim.jsonl
    python benchmarks/controller_sim.py ... --profile /tmp/controller.prof.txt

The fake transport is installed in the controller process by replacing
``zlaunch.launcher.agent_links.open_links`` (as a test would with monkeypatch); it is never
selectable from zlaunch's command line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# ---- what every rank writes (the farm sends it, the checker regenerates it) ----------------

_FILL = b"abcdefghijklmnopqrstuvwxyz0123456789" * 64
NON_UTF8_EVERY = 50
SPLIT_EVERY = 64
STDERR_EVERY = 8


@dataclass(frozen=True)
class Load:
    """What the fake ranks write."""

    nodes: int = 64
    ranks_per_node: int = 16
    lines: int = 100
    """Lines per rank."""
    line_bytes: int = 100
    """Bytes per line, newline not counted."""
    lines_per_frame: int = 8
    """Lines per OUT frame (an agent sends what one read of the pipe returned)."""
    rate: float = 0.0
    """Lines per second per rank; 0: as fast as the controller takes them."""

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


def line_of(rank: int, index: int, size: int) -> bytes:
    """Line ``index`` of ``rank``, ``size`` bytes without its newline."""
    head = b"rank %d line %d " % (rank, index)
    if index % NON_UTF8_EVERY == NON_UTF8_EVERY - 1:
        head += "\u00e9\u4e2d ".encode() + b"\xff\xfe "
    return (head + _FILL[: max(0, size - len(head))])[: max(size, len(head))]


def expected_log(rank: int, load: Load) -> bytes:
    return b"".join(line_of(rank, i, load.line_bytes) + b"\n" for i in range(load.lines))


# ---- the farm: every node's agent in one process ------------------------------------------


class _Node:
    __slots__ = ("down", "up", "reader", "pending", "ranks", "sent", "carry", "frames",
                 "phase", "t0", "stopped")  # fmt: skip

    def __init__(self, down: int, up: int, reader):
        self.down = down
        self.up = up
        self.reader = reader
        self.pending = bytearray()
        self.ranks: list[int] = []
        self.sent = 0  # lines of each rank sent so far (whole lines)
        self.carry: dict[int, bytes] = {}  # rank -> rest of a line cut into two frames
        self.frames = 0
        self.phase = "hello"  # hello -> stream -> done (BYE queued) -> closed
        self.t0 = 0.0
        self.stopped = False


HIGH_WATER = 256 * 1024  # bytes waiting per node before the farm stops generating for it


def _out_frame(rank: int, stream: str, lines: list[bytes], partial: bool) -> bytes:
    """An OUT frame as the agent encodes it, built without the dataclass (the farm plays
    every node: it must be cheaper per line than the controller it measures)."""
    text = json.dumps([raw.decode("utf-8", "surrogateescape") for raw in lines])
    tail = ',"p":true}\n' if partial else "}\n"
    return f'{{"t":"out","r":{rank},"s":"{stream}","l":{text}{tail}'.encode()


def farm_main(config_path: str) -> int:
    from zlaunch.wire import frames

    with open(config_path) as f:
        config = json.load(f)
    load = Load(**config["load"])
    fds = config["fds"]
    sel = selectors.DefaultSelector()
    nodes: list[_Node] = []
    for index, (down, up) in enumerate(fds):
        os.set_blocking(up, False)
        node = _Node(down, up, frames.FrameReader())
        hello = frames.Hello(f"sim{index:04d}", os.getpid(), sys.executable, None, None, 29500, 1)
        node.pending += frames.encode(hello)
        nodes.append(node)
        sel.register(down, selectors.EVENT_READ, node)
    hb = frames.encode(frames.Heartbeat())
    stats = {"out_frames": 0, "pieces": 0, "first_out": None, "last_out": None, "last_spec": None}
    streaming: set[int] = set()
    writable: dict[int, _Node] = {}
    open_nodes = len(nodes)

    def generate(node: _Node, now: float) -> None:
        due = load.lines if load.rate <= 0 else min(load.lines, int(load.rate * (now - node.t0)))
        while node.sent < due and len(node.pending) < HIGH_WATER:
            count = min(load.lines_per_frame, due - node.sent)
            first = node.sent
            for rank in node.ranks:
                lines = [line_of(rank, i, load.line_bytes) for i in range(first, first + count)]
                carried = node.carry.pop(rank, None)
                if carried is not None:
                    lines[0] = carried
                last = first + count - 1
                # Now and then the last line goes in two pieces (a long line is cut so): the
                # first ends this frame, marked partial, the rest leads the next frame.
                partial = (
                    last % SPLIT_EVERY == SPLIT_EVERY - 1
                    and last + 1 < load.lines
                    and (carried is None or count > 1)
                )
                if partial:
                    whole = lines[-1]
                    lines[-1], node.carry[rank] = whole[: len(whole) // 2], whole[len(whole) // 2 :]
                stream = "e" if node.frames % STDERR_EVERY == STDERR_EVERY - 1 else "o"
                node.pending += _out_frame(rank, stream, lines, partial)
                node.frames += 1
                stats["out_frames"] += 1
                stats["pieces"] += partial  # the console shows a piece as a line of its own
            node.sent += count
            if partial:
                node.sent -= 1  # the next frame starts with the rest of line `last`
            if stats["first_out"] is None:
                stats["first_out"] = time.time()
        if node.sent >= load.lines and node.phase == "stream":
            for rank in node.ranks:
                code, sig = (None, 15) if node.stopped else (0, None)
                node.pending += frames.encode(frames.Exited(rank, 1000 + rank, code, sig))
            node.pending += frames.encode(frames.Bye())
            node.phase = "done"
            streaming.discard(id(node))
            stats["last_out"] = time.time()

    def flush(node: _Node) -> None:
        while node.pending:
            try:
                n = os.write(node.up, node.pending[: 1 << 20])
            except BlockingIOError:
                break
            except OSError:  # the controller closed its end
                node.pending.clear()
                break
            del node.pending[:n]
        want = bool(node.pending)
        if want and node.up not in writable:
            writable[node.up] = node
            sel.register(node.up, selectors.EVENT_WRITE, node)
        elif not want and node.up in writable:
            del writable[node.up]
            sel.unregister(node.up)
        if not node.pending and node.phase == "done":
            os.close(node.up)  # the agent exits after its bye
            node.phase = "closed"

    def on_frame(node: _Node, frame) -> None:
        if isinstance(frame, frames.Spec):
            node.ranks = [worker.rank for worker in frame.workers]
            for rank in node.ranks:
                node.pending += frames.encode(frames.Started(rank, 1000 + rank))
            node.phase = "stream"
            node.t0 = time.monotonic()
            streaming.add(id(node))
            stats["last_spec"] = time.time()
        elif isinstance(frame, frames.Heartbeat) and node.phase not in ("done", "closed"):
            node.pending += hb
        elif isinstance(frame, frames.Stop) and node.phase == "stream":
            node.sent = load.lines  # the ranks are stopped: no more lines, ended by TERM
            node.stopped = True

    for node in nodes:
        flush(node)
    while open_nodes:
        busy = any(
            n.phase == "stream" and len(n.pending) < HIGH_WATER and n.sent < load.lines
            for n in nodes
        )
        events = sel.select(0 if busy and load.rate <= 0 else 0.005)
        for key, mask in events:
            node = key.data
            if mask & selectors.EVENT_READ and key.fd == node.down:
                try:
                    chunk = os.read(node.down, 1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(node.down)
                    os.close(node.down)
                    open_nodes -= 1
                    if node.phase != "closed":  # the controller let go first
                        node.pending.clear()
                        node.phase = "done"
                        flush(node)
                    continue
                for frame in node.reader.feed(chunk):
                    on_frame(node, frame)
        now = time.monotonic()
        for node in nodes:
            if node.phase == "stream":
                generate(node, now)
            if node.pending or node.phase == "done":
                flush(node)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats["cpu_s"] = usage.ru_utime + usage.ru_stime
    with open(config["result"], "w") as f:
        json.dump(stats, f)
    return 0


# ---- the controller side: links to the farm -----------------------------------------------


def _sim_transport(load: Load, farm_result: str):
    """An ``open_links`` that starts the farm and returns one link per host."""
    from zlaunch.transport.link import Link

    class SimLink(Link):
        def __init__(self, host, up: int, down: int, farm: subprocess.Popen):
            super().__init__(host)
            self._up = up
            self._down = down
            self._farm = farm

        def _write(self, data: bytes) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(self._down, view) :]

        def read(self, size: int = 65536) -> bytes:
            try:
                return os.read(self._up, size)
            except OSError:
                return b""

        def close_stdin(self) -> None:
            with self._send_lock:
                if self._down >= 0:
                    os.close(self._down)
                    self._down = -1

        def wait(self, timeout: float | None = None) -> int | None:
            try:
                return self._farm.wait(timeout)
            except subprocess.TimeoutExpired:
                return None

        def terminate(self, wait: float = 5.0) -> None:
            self.close_stdin()
            self.closed = True

    def open_links(hosts, argv_for, ssh, *, on_open=None, **_how):  # no ssh, srun or mpirun
        pairs, theirs = [], []
        for _host in hosts:
            down_r, down_w = os.pipe()
            up_r, up_w = os.pipe()
            pairs.append((up_r, down_w))
            theirs.append((down_r, up_w))
        config = {"load": asdict(load), "fds": theirs, "result": farm_result}
        config_path = farm_result + ".config"
        with open(config_path, "w") as f:
            json.dump(config, f)
        farm = subprocess.Popen(
            [sys.executable, __file__, "_farm", config_path],
            pass_fds=[fd for pair in theirs for fd in pair],
            stdin=subprocess.DEVNULL,
        )
        for pair in theirs:
            for fd in pair:
                os.close(fd)
        links = [
            SimLink(host, up, down, farm) for host, (up, down) in zip(hosts, pairs, strict=True)
        ]
        for index, link in enumerate(links):
            if on_open is not None:
                on_open(index, link)
        return links

    return open_links


def controller_main(config_path: str) -> int:
    with open(config_path) as f:
        config = json.load(f)
    load = Load(**config["load"])
    from zlaunch.job.hostfile import Host
    from zlaunch.job.options import LaunchOptions
    from zlaunch.launcher import agent_links, launch

    agent_links.open_links = _sim_transport(load, config["farm_result"])
    if config.get("console_limit"):  # a console that holds this much before it drops lines
        from zlaunch.console import writer

        writer.DEFAULT_LIMIT = config["console_limit"]
    hosts = tuple(Host(f"sim{n:04d}", tuple(range(load.ranks_per_node))) for n in range(load.nodes))
    options = LaunchOptions(
        hosts=hosts,
        program=("sim.py",),
        python=sys.executable,
        cwd=config["dir"],
        log_dir=os.path.join(config["dir"], "runs"),
        color=False,
        hang_timeout=0.0,
        **({"collapse": False} if config.get("no_collapse") else {}),
    )
    peak = {"queue": 0}
    stop = threading.Event()
    queues = []
    original_init = agent_links.AgentLinks.__init__

    def init(self, *args, **kwargs):  # to sample the frame queue's depth
        original_init(self, *args, **kwargs)
        queues.append(self.queue)

    agent_links.AgentLinks.__init__ = init
    from zlaunch.launcher import job

    original_send = job.Attempt._send_specs
    marks = {}

    def send_specs(self):  # the start's CPU: run directory, links, hellos, plan, specs
        original_send(self)
        marks.setdefault("start_cpu", time.process_time())

    job.Attempt._send_specs = send_specs
    if config.get("agent_silence"):  # see --agent-silence
        job.AGENT_SILENCE_TIMEOUT = config["agent_silence"]  # trees before zlaunch/wire/liveness.py
        try:
            from zlaunch.wire import liveness

            liveness.agent_silence_timeout = lambda _ranks: config["agent_silence"]
        except ImportError:
            pass

    def sample() -> None:
        while not stop.wait(0.05):
            for queue in queues:
                peak["queue"] = max(peak["queue"], queue.qsize())

    threading.Thread(target=sample, daemon=True).start()
    profile = None
    if config.get("profile"):
        import cProfile

        # CPU time of the loop's thread: wall time would count the other processes of a
        # busy machine, and the reader threads' share (decoding) is in cpu_s.
        profile = cProfile.Profile(time.thread_time)
    start = time.time()
    if profile is not None:
        profile.enable()
    try:
        code = launch(options)
    except Exception as err:  # noqa: BLE001 - the outcome is the measurement
        code = getattr(err, "exit_code", 1)
        print(f"controller_sim: {type(err).__name__}: {err}", file=sys.stderr)
    end = time.time()
    if profile is not None:
        profile.disable()
        import pstats

        with open(config["profile"], "w") as f:
            stats = pstats.Stats(profile, stream=f)
            stats.sort_stats("tottime").print_stats(40)
            stats.sort_stats("cumulative").print_stats(60)
    stop.set()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "code": code,
        "start": start,
        "end": end,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "peak_queue": peak["queue"],
        "start_cpu_s": marks.get("start_cpu", 0.0),
    }
    with open(config["result"], "w") as f:
        json.dump(result, f)
    return 0


# ---- the driver ---------------------------------------------------------------------------


def _console_reader(stream, bytes_per_s: float, counts: dict) -> None:
    """Reads the controller's stdout (at ``bytes_per_s`` when given), counting rank lines and
    the console's own word on lines it dropped."""
    import re

    dropped = re.compile(rb"(\d+) line\(s\) not shown")
    tail = b""
    while True:
        chunk = stream.read1(65536) if bytes_per_s <= 0 else stream.read1(4096)
        if not chunk:
            break
        data = tail + chunk
        *lines, tail = data.split(b"\n")
        for line in lines:
            match = dropped.search(line) if line.startswith(b"zlaunch:") else None
            if match:
                counts["dropped"] += int(match.group(1))
            elif line.startswith(b"[ranks "):  # one line several ranks said (collapsed)
                counts["lines"] += _ranks_named(line[len(b"[ranks ") : line.index(b"]")])
            elif line.startswith(b"["):
                counts["lines"] += 1
        if bytes_per_s > 0:
            time.sleep(len(chunk) / bytes_per_s)


def _ranks_named(tag: bytes) -> int:
    """How many ranks "0-3,5" or "0,2,...,1022 (512 ranks)" names."""
    text = tag.decode()
    if text.endswith(" ranks)"):
        return int(text.rsplit("(", 1)[1].split()[0])
    count = 0
    for span in text.split(","):
        first, _, last = span.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def _said_dropped(notes: str) -> int | None:
    """The count the controller's last words (stderr) give of lines the console dropped."""
    import re

    match = re.search(r"(\d+) line\(s\) of rank output were not shown", notes)
    return int(match.group(1)) if match else None


def check_logs(run_dir: str, load: Load) -> tuple[bool, list[str]]:
    """Every rank log byte for byte; the first few differences in words."""
    problems = []
    for node in range(load.nodes):
        for local in range(load.ranks_per_node):
            rank = node * load.ranks_per_node + local
            path = os.path.join(run_dir, "attempt-0", f"sim{node:04d}", f"rank-{rank}.log")
            try:
                with open(path, "rb") as f:
                    got = f.read()
            except OSError as err:
                problems.append(f"rank {rank}: {err}")
                continue
            want = expected_log(rank, load)
            if got != want:
                at = next(
                    (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None
                )
                at = min(len(got), len(want)) if at is None else at
                problems.append(
                    f"rank {rank}: {len(got)} bytes, {len(want)} expected, first difference at {at}"
                )
            if len(problems) >= 5:
                return False, problems
    return not problems, problems


def run(load: Load, console: str = "null", profile: str | None = None,
        keep: str | None = None, console_limit: int | None = None,
        tree: str = ROOT, agent_silence: float | None = None,
        no_collapse: bool = False) -> dict:  # fmt: skip
    """One simulated job; the measurements as a dict (see the module's docstring). ``tree``:
    the source tree whose zlaunch the controller runs (another checkout, for before/after)."""
    work = keep or tempfile.mkdtemp(prefix="zlaunch-sim-")
    os.makedirs(work, exist_ok=True)
    config = {
        "load": asdict(load),
        "dir": work,
        "result": os.path.join(work, "controller.json"),
        "farm_result": os.path.join(work, "farm.json"),
        "profile": profile,
        "console_limit": console_limit,
        "agent_silence": agent_silence,
        "no_collapse": no_collapse,
    }
    config_path = os.path.join(work, "controller.config")
    with open(config_path, "w") as f:
        json.dump(config, f)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    env["XDG_STATE_HOME"] = os.path.join(work, "state")  # the run index stays in here
    env.pop("ZLAUNCH_LIVE", None)
    counts = {"lines": 0, "dropped": 0}
    stdout = subprocess.DEVNULL if console == "null" else subprocess.PIPE
    with open(os.path.join(work, "controller.stderr"), "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, __file__, "_controller", config_path],
            stdout=stdout,
            stderr=err,
            env=env,
            cwd=work,
        )
        reader = None
        if stdout is subprocess.PIPE:
            rate = float(console.split(":", 1)[1]) if console.startswith("slow:") else 0.0
            reader = threading.Thread(target=_console_reader, args=(proc.stdout, rate, counts))
            reader.start()
        proc.wait()
        if reader is not None:
            reader.join()
    with open(config["result"]) as f:
        ctl = json.load(f)
    try:
        with open(config["farm_result"]) as f:
            farm = json.load(f)
    except FileNotFoundError:  # the controller stopped before it started its agents
        farm = {"out_frames": 0, "pieces": 0, "cpu_s": 0.0}
        farm.update(first_out=None, last_out=None, last_spec=None)
    runs = os.path.join(work, "runs")
    try:
        run_dir = os.path.join(runs, os.readlink(os.path.join(runs, "latest")))
        exact, problems = check_logs(run_dir, load)
    except FileNotFoundError:
        run_dir, exact, problems = None, False, ["no run directory"]
    lines = load.ranks * load.lines
    volume = lines * (load.line_bytes + 1)
    first_out = farm["first_out"] or ctl["end"]
    stream_s = max(1e-9, ctl["end"] - first_out)
    with open(os.path.join(work, "controller.stderr"), "rb") as f:
        notes = f.read().decode("utf-8", "replace")
    result = {
        **asdict(load),
        "ranks": load.ranks,
        "tree": os.path.abspath(tree),
        "console": console,
        "code": ctl["code"],
        "total_lines": lines,
        "total_mb": round(volume / 1e6, 2),
        "out_frames": farm["out_frames"],
        "start_s": round((farm["last_spec"] or ctl["end"]) - ctl["start"], 3),
        "stream_s": round(stream_s, 3),
        "lag_s": round(ctl["end"] - (farm["last_out"] or ctl["end"]), 3),
        "lines_per_s": round(lines / stream_s),
        "frames_per_s": round(farm["out_frames"] / stream_s),
        "mb_per_s": round(volume / 1e6 / stream_s, 2),
        "cpu_s": round(ctl["cpu_s"], 2),
        "start_cpu_s": round(ctl["start_cpu_s"], 2),
        "cpu_us_per_line": round((ctl["cpu_s"] - ctl["start_cpu_s"]) / lines * 1e6, 2),
        "peak_rss_mib": round(ctl["peak_rss_mib"], 1),
        "peak_queue": ctl["peak_queue"],
        "farm_cpu_s": round(farm["cpu_s"], 2),
        "logs_exact": exact,
        "log_problems": problems,
        "console_lines": counts["lines"] if stdout is subprocess.PIPE else None,
        "console_dropped": counts["dropped"] if stdout is subprocess.PIPE else None,
        "console_expected": lines + farm["pieces"],
        "console_dropped_said": _said_dropped(notes),
        "controller_errors": [line for line in notes.splitlines() if "cannot" in line][:5],
        "run_dir": run_dir,
    }
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
        result["run_dir"] = None
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_farm"]:
        return farm_main(argv[1])
    if argv[:1] == ["_controller"]:
        return controller_main(argv[1])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--ranks-per-node", type=int, default=16)
    parser.add_argument("--lines", type=int, default=100, help="lines per rank")
    parser.add_argument("--line-bytes", type=int, default=100)
    parser.add_argument("--lines-per-frame", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.0, help="lines/s per rank (0: flat out)")
    parser.add_argument(
        "--console", default="null", help="null | pipe | slow:BYTES_PER_S (stdout read that fast)"
    )
    parser.add_argument(
        "--console-limit", type=int, help="bytes the console holds before it drops lines"
    )
    parser.add_argument(
        "--no-collapse",
        action="store_true",
        help="every rank's every line on the console (a dropped line is then one rank line)",
    )
    parser.add_argument("--profile", help="write the controller's cProfile top 40 here")
    parser.add_argument(
        "--tree", default=ROOT, help="the source tree whose controller runs (default: this one)"
    )
    parser.add_argument(
        "--agent-silence",
        type=float,
        help="seconds without a frame before the controller takes an agent as lost (default: "
        "zlaunch's): on a machine others load, a slow start reads as silent agents",
    )
    parser.add_argument("--keep", help="keep the run's files in this directory")
    parser.add_argument("--json", help="append the result (one JSON line) to this file")
    parser.add_argument("--label", default="", help="a word stored with the result")
    args = parser.parse_args(argv)
    load = Load(args.nodes, args.ranks_per_node, args.lines, args.line_bytes,
                args.lines_per_frame, args.rate)  # fmt: skip
    result = run(load, args.console, args.profile, args.keep, args.console_limit, args.tree,
                 args.agent_silence, args.no_collapse)  # fmt: skip
    result["label"] = args.label
    result["when"] = time.strftime("%Y-%m-%d %H:%M")
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0 if result["logs_exact"] and result["code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
