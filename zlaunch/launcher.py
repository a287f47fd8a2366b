"""Orchestration of one job: agents everywhere -> plan -> specs -> live output -> failure policy.

``launch(options)`` is the whole life of a job:

1. create the run directory; start one agent per host in parallel (local subprocess or SSH);
2. collect every agent's hello, pick the rendezvous (first host: ``--master-addr`` or the
   address its SSH connection came in on, and a port it found free; 127.0.0.1 only when every
   host is local), build the plan and send each agent its node's spec;
3. stream: output lines to the console and the rank logs, metrics to ``metrics.jsonl``,
   heartbeats to every agent;
4. the first worker to exit non-zero (or an agent lost) stops every rank on every host, in
   parallel (TERM, grace, KILL by the agents); SIGINT/SIGTERM to zlaunch does the same, a
   second SIGINT kills at once. The job ends when every agent has said bye (its workers gone).

Only this job's agents and their process groups are ever signalled, so other jobs on the same
hosts are untouched. One thread (the caller's) owns the console and the files; per-agent reader
threads only decode frames into a queue.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from zlaunch import protocol
from zlaunch.console import Console, rank_ranges
from zlaunch.console_noise import NoiseFilter
from zlaunch.console_progress import ProgressTracker
from zlaunch.console_stacks import StackDumpFilter
from zlaunch.elastic import options_after_loss
from zlaunch.errors import HostUnreachable, Interrupted, LaunchError, WorkerFailed
from zlaunch.hang import HangWatch, StackCapture, hang_failure
from zlaunch.live_view import JobView, PlainView, open_view
from zlaunch.options import LaunchOptions
from zlaunch.plan import Plan, build_plan
from zlaunch.redact import redact_argv
from zlaunch.run_index import register
from zlaunch.rundir import RunDir, RunStatus, new_run_id, plan_record
from zlaunch.spec import encode_spec, node_spec
from zlaunch.transport import Link, agent_argv, open_links

__all__ = ["launch", "Job", "HEARTBEAT_INTERVAL", "HEARTBEAT_TIMEOUT"]

HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT = 5.0
RESTART_REACH_WINDOW = 30.0
"""Seconds a restart keeps trying to reach hosts that do not answer yet (with --min-nodes it
then goes on without them)."""
RESTART_REACH_RETRY = 2.0
AGENT_SILENCE_TIMEOUT = 15.0
"""Seconds without a frame from an agent (it echoes every heartbeat) before the controller
takes its node as lost: a link down, a partition, a host that stopped. Longer than the agent's
own HEARTBEAT_TIMEOUT, so by then that agent has already stopped its workers if it still runs."""
TAIL_LINES = 20
# After a stop, how long past the grace period to wait for agents before dropping them.
STOP_SLACK = 5.0
EXIT_LOST_AGENT = 1


@dataclass
class RankState:
    rank: int
    local_rank: int
    host: str
    node: int
    log: IO[bytes]
    pid: int | None = None
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    exit_code: int | None = None
    signal: int | None = None
    lost: bool = False
    """Its agent's connection was lost: how it ended is unknown (it was killed there)."""
    stacks: bool = False
    """Its runtime dumps stacks on protocol.STACKS_SIGNAL (`zlaunch stacks`)."""

    @property
    def exited(self) -> bool:
        return self.exit_code is not None


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def _signal_name(signum: int | None) -> str | None:
    if not signum:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Job:
    """One launch. ``run()`` returns 0 or raises WorkerFailed/Interrupted/LaunchError."""

    def __init__(self, options: LaunchOptions, console: Console | None = None):
        self.options = options
        self.hosts = options.hosts
        self.console = console or Console(color=options.color, ranks=options.ranks_filter)
        self.noise = NoiseFilter()  # known-harmless lines: off the console, in the rank logs
        self.stack_dumps = StackDumpFilter()  # `zlaunch stacks` dumps: off the console too
        self.progress = ProgressTracker()  # \r-redrawn lines (tqdm): their latest state
        self.rank_progress: dict[int, str] = {}
        self.rank_output_at: dict[int, float] = {}
        """rank -> wall time of its last output line or progress state (ranks.json)."""
        self.ranks_written = 0.0
        self.events: queue.Queue = queue.Queue()
        self.links: list[Link | None] = [None] * len(self.hosts)
        self.hellos: list[protocol.Hello | None] = [None] * len(self.hosts)
        self.agent_done = [False] * len(self.hosts)
        self.ranks: dict[int, RankState] = {}
        self.failures: list[dict[str, Any]] = []
        self.stop_started: float | None = None
        self.stop_grace = options.grace_period
        self.restarts_left = 0
        """Set by `launch`: a worker failure then records "restarting", not the run's end."""
        self.interrupt: int | None = None
        self.sigint_count = 0
        self.metrics: IO[str] | None = None
        self._stop_heartbeat = threading.Event()
        self.run_dir: RunDir | None = None
        self.plan: Plan | None = None
        self.attempt = 0
        self._index_error = ""
        self._trace_start = time.monotonic() if os.environ.get("ZLAUNCH_TRACE") else None
        # --- checkpoints: --save-on forwarding (see _forward_save_signal) ---
        self.save_signal = signal.Signals[options.save_on] if options.save_on else None
        self.save_requested = False
        # --- live view and per-rank state (zlaunch/live_view.py, ranks.json) ---
        self.view: JobView = PlainView(self.console)
        self.last_step: int | None = None
        self.exit_steps: dict[int, int | None] = {}
        # --- end live view ---
        # --- hang watchdog (zlaunch/hang.py) ---
        self.hang = HangWatch(options.hang_timeout)
        self.capture: StackCapture | None = None
        self._hang_idle = 0.0
        self.heard: list[float] = []
        """Per agent: when its last frame arrived (monotonic), for AGENT_SILENCE_TIMEOUT."""
        self.lost_hosts: set[str] = set()
        """Hosts whose agent connection broke during this attempt (see zlaunch/elastic.py)."""

    # ---- entry ----------------------------------------------------------------------------

    def _trace(self, what: str) -> None:
        """Phase timings on stderr with ZLAUNCH_TRACE=1 (where does launch time go?)."""
        if self._trace_start is not None:
            self.console.note(f"trace {time.monotonic() - self._trace_start:7.3f}s {what}")

    def run(self) -> int:
        opts = self.options
        self._trace("start")
        if self.run_dir is None:  # a restart (launch, --max-restarts) reuses the run directory
            self.run_dir = RunDir.create(
                opts.log_dir,
                new_run_id(),
                {
                    "config": opts.config_path,
                    "hosts": [h.name for h in self.hosts],
                    "program": redact_argv(opts.program),
                    "cwd": opts.cwd,
                    "plan": None,
                    # `zlaunch stop --save` sends save_on, and says where the checkpoint went
                    "checkpoint_dir": opts.checkpoint_dir,
                    "save_on": opts.save_on,
                },
            )
            self._index_error = self._index_run()
        run_id = self.run_dir.run_id
        previous = self._install_signal_handlers()
        self.view = open_view(self.console)  # live view: rich panel on a terminal
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        heartbeat.start()
        try:
            try:
                self._start_agents()
                self._trace("every agent connected")
                self._await_hellos()
                self._trace("every hello received")
                if self.interrupt is None:
                    self._send_specs(run_id)
                    self._trace("specs sent")
                else:
                    self._stop_all(0.0)
                self._stream()
                self._trace("every agent done")
            finally:
                self.view.set_status("interrupted" if self.interrupt is not None else "ended")
                self.view.close()  # live view: final panel stays; outcome printed below it
                self._stop_heartbeat.set()
                self._close_links()
                self._trace("connections closed")
                for state in self.ranks.values():
                    state.log.close()
                if self.metrics is not None:
                    self.metrics.close()
            return self._finish()
        except BaseException as err:
            if not (isinstance(err, WorkerFailed) and self.restarts_left > 0):
                self._record_end(err)  # a failure that `launch` restarts is not the run's end
            raise
        finally:
            self._restore_signal_handlers(previous)

    def _index_run(self) -> str:
        """Index the new run, so `zlaunch ls/logs/...` find it from anywhere; '' or why not."""
        try:
            register(self.run_dir.run_id, self.run_dir.path)
            return ""
        except OSError as err:
            return f" (not indexed: {err.strerror or err}; use --log-dir to find it)"

    # ---- phases ---------------------------------------------------------------------------

    def _start_agents(self) -> None:
        def on_open(index: int, link: Link) -> None:
            self._trace(f"connected to {self.hosts[index].display}")
            self.links[index] = link
            threading.Thread(
                target=self._read_agent, args=(index, link), name=f"agent-{index}", daemon=True
            ).start()

        open_links(
            self.hosts,
            lambda _h: agent_argv(self.options.python),
            self.options.ssh,
            on_open=on_open,
            launcher=self.options.launcher,
            launcher_args=self.options.launcher_args,
        )

    def _read_agent(self, index: int, link: Link) -> None:
        # A frame that cannot be read is reported and skipped: the agent and its ranks are
        # fine, and dropping them for one bad frame would stop the whole job.
        reader = protocol.FrameReader(
            on_bad=lambda err: self.events.put(("garbled", index, str(err)))
        )
        while True:
            chunk = link.read(1 << 18)
            if not chunk:
                break
            for frame in reader.feed(chunk):
                self.events.put(("frame", index, frame))
        for frame in reader.finish():
            self.events.put(("frame", index, frame))
        self.events.put(("eof", index, None))

    def _await_hellos(self) -> None:
        deadline = time.monotonic() + max(self.options.ssh.timeout, 10.0) + 5.0
        while not all(self.hellos) and self.interrupt is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                late = [self.hosts[i].display for i, h in enumerate(self.hellos) if h is None]
                raise LaunchError(f"no answer from the agent on {', '.join(late)}")
            try:
                kind, index, payload = self.events.get(timeout=min(remaining, 0.25))
            except queue.Empty:
                continue
            if kind == "frame" and isinstance(payload, protocol.Hello):
                self.hellos[index] = payload
            elif kind == "garbled":
                self.console.note(f"{self.hosts[index].display}: {payload}", error=True)
            elif kind == "eof":
                link = self.links[index]
                tail = link.stderr_tail() if link else []
                status = link.wait(1.0) if link else None
                detail = "\n".join(f"    {line}" for line in tail[-10:])
                raise LaunchError(
                    f"the agent on {self.hosts[index].display} ended before it started"
                    + (f" (exit status {status})" if status is not None else "")
                    + (f":\n{detail}" if detail else ""),
                    hint=f"check that {self.options.python} exists there and can import zlaunch"
                    " (--python sets the interpreter on the nodes)",
                )
            elif kind == "signal":
                self._on_signal(payload)

    def _rendezvous(self) -> tuple[str, int]:
        first = self.hellos[0]
        if self.options.master_addr:
            addr = self.options.master_addr
        elif all(h.is_local for h in self.hosts):
            addr = "127.0.0.1"
        elif self.hosts[0].is_local:
            # This machine is the master: use the address the other hosts see us coming from.
            seen = [h.client_addr for h in self.hellos if h and h.client_addr]
            addr = seen[0] if seen else self.hosts[0].name
        else:
            addr = first.addr or self.hosts[0].name
        return addr, self.options.master_port or first.port

    def _send_specs(self, run_id: str) -> None:
        master_addr, master_port = self._rendezvous()
        plan = build_plan(
            self.options,
            self.hosts,
            master_addr=master_addr,
            master_port=master_port,
            run_id=run_id,
            attempt=self.attempt,
        )
        self.plan = plan
        self.metrics = self.run_dir.open_metrics()
        for node in plan.nodes:
            for worker in node.workers:
                self.ranks[worker.rank] = RankState(
                    rank=worker.rank,
                    local_rank=worker.local_rank,
                    host=node.host.display,
                    node=node.node_rank,
                    log=self.run_dir.open_rank_log(self.attempt, node.host.display, worker.rank),
                )
        self.run_dir.update(status=RunStatus.RUNNING, plan=plan_record(plan))
        # --- live view and per-rank state ---
        expected: dict[str, int] = {}
        for state in self.ranks.values():
            expected[state.host] = expected.get(state.host, 0) + 1
        self.view.start(run_id, expected)
        self._record_ranks()
        # --- end live view ---
        specs = [
            encode_spec(
                node_spec(
                    node,
                    master_addr=master_addr,
                    grace=self.options.grace_period,
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                ),
                node.host.display,
            )
            for node in plan.nodes
        ]  # every spec is checked before any is sent: a job starts on all nodes or none
        if self.attempt == 0:  # the run's id and where its logs are, as the ranks start
            self.console.note(f"run {run_id}  logs {self.run_dir.path}{self._index_error}")
        for index, spec in enumerate(specs):
            if not self.links[index].write(spec):
                self._agent_lost(index, "connection closed before the spec was sent")

    def _stream(self) -> None:
        while not all(self.agent_done):
            try:
                kind, index, payload = self.events.get(timeout=0.25)
            except queue.Empty:
                kind = None
            self.view.tick()  # live view: due line batches and panel refresh
            if kind in ("frame", "garbled") and index is not None:
                self._heard_from(index)
            if kind == "frame":
                self._on_frame(index, payload)
            elif kind == "garbled":
                self.console.note(f"{self.hosts[index].display}: {payload}", error=True)
            elif kind == "eof":
                if not self.agent_done[index]:
                    self._agent_lost(index, "connection to the agent lost")
            elif kind == "signal":
                self._on_signal(payload)
            self._watch_hang()
            self._watch_silence()
            if self.stop_started is not None:
                if time.monotonic() - self.stop_started > self.stop_grace + STOP_SLACK:
                    for i, done in enumerate(self.agent_done):
                        if not done:
                            self.console.note(
                                f"{self.hosts[i].display}: agent did not finish stopping; "
                                "dropping the connection",
                                error=True,
                            )
                            self.agent_done[i] = True
                    break

    # ---- frames ---------------------------------------------------------------------------

    def _on_frame(self, index: int, frame: protocol.Frame) -> None:
        if isinstance(frame, protocol.Out):
            state = self.ranks.get(frame.rank)
            if state is None:
                return
            lines = frame.lines
            data = b"\n".join(protocol.line_bytes(line) for line in lines)
            # partial: the last line continues in the next frame; the log keeps the worker's bytes
            state.log.write(data if frame.partial else data + b"\n")
            state.tail.extend(lines[-TAIL_LINES:])
            shown, bar, ended = self.progress.feed(state.rank, frame.stream, lines, frame.partial)
            self._on_output(state, frame.stream, bar, ended)
            shown, first_hidden = self.noise.keep(shown)
            for kind in first_hidden:
                self.console.note(kind.note)
            if frame.stream == protocol.STDERR:
                shown = self.stack_dumps.keep(state.rank, shown, time.monotonic())
            if shown:
                self.console.lines(state.host, state.rank, frame.stream, shown)
            if self.capture is not None:  # a hang was declared: the stacks come as output
                self.capture.lines(state.rank, lines, time.monotonic())
        elif isinstance(frame, protocol.Event):
            self._on_events(frame.rank, frame.events)
        elif isinstance(frame, protocol.Started):
            state = self.ranks.get(frame.rank)
            if state is not None:
                state.pid = frame.pid
                self.view.rank_started(state.rank, state.host)  # live view
                self._record_ranks()
        elif isinstance(frame, protocol.Exited):
            self._on_exit(frame)
        elif isinstance(frame, protocol.Error):
            self.console.note(f"{self.hosts[index].display}: {frame.msg}", error=True)
            if frame.cause == protocol.CAUSE_NO_HEARTBEAT:
                # The node no longer hears the controller: for --min-nodes it is lost.
                self.lost_hosts.add(self.hosts[index].name)
        elif isinstance(frame, protocol.Bye):
            self.agent_done[index] = True

    def _on_events(self, rank: int, events: list[Any]) -> None:
        state = self.ranks.get(rank)
        for event in events:
            if isinstance(event, dict) and (
                event.get("kind") == protocol.RUNTIME_READY
                or (event.get("kind") == "metrics" and event.get("source") == "engine")
            ):
                self.hang.progress(time.monotonic())  # set-up done, or a step boundary
            if isinstance(event, dict) and event.get("kind") == "metrics" and self.metrics:
                row = {"time": time.time(), "rank": rank, "host": state.host if state else None}
                row.update(event)
                self.metrics.write(json.dumps(row) + "\n")
                self.metrics.flush()
                # --- live view ---
                if isinstance(event.get("step"), int) and event.get("source") != "user":
                    self.last_step = event["step"]
                self.view.metrics(rank, row["host"], row)
                # --- end live view ---
            elif isinstance(event, dict) and event.get("kind") == protocol.STACKS_READY:
                if state is not None and not state.stacks:
                    state.stacks = True
                    self._record_ranks()

    def _on_output(self, state: RankState, stream: str, bar: str | None, ended: bool) -> None:
        """A rank wrote something: its progress line and last-output time (panel, status)."""
        now = time.time()
        self.rank_output_at[state.rank] = now
        self.view.output_seen(state.rank)
        if bar is not None:
            self.rank_progress[state.rank] = bar
            self.view.progress(state.rank, state.host, stream, bar)
        elif ended:
            self.view.progress(state.rank, state.host, stream, None)
        if now - self.ranks_written >= 1.0:  # ranks.json: at most once a second for output
            self._record_ranks()

    # --- per-rank state in ranks.json (read by `zlaunch status`) ---
    def _record_ranks(self) -> None:
        if self.run_dir is None:
            return
        rows = []
        for state in sorted(self.ranks.values(), key=lambda s: s.rank):
            if state.lost:
                what = "lost"
            elif state.exited:
                what = "exited"
            else:
                what = "running" if state.pid else "starting"
            rows.append(
                {
                    "rank": state.rank,
                    "local_rank": state.local_rank,
                    "host": state.host,
                    "node_rank": state.node,
                    "pid": state.pid,
                    "state": what,
                    "exit_code": state.exit_code,
                    "signal": state.signal,
                    "signal_name": _signal_name(state.signal),
                    "stacks": state.stacks,
                    "last_step": self.exit_steps.get(state.rank, self.last_step)
                    if state.exited
                    else self.last_step,
                    "progress": self.rank_progress.get(state.rank),
                    "last_output": self.rank_output_at.get(state.rank),
                }
            )
        self.ranks_written = time.time()
        try:
            self.run_dir.write_ranks(self.attempt, rows)
        except OSError as err:
            self.console.note(f"cannot write ranks.json: {err}", error=True)

    # --- end per-rank state ---

    def _on_exit(self, frame: protocol.Exited) -> None:
        state = self.ranks.get(frame.rank)
        if state is None:
            return
        state.signal = frame.signal
        state.exit_code = frame.exit_code
        self._trace(f"rank {state.rank} exited with {state.exit_code}")
        if frame.pid:
            state.pid = frame.pid
        # --- live view and per-rank state ---
        self.exit_steps[state.rank] = self.last_step
        self.view.rank_exited(state.rank, state.host, state.exit_code)
        self._record_ranks()
        # --- end live view ---
        if state.exit_code != 0 and self.stop_started is None:
            self.failures.append(self._failure_of(state))
            self.console.note(
                f"rank {state.rank} on {state.host} {self._exit_words(state)}; "
                f"stopping all {len(self.ranks)} ranks",
                error=True,
            )
            self._stop_all(self.options.grace_period)

    def _exit_words(self, state: RankState) -> str:
        if state.signal:
            return f"was killed by {_signal_name(state.signal)} (exit code {state.exit_code})"
        return f"exited with code {state.exit_code}"

    def _failure_of(self, state: RankState, message: str | None = None) -> dict[str, Any]:
        return {
            "host": state.host,
            "rank": state.rank,
            "local_rank": state.local_rank,
            "node_rank": state.node,
            "pid": state.pid,
            "exit_code": state.exit_code,
            "signal": state.signal,
            "signal_name": _signal_name(state.signal),
            "time": _now_iso(),
            "message": message,
            "last_lines": list(state.tail),
        }

    def _agent_lost(self, index: int, why: str) -> None:
        self.agent_done[index] = True
        self.lost_hosts.add(self.hosts[index].name)
        link = self.links[index]
        tail = link.stderr_tail()[-5:] if link else []
        message = why + (": " + " | ".join(tail) if tail else "")
        lost = [s for s in self.ranks.values() if s.node == index and not s.exited]
        for state in lost:
            state.exit_code = EXIT_LOST_AGENT
            state.lost = True
            self.exit_steps[state.rank] = self.last_step  # per-rank state
            self.view.rank_lost(state.rank, state.host)
        if lost:
            self._record_ranks()
        if lost and self.stop_started is None:
            self.failures.append(self._failure_of(lost[0], message))
            self.console.note(f"{self.hosts[index].display}: {message}", error=True)
            self._stop_all(self.options.grace_period)

    # ---- silent agents ----------------------------------------------------------------------

    def _heard_from(self, index: int) -> None:
        if not self.heard:
            self.heard = [time.monotonic()] * len(self.hosts)
        self.heard[index] = time.monotonic()

    def _watch_silence(self) -> None:
        """An agent that sends nothing (not even heartbeat echoes) for AGENT_SILENCE_TIMEOUT
        is lost: its node's link is down or cut off, or the host stopped."""
        if not self.heard:
            return
        now = time.monotonic()
        for index, heard in enumerate(self.heard):
            if not self.agent_done[index] and now - heard > AGENT_SILENCE_TIMEOUT:
                self._agent_lost(
                    index,
                    f"no word from the agent for {now - heard:.0f} s (network down or the host "
                    "stopped)",
                )

    # ---- hang watchdog --------------------------------------------------------------------

    def _watch_hang(self) -> None:
        """Declare a hang when no rank made progress for --hang-timeout; report it once the
        ranks' stacks are in (or did not come)."""
        now = time.monotonic()
        if self.capture is not None:
            if self.capture.done(now):
                self._report_hang()
            return
        if self.stop_started is not None or self.interrupt is not None or not self.hang.due(now):
            return
        self.hang.fired = True
        self._hang_idle = now - self.hang.last
        self.console.note(
            f"no rank reached a step boundary for {self._hang_idle:.0f} s (--hang-timeout "
            f"{self.options.hang_timeout:g}); collecting every rank's stacks, then stopping",
            error=True,
        )
        self._request_stacks()
        self.capture = StackCapture(
            [s.rank for s in self.ranks.values() if s.stacks and not s.exited], now
        )

    def _report_hang(self) -> None:
        capture, self.capture = self.capture, None
        running = {s.rank: s.host for s in self.ranks.values() if not s.exited}
        silent = [s.rank for s in self.ranks.values() if not s.stacks and not s.exited]
        self.failures.append(
            hang_failure(
                self.options.hang_timeout, self._hang_idle, running, capture.dumps(), silent
            )
        )
        self._stop_all(self.options.grace_period)

    # ---- --save-on: forward the save signal to every worker ----------------------------

    def _request_stacks(self) -> None:
        """Ask every rank whose runtime listens for it to dump its threads' stacks to stderr."""
        ready = [s for s in self.ranks.values() if s.stacks and not s.exited]
        others = sorted(s.rank for s in self.ranks.values() if not s.stacks and not s.exited)
        self.console.note(
            f"stack dump requested from {len(ready)} rank(s) by `zlaunch stacks` (not a crash; "
            "the dumps go to the rank logs, that command prints them grouped)"
            + (
                f"; ranks {rank_ranges(others)} cannot dump (not Python, or still starting)"
                if others
                else ""
            )
        )
        self.stack_dumps.expect((s.rank for s in ready), time.monotonic())
        sig = int(protocol.STACKS_SIGNAL)
        for index, link in enumerate(self.links):
            ranks = [s.rank for s in ready if s.node == index]
            if link is not None and ranks and not self.agent_done[index]:
                link.write(protocol.encode(protocol.Signal(sig, ranks)))

    def _forward_save_signal(self, signum: int) -> None:
        name = _signal_name(signum)
        if not self.options.checkpoint_dir:
            self.console.note(f"{name} ignored: no --checkpoint-dir to save to", error=True)
            return
        if self.stop_started is not None or self.save_requested:
            return
        self.save_requested = True
        self.console.note(f"{name}: every rank saves a checkpoint at its next step, then exits")
        data = protocol.encode(protocol.Signal(int(signum)))
        for i, link in enumerate(self.links):
            if link is not None and not self.agent_done[i]:
                link.write(data)

    # ---- stopping -------------------------------------------------------------------------

    def _stop_all(self, grace: float) -> None:
        """Tell every agent to stop its workers; each one TERMs, waits ``grace``, KILLs."""
        first = self.stop_started is None
        if first:
            self.stop_started = time.monotonic()
            if self.run_dir is not None:
                self.run_dir.update(status=RunStatus.STOPPING)
            self.view.set_status("stopping")  # live view
        self.stop_grace = grace if first else min(self.stop_grace, grace)
        data = protocol.encode(protocol.Stop(grace))
        senders = [
            threading.Thread(target=link.write, args=(data,), daemon=True)
            for i, link in enumerate(self.links)
            if link is not None and not self.agent_done[i]
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(timeout=2.0)

    def _on_signal(self, signum: int) -> None:
        if signum == self.save_signal:  # --save-on: every rank saves at its next step, exits 0
            self._forward_save_signal(signum)
            return
        if signum == protocol.STACKS_SIGNAL:  # `zlaunch stacks`
            self._request_stacks()
            return
        if signum == signal.SIGINT:
            self.sigint_count += 1
            if self._save_on_ctrl_c():
                return
        if self.interrupt is None:
            self.interrupt = signum
            name = _signal_name(signum)
            self.console.note(
                f"{name}: stopping all ranks (grace {self.options.grace_period:g}s; "
                f"Ctrl-C again to kill now){self._no_save_words()}",
                error=True,
            )
            self._stop_all(self.options.grace_period)
        elif signum == signal.SIGINT and self.sigint_count >= 2:
            self.console.note("killing all ranks now", error=True)
            self._stop_all(0.0)

    def _save_on_ctrl_c(self) -> bool:
        """The first Ctrl-C of a job with --checkpoint-dir saves, then stops (README: Stopping)."""
        if (
            self.sigint_count != 1
            or self.interrupt is not None
            or self.stop_started is not None
            or self.save_requested
            or not self.options.checkpoint_dir
            or self.save_signal is None
            or self.plan is None
        ):
            return False
        self.save_requested = True
        self.console.note(
            "Ctrl-C: every rank saves a checkpoint at its next step, then exits "
            "(Ctrl-C again to stop now without saving)",
            error=True,
        )
        data = protocol.encode(protocol.Signal(int(self.save_signal)))
        for i, link in enumerate(self.links):
            if link is not None and not self.agent_done[i]:
                link.write(data)
        return True

    def _no_save_words(self) -> str:
        if self.save_requested:
            return "; no checkpoint is written now"
        if not self.options.checkpoint_dir:
            return "; no checkpoint is written (--checkpoint-dir makes Ctrl-C save first)"
        if self.save_signal is None:
            return "; no checkpoint is written (--save-on none)"
        return ""

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        previous[protocol.STACKS_SIGNAL] = signal.signal(
            protocol.STACKS_SIGNAL, lambda s, _f: self.events.put(("signal", None, s))
        )
        if self.save_signal is not None:
            previous[self.save_signal] = signal.signal(
                self.save_signal, lambda s, _f: self.events.put(("signal", None, s))
            )
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(
                signum, lambda s, _f: self.events.put(("signal", None, s))
            )
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _heartbeat_loop(self) -> None:
        beat = protocol.encode(protocol.Heartbeat())
        while not self._stop_heartbeat.wait(HEARTBEAT_INTERVAL):
            for i, link in enumerate(self.links):
                if link is not None and not self.agent_done[i]:
                    link.write(beat)

    def _close_links(self) -> None:
        closers = [
            threading.Thread(target=link.terminate, args=(2.0,), daemon=True)
            for link in self.links
            if link is not None
        ]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(timeout=5.0)

    # ---- outcome --------------------------------------------------------------------------

    def _ended_by_scheduler(self) -> str | None:
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

    def _finish(self) -> int:
        ended = self._ended_by_scheduler() if self.failures or self.interrupt else None
        if ended is not None:
            # Not a crash: the ranks died of the SIGTERM Slurm sent them.
            code = 128 + signal.SIGTERM
            self._record_end(None, status=RunStatus.INTERRUPTED, code=code)
            raise Interrupted(f"{ended}; all ranks stopped", exit_code=code)
        if self.interrupt is not None:
            code = 128 + self.interrupt
            self._record_end(None, status=RunStatus.INTERRUPTED, code=code)
            raise Interrupted(
                f"stopped by {_signal_name(self.interrupt)}; all ranks stopped", exit_code=code
            )
        if self.failures:
            root = self.failures[0]
            code = root["exit_code"]
            stopped = [
                s.rank
                for s in self.ranks.values()
                if s.rank not in {f["rank"] for f in self.failures}
                and (s.exit_code != 0 or s.signal)
            ]
            report = {
                "run_id": self.run_dir.run_id,
                "reason": root.get("reason", "rank failed"),
                "exit_code": code,
                "summary": f"hung, {len(self.ranks)} ranks stopped"
                if root.get("reason") == "hang"
                else f"{len(self.failures)} failed rank(s) of {len(self.ranks)}",
                "root_cause": root,
                "failures": self.failures,
                "stopped_ranks": stopped,
                "log_dir": self.run_dir.path,
            }
            self.run_dir.write_failure(report)
            self.console.failure_report(report)
            if self.restarts_left > 0:
                self.run_dir.update(status=RunStatus.RESTARTING)
            else:
                self._record_end(None, status=RunStatus.FAILED, code=code)
            cause = f"rank {root['rank']} on {root['host']}"
            if root.get("reason") == "hang":
                cause, what = "the job", "hung: " + root["message"]
            elif root["signal"]:
                what = f"was killed by {root['signal_name']}"
            elif root.get("message"):
                what = root["message"]
            else:
                what = f"exited with code {code}"
            raise WorkerFailed(f"{cause} {what}; job stopped (exit code {code})", exit_code=code)
        if any(not s.exited for s in self.ranks.values()):
            self._record_end(None, status=RunStatus.FAILED, code=EXIT_LOST_AGENT)
            raise LaunchError("some ranks never reported an exit")
        self._record_end(None, status=RunStatus.SUCCEEDED, code=0)
        return 0

    def _record_end(
        self, err: BaseException | None, *, status: str | None = None, code: int | None = None
    ) -> None:
        if self.run_dir is None:
            return
        try:
            record = self.run_dir.record()
            if record.get("end_time") is not None:
                return
            if err is not None:
                status = RunStatus.FAILED
                code = getattr(err, "exit_code", 1)
                record["error"] = getattr(err, "message", str(err))
            record.update(status=status, exit_code=code, end_time=time.time())
            self.run_dir.write_record(record)
        except (OSError, ValueError):
            pass


def launch(options: LaunchOptions) -> int:
    """Run the job described by ``options``; 0 when every rank exited 0.

    Raises WorkerFailed (the failing rank's code), Interrupted (130/143), HostUnreachable or
    LaunchError (1) otherwise, after everything it started is stopped.
    """
    console = Console(color=options.color, ranks=options.ranks_filter)
    try:
        return _launch_attempts(options, console)
    finally:
        console.close()  # everything queued for the console is written before the exit


def _launch_attempts(options: LaunchOptions, console: Console) -> int:
    # --- checkpoints: --max-restarts restarts every rank after a failure, same run dir;
    # with --min-nodes, on the hosts that are left (zlaunch/elastic.py) ---
    job = Job(options, console)
    restarts_left = options.max_restarts
    reach_deadline: float | None = None
    while True:
        job.restarts_left = restarts_left
        try:
            code = job.run()
        except HostUnreachable as err:
            # A restart may come while a node is still out of reach (a route or link that is
            # coming back): try again for a while before giving up on the job.
            if reach_deadline is None:
                raise
            previous = job
            next_options = previous.options
            if time.monotonic() > reach_deadline:
                unreachable = getattr(err, "hosts", None)
                if options.min_nodes is None or not unreachable:
                    raise
                # Still out of reach: with --min-nodes, go on without those hosts.
                next_options = options_after_loss(options, previous.options, unreachable)
                job.console.note(
                    f"{err.message}; going on without {', '.join(unreachable)} on "
                    f"{', '.join(h.name for h in next_options.hosts)} "
                    f"(world {next_options.world_size})",
                    error=True,
                )
                reach_deadline = time.monotonic() + RESTART_REACH_WINDOW
                job = Job(next_options, previous.console)
                job.run_dir, job.attempt = previous.run_dir, previous.attempt
                _record_attempt(job, options, f"{err.message}; went on without them")
                job.run_dir.update(status=RunStatus.STARTING, end_time=None, exit_code=None)
                continue
            else:
                job.console.note(f"{err.message}; trying again", error=True)
                time.sleep(RESTART_REACH_RETRY)
            job = Job(next_options, previous.console)
            job.run_dir, job.attempt = previous.run_dir, previous.attempt
            job.run_dir.update(status=RunStatus.STARTING, end_time=None, exit_code=None)
            continue
        except WorkerFailed as err:
            if restarts_left <= 0:
                raise
            restarts_left -= 1
            previous = job
            attempt_options = previous.options
            where = "all ranks"
            if options.min_nodes is not None and previous.lost_hosts:
                try:
                    attempt_options = options_after_loss(
                        options, previous.options, previous.lost_hosts
                    )
                except LaunchError as stop:
                    previous.run_dir.update(status=RunStatus.FAILED, error=stop.message)
                    raise
                names = ", ".join(h.name for h in attempt_options.hosts)
                where = (
                    f"on {names} without {', '.join(sorted(previous.lost_hosts))} "
                    f"(world {attempt_options.world_size})"
                )
            job = Job(attempt_options, previous.console)
            job.run_dir, job.attempt = previous.run_dir, previous.attempt + 1
            reach_deadline = time.monotonic() + RESTART_REACH_WINDOW
            _record_attempt(job, options, err.message)
            job.run_dir.update(status=RunStatus.STARTING, end_time=None, exit_code=None)
            resume = " from the latest checkpoint" if options.checkpoint_dir else ""
            job.console.note(
                f"{err.message}; restarting {where}{resume} (attempt {job.attempt}, "
                f"{restarts_left} restart(s) left)",
                error=True,
            )
            continue
        if job.save_requested and options.checkpoint_dir:
            job.console.note(
                f"saved checkpoint {_latest_checkpoint(options.checkpoint_dir)}; "
                "continue with the same command plus --resume"
            )
        return code


def _record_attempt(job: Job, first: LaunchOptions, reason: str) -> None:
    """run.json's "attempts": each attempt's hosts, world size, batch and why it started."""
    attempts = job.run_dir.record().get("attempts") or [
        {
            "attempt": 0,
            "hosts": [h.name for h in first.hosts],
            "world_size": first.world_size,
            "batch": first.batch,
            "reason": "start",
        }
    ]
    attempts = [a for a in attempts if a["attempt"] != job.attempt]  # a retried start
    attempts.append(
        {
            "attempt": job.attempt,
            "hosts": [h.name for h in job.options.hosts],
            "world_size": job.options.world_size,
            "batch": job.options.batch,
            "reason": reason,
        }
    )
    job.run_dir.update(attempts=attempts)


def _latest_checkpoint(directory: str) -> str:
    try:
        with open(os.path.join(directory, "latest"), encoding="utf-8") as f:
            return os.path.join(directory, f.read().strip())
    except OSError:
        return f"in {directory} (no 'latest' file: did the ranks save?)"
