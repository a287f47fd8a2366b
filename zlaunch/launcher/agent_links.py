"""The controller's connections to one attempt's agents: start them, read their frames into
one queue, send to one or all, heartbeat, close. No policy: what a frame means and what to
send when is the launcher's (zlaunch/launcher/job.py) and the state machine's (state.py).

Everything that reaches the controller's loop goes through one queue (`LinkItem`): frames,
garbled bytes, a closed link, a signal. Reader threads only decode; the caller's thread owns
the rest. A reader puts what one read decoded as one batch (one queue operation per read, not
per frame), and the frames waiting in the queue are bounded (`QUEUED_BYTES`): when the loop
falls behind, the readers stop reading, the agents' buffers fill and they stop reading their
workers' pipes (zlaunch/agent/upstream.py): output slows down, none is lost, and the
controller's memory stays bounded whatever the volume.
"""

from __future__ import annotations

import collections
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zlaunch.job import Host, LaunchOptions
from zlaunch.transport import Link, agent_argv, open_links
from zlaunch.wire import SilenceClock, frames

__all__ = [
    "AgentLinks",
    "FrameIn",
    "Garbled",
    "HEARTBEAT_INTERVAL",
    "LinkClosed",
    "LinkItem",
    "SignalIn",
]

HEARTBEAT_INTERVAL = 1.0
QUEUED_BYTES = 8 * 1024 * 1024
"""Frame bytes read but not yet taken by the loop, all agents together, before the readers
wait. A reader reads at most QUEUED_BYTES / agents (16-256 KiB) at a time, so at most
QUEUED_BYTES + 16 KiB per agent wait. Small enough that a rank's exit behind a backlog is
seen within seconds; a queue that is never empty keeps the loop busy all the same."""
MIN_READ, MAX_READ = 16 * 1024, 256 * 1024
# The controller's loop normally comes back within this (its poll, plus one item's work).
TURN = 1.0


# What the attempt's one queue carries: from the links' reader threads and the signal handlers.


@dataclass(frozen=True)
class FrameIn:
    """A frame from node ``node``'s agent."""

    node: int
    frame: frames.Frame


@dataclass(frozen=True)
class Garbled:
    """Bytes from node ``node``'s agent that are not a frame (skipped, reported)."""

    node: int
    why: str


@dataclass(frozen=True)
class LinkClosed:
    """Node ``node``'s connection ended."""

    node: int


@dataclass(frozen=True)
class SignalIn:
    """A signal reached the controller."""

    signum: int


LinkItem = FrameIn | Garbled | LinkClosed | SignalIn


@dataclass(frozen=True)
class _FramesIn:
    """What one read of node ``node``'s link decoded (``size`` bytes): queued as one item,
    handed out by `AgentLinks.next` one frame at a time."""

    node: int
    frames: list[frames.Frame]
    size: int


class _ByteBudget:
    """Bytes read and not yet taken, shared by the readers: `wait_room` blocks while the
    budget is spent (the loop is behind), `give_back` as the loop takes them."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._cond = threading.Condition()

    def wait_room(self) -> bool:
        """Until there is room; True if it had to wait."""
        with self._cond:
            if self.used < self.limit:
                return False
            self._cond.wait_for(lambda: self.used < self.limit)
            return True

    def take(self, size: int) -> None:
        with self._cond:
            self.used += size

    def give_back(self, size: int) -> None:
        with self._cond:
            self.used -= size
            if self.used < self.limit:
                self._cond.notify_all()

    def lift(self) -> None:
        """No more bound: the loop is done with these links; waiting readers go on to EOF."""
        with self._cond:
            self.limit = float("inf")
            self._cond.notify_all()


class AgentLinks:
    """One attempt's agents, by node index (the order of ``hosts``)."""

    def __init__(
        self,
        hosts: Sequence[Host],
        done: Callable[[int], bool],
        trace: Callable[[str], None] = lambda _w: None,
        note: Callable[[str], None] = lambda _w: None,
        say: Callable[[str], None] = lambda _w: None,
    ):
        self.hosts = tuple(hosts)
        self.queue: queue.Queue = queue.Queue()
        self.links: list[Link | None] = [None] * len(self.hosts)
        self.opened_at: list[float | None] = [None] * len(self.hosts)
        """Per node: when its connection opened (monotonic); first contact counts from it."""
        self._done = done
        """Per node: whether nothing more is sent to it (it said bye, was lost or dropped);
        the caller's state machine knows, read from the heartbeat thread too."""
        self.heard = SilenceClock(len(self.hosts), time.monotonic(), TURN)
        """Per node: when its last bytes arrived, noted by its reader thread as they come (a
        backlog in the queue is not the agent's silence)."""
        self._trace = trace
        self._note = note
        """Tells the user of something seen while connecting (a connection refused)."""
        self._say = say
        """Tells the user where dial-in agents are awaited, and who dialed in."""
        self._stop_heartbeat = threading.Event()
        self._budget = _ByteBudget(QUEUED_BYTES)
        self._read_size = max(MIN_READ, min(MAX_READ, QUEUED_BYTES // max(1, len(self.hosts))))
        self._ready: collections.deque[FrameIn] = collections.deque()
        """Frames of a batch taken from the queue, not handed out yet."""

    # ---- starting ---------------------------------------------------------------------------

    def open(self, options: LaunchOptions) -> None:
        """Start every agent in parallel; each one's frames flow into the queue at once."""

        def on_open(index: int, link: Link) -> None:
            self.opened_at[index] = time.monotonic()
            self._trace(f"connected to {self.hosts[index].display}")
            self.links[index] = link
            threading.Thread(
                target=self._read, args=(index, link), name=f"agent-{index}", daemon=True
            ).start()
            threading.Thread(
                target=self._heartbeat, args=(index,), name=f"heartbeat-{index}", daemon=True
            ).start()

        open_links(
            self.hosts,
            lambda _h: agent_argv(options.python),
            options.ssh,
            on_open=on_open,
            launcher=options.launcher,
            launcher_args=options.launcher_args,
            slurm_mode=options.slurm_mode,
            controller_addr=options.controller_addr,
            on_refused=self._note,
            interrupted=self._stop_signal_waiting,
            controller_port=options.controller_port,
            token_file=options.token_file,
            on_listening=self._say,
            ray=(options.ray_address, options.ray_include, options.ray_exclude),
            k8s=options.k8s,
        )

    def _stop_signal_waiting(self) -> int | None:
        """SIGINT or SIGTERM queued for the caller while the agents are still starting (a
        start that waits for agents to connect back stops waiting for it)."""
        with self.queue.mutex:
            for item in self.queue.queue:
                if isinstance(item, SignalIn) and item.signum in (signal.SIGINT, signal.SIGTERM):
                    return item.signum
        return None

    def _read(self, index: int, link: Link) -> None:
        # A frame that cannot be read is reported and skipped: the agent and its ranks are
        # fine, and dropping them for one bad frame would stop the whole job.
        reader = frames.FrameReader(on_bad=lambda err: self.queue.put(Garbled(index, str(err))))
        while True:
            if self._budget.wait_room():  # the loop is behind: the bytes wait with the agent
                # ... and the wait was the controller's, not this agent's silence.
                self.heard.heard(index, time.monotonic())
            chunk = link.read(self._read_size)
            if not chunk:
                break
            self.heard.heard(index, time.monotonic())
            batch = list(reader.feed(chunk))
            if batch:
                self._budget.take(len(chunk))
                self.queue.put(_FramesIn(index, batch, len(chunk)))
        batch = list(reader.finish())
        if batch:
            self.queue.put(_FramesIn(index, batch, 0))
        self.queue.put(LinkClosed(index))

    def _heartbeat(self, index: int) -> None:
        """Node ``index``'s heartbeat, from a thread of its own. One thread writing to every
        link in turn made a round take as long as all the writes: on a loaded machine each
        write waits for the GIL and for the scheduler (seconds per round at 64 hosts,
        measured), and one stuck link held back every other node's heartbeat."""
        beat = frames.encode(frames.Heartbeat())
        while not self._stop_heartbeat.wait(HEARTBEAT_INTERVAL) and not self._done(index):
            self.send(index, beat)

    # ---- talking ----------------------------------------------------------------------------

    def next(self, timeout: float) -> LinkItem | None:
        """The next queued item, or None after ``timeout`` seconds."""
        if self._ready:
            return self._ready.popleft()
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, _FramesIn):
            self._budget.give_back(item.size)
            self._ready.extend(FrameIn(item.node, frame) for frame in item.frames)
            return self._ready.popleft()
        return item

    def waiting(self) -> bool:
        """Something is queued for the loop already."""
        return bool(self._ready) or not self.queue.empty()

    def awake(self, now: float) -> None:
        """The controller's loop runs: the time it did not (a loaded machine) is nobody's
        silence (zlaunch/wire/liveness.py)."""
        self.heard.awake(now)

    def silent_for(self, index: int, now: float) -> float:
        """Seconds node ``index`` has sent nothing, counted while the controller ran."""
        return self.heard.silent_for(index, now)

    def running(self, index: int) -> bool:
        """Node ``index``'s agent process still runs, as its transport knows it (no round
        trip to the host)."""
        link = self.links[index]
        return link is not None and link.running()

    def send(self, index: int, data: bytes) -> bool:
        link = self.links[index]
        return link is not None and not self._done(index) and link.write(data)

    def send_all(self, data: bytes, *, parallel: bool = True) -> None:
        """Send to every agent still open; in parallel (a stuck connection cannot hold back
        the others), each given up to 2 s."""
        targets = [i for i, link in enumerate(self.links) if link is not None and not self._done(i)]
        if not parallel:
            for index in targets:
                self.send(index, data)
            return
        senders = [
            threading.Thread(target=self.send, args=(index, data), daemon=True) for index in targets
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(timeout=2.0)

    def stderr_tail(self, index: int, lines: int) -> list[str]:
        link = self.links[index]
        return link.stderr_tail()[-lines:] if link else []

    def ended_by_scheduler(self) -> str | None:
        """Slurm's word that it ended the job (scancel, time limit, preemption), from srun's
        stderr on any node; None for other transports and other endings."""
        readers = [getattr(link, "end_reason", None) for link in self.links]
        readers = [read for read in readers if read is not None]
        if not readers:
            return None
        time.sleep(0.1)  # srun's last stderr lines, read by the links' threads
        for read in readers:
            reason = read(wait=0.0)
            if reason:
                return reason
        return None

    # ---- ending -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the heartbeat and end every connection (in parallel, 5 s at most)."""
        self._stop_heartbeat.set()
        self._budget.lift()
        closers = [
            threading.Thread(target=link.terminate, args=(2.0,), daemon=True)
            for link in self.links
            if link is not None
        ]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(timeout=5.0)
        for link in self.links:  # a scheduler's cleanup: bounded by its own calls' timeouts
            if link is not None:
                link.settle()
