"""The controller's connections to one attempt's agents: start them, read their frames into
one queue, send to one or all, heartbeat, close. No policy: what a frame means and what to
send when is the launcher's (zlaunch/launcher/job.py) and the state machine's (job_state.py).

Everything that reaches the controller's loop goes through one queue as ``(kind, node,
payload)``: ``("frame", node, frame)``, ``("garbled", node, why)``, ``("eof", node, None)``,
``("signal", None, signum)``. Reader threads only decode; the caller's thread owns the rest.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zlaunch import frames
from zlaunch.hostfile import Host
from zlaunch.liveness import SilenceClock
from zlaunch.options import LaunchOptions
from zlaunch.transport import Link, agent_argv, open_links

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


class AgentLinks:
    """One attempt's agents, by node index (the order of ``hosts``)."""

    def __init__(
        self,
        hosts: Sequence[Host],
        done: Callable[[int], bool],
        trace: Callable[[str], None] = lambda _w: None,
        note: Callable[[str], None] = lambda _w: None,
    ):
        self.hosts = tuple(hosts)
        self.queue: queue.Queue = queue.Queue()
        self.links: list[Link | None] = [None] * len(self.hosts)
        self._done = done
        """Per node: whether nothing more is sent to it (it said bye, was lost or dropped);
        the caller's state machine knows, read from the heartbeat thread too."""
        self.heard = SilenceClock(len(self.hosts), time.monotonic(), TURN)
        """Per node: when its last bytes arrived, noted by its reader thread as they come (a
        backlog in the queue is not the agent's silence)."""
        self._trace = trace
        self._note = note
        """Tells the user of something seen while connecting (a connection refused)."""
        self._stop_heartbeat = threading.Event()

    # ---- starting ---------------------------------------------------------------------------

    def open(self, options: LaunchOptions) -> None:
        """Start every agent in parallel; each one's frames flow into the queue at once."""

        def on_open(index: int, link: Link) -> None:
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
            chunk = link.read(1 << 18)
            if not chunk:
                break
            self.heard.heard(index, time.monotonic())
            for frame in reader.feed(chunk):
                self.queue.put(FrameIn(index, frame))
        for frame in reader.finish():
            self.queue.put(FrameIn(index, frame))
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
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def awake(self, now: float) -> None:
        """The controller's loop runs: the time it did not (a loaded machine) is nobody's
        silence (zlaunch/liveness.py)."""
        self.heard.awake(now)

    def silent_for(self, index: int, now: float) -> float:
        """Seconds node ``index`` has sent nothing, counted while the controller ran."""
        return self.heard.silent_for(index, now)

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
        closers = [
            threading.Thread(target=link.terminate, args=(2.0,), daemon=True)
            for link in self.links
            if link is not None
        ]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(timeout=5.0)
