"""Orchestration of a job: agents everywhere -> plan -> specs -> live output -> the outcome,
and the attempts after it.

``launch(options)`` is the whole life of a job (ARCHITECTURE.md, "Life of a job"):

1. create the run directory (zlaunch/rundir/recorder.py); start one agent per host in parallel
   (zlaunch/launcher/agent_links.py over a transport: local subprocess, SSH, Slurm, mpirun);
2. collect every agent's hello, pick the rendezvous (first host: ``--master-addr`` or the
   address its SSH connection came in on, and a port it found free; 127.0.0.1 only when every
   host is local), build the plan and send each agent its node's spec;
3. stream: output lines to the console and the rank logs (zlaunch/launcher/rank_output.py), metrics to
   ``metrics.jsonl``, heartbeats to every agent;
4. every frame, signal and timer becomes an event for the attempt's state machine
   (zlaunch/launcher/state.py), which decides: the first worker to exit non-zero (or an agent lost,
   or a hang) stops every rank on every host in parallel; SIGINT/SIGTERM to zlaunch does the
   same, a second SIGINT kills at once. This module carries out its actions. The attempt ends
   when every agent has said bye (its workers gone);
5. after a failed attempt, zlaunch/launcher/restart_policy.py decides: restart, restart without lost
   hosts (zlaunch/launcher/elastic.py), or end.

Only this job's agents and their process groups are ever signalled, so other jobs on the same
hosts are untouched. One thread (the caller's) owns the console, the files and the machine;
per-agent reader threads only decode frames into a queue.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import threading
import time
from typing import Any

from zlaunch.console import Console, JobView, PlainView, open_view
from zlaunch.errors import (
    HostUnreachable,
    Interrupted,
    LaunchError,
    UsageError,
    WorkerFailed,
    assert_never,
)
from zlaunch.job import (
    THREADS_ENV,
    Host,
    Launcher,
    LaunchOptions,
    Plan,
    build_plan,
    dropped_pythonpath_entries,
    encode_spec,
    node_spec,
    threads_words,
)
from zlaunch.launcher.agent_links import AgentLinks, FrameIn, Garbled, LinkClosed, SignalIn
from zlaunch.launcher.elastic import options_after_grow, options_after_loss
from zlaunch.launcher.first_contact import (
    PROGRESS_AFTER,
    FirstContact,
    Judgement,
    connecting_text,
    hello_bound,
    hello_deadline,
)
from zlaunch.launcher.hang import HangWatch, StackCapture, hang_failure
from zlaunch.launcher.hang_records import decode_records
from zlaunch.launcher.host_probe import HostfileWatch, HostProber, ssh_probe
from zlaunch.launcher.open_files import ensure_open_files
from zlaunch.launcher.rank_output import RankOutput
from zlaunch.launcher.restart_policy import GiveUp, GoOnWithout, Restart, RestartPolicy, Retry
from zlaunch.launcher.slow_nodes import slow_kept_words, slow_why, why_kept
from zlaunch.launcher.state import (
    Action,
    AgentCutOff,
    AgentFinished,
    AgentLost,
    AttemptMachine,
    AttemptPlanned,
    CaptureStacks,
    CheckpointReported,
    CheckpointState,
    Ending,
    GroupReported,
    HangDue,
    HangPhase,
    HangStacksIn,
    HostReturned,
    Note,
    Outcome,
    Policy,
    PreemptionNotice,
    RankExited,
    RankSlot,
    RankStarted,
    RecordFleet,
    RecordRanks,
    RequestStacks,
    SaveAcknowledged,
    SaveReady,
    SetStatus,
    SignalRanks,
    SignalReceived,
    SlowHost,
    StacksReady,
    StepReached,
    StopRanks,
    Tick,
)
from zlaunch.launcher.stragglers import Finding, StragglerWatch, slow_text
from zlaunch.rundir import FailureReport, Recorder, RunStatus
from zlaunch.wire import events, frames, liveness, protocol

__all__ = ["launch", "Job", "Attempt", "HEARTBEAT_TIMEOUT", "AGENT_SILENCE_TIMEOUT"]

HEARTBEAT_TIMEOUT = liveness.heartbeat_timeout(1)
AGENT_SILENCE_TIMEOUT = liveness.agent_silence_timeout(1)
"""Seconds without a byte from an agent (it sends a heartbeat every second) before the
controller takes its node as lost: a link down, a partition, a host that stopped. Longer than
the agent's own heartbeat timeout, so by then that agent has already stopped its workers if it
still runs. Both grow with the job's ranks (zlaunch/wire/liveness.py); these are a small job's."""
POLL = 0.25
PLAIN_PROGRESS_INTERVAL = 5.0
"""Seconds between two lines saying which agents are still starting, on a plain console."""
LIVE_PROGRESS_INTERVAL = 1.0
"""The same line, updated in place on the live panel."""
MAX_BUSY_BATCH = 100
"""Step times read from one step_busy event at most (the runtime sends 10)."""
WATCH_INTERVAL = 0.05
"""Seconds between two looks at the timers (silent agents, a hang, a stop's grace) while
frames keep coming; an idle loop looks after every POLL."""


class Attempt:
    """One attempt of a job: its agents, its plan, its event loop. ``run()`` gives the
    outcome once every agent is done; LaunchError (HostUnreachable) if it could not start."""

    def __init__(
        self,
        options: LaunchOptions,
        console: Console,
        recorder: Recorder,
        number: int = 0,
        prober: HostProber | None = None,
        grow_check: Any = None,
    ):
        self.options = options
        self.prober = prober
        self.grow_check = grow_check
        """hosts -> None when the job can run with them added, else why not (the batch)."""
        self._cannot_join_said: set[str] = set()
        """The job's probe of hosts that may join (--max-nodes); None: the job never grows."""
        self.offered: dict[str, Host] = {}
        """Hosts handed to the machine as able to join, by display name."""
        self.fleet_save_at: float | None = None
        """When the ranks were first asked to save for a fleet change (what a grow costs)."""
        self.hosts = options.hosts
        self.console = console
        self.recorder = recorder
        self.number = number
        self.save_signal = signal.Signals[options.save_on] if options.save_on else None
        self.machine = AttemptMachine([h.display for h in self.hosts], _policy_of(options))
        self.links = AgentLinks(
            self.hosts,
            lambda node: self.machine.agent_done[node],
            self._trace,
            note=lambda what: console.note(what, error=True),
            say=console.note,
        )
        self.hellos: list[frames.Hello | None] = [None] * len(self.hosts)
        self.view: JobView = PlainView(console)
        self.output = RankOutput(console, self.view, options.collapse)
        self.plan: Plan | None = None
        self.hang = HangWatch(options.hang_timeout)
        self.bad_metrics = 0
        """Metrics events with a field of a wrong type or range (named once, then counted)."""
        self.refused_events = 0
        """Other objects on an events fd that are not events (named once, then counted)."""
        self.mismatches: set[tuple] = set()  # (group, seq) already said
        self.stragglers: StragglerWatch | None = None
        """Each rank's own step time scored (zlaunch/launcher/stragglers.py), from the first
        step_busy event on."""
        self._bad_records_said: set[int] = set()  # ranks whose unreadable records were said
        self._kept_said: set[str] = set()  # slow hosts said to stay in (--slow-node exclude)
        self.ranks_dirty = False
        """ranks.json is behind the machine's rank states (written within a second)."""
        self._trace_start = time.monotonic() if os.environ.get("ZLAUNCH_TRACE") else None

    def _trace(self, what: str) -> None:
        """Phase timings on stderr with ZLAUNCH_TRACE=1 (where does launch time go?)."""
        if self._trace_start is not None:
            self.console.note(f"trace {time.monotonic() - self._trace_start:7.3f}s {what}")

    # ---- the attempt ----------------------------------------------------------------------

    def run(self) -> Outcome:
        self._trace("start")
        previous = _route_signals(self.links.queue, self.save_signal)
        self.view = self.output.view = open_view(self.console)  # rich panel on a terminal
        outcome: Outcome | None = None
        try:
            self._open_links()
            self._trace("every agent connected")
            self._await_hellos()
            self._trace("every hello received")
            if self.machine.interrupt is None:
                self._send_specs()
                self._trace("specs sent")
            self._stream()
            self._trace("every agent done")
        finally:
            if self.ranks_dirty:
                self._record_ranks(now=True)
            self.links.close()
            self._trace("connections closed")
            self.output.close()
            if self.bad_metrics > 1:
                self.console.note(f"{self.bad_metrics} malformed metrics events in all", error=True)
            if self.refused_events > 1:
                self.console.note(f"{self.refused_events} refused events in all", error=True)
            if self.stragglers is not None and self.stragglers.slow:
                self.console.note(f"at the end, {slow_text(self.stragglers.slow)}")
            if self.machine.done:
                ended = None
                if self.machine.failures or self.machine.interrupt is not None:
                    ended = self.links.ended_by_scheduler()
                outcome = self.machine.outcome(ended)
            self.view.set_status(outcome.status if outcome else RunStatus.FAILED)
            self.view.close()  # the final panel stays; the outcome is printed below it
            _restore_signals(previous)
        return outcome

    def _open_links(self) -> None:
        """Start every agent; while connections are still opening (slow logins), the console
        says how many are open, from a thread of its own (the caller's thread waits in the
        transport; nothing else draws meanwhile)."""
        stop = threading.Event()
        ticker = threading.Thread(
            target=self._say_connecting, args=(stop,), name="connecting", daemon=True
        )
        ticker.start()
        try:
            self.links.open(self.options)
        finally:
            stop.set()
            ticker.join()

    def _say_connecting(self, stop: threading.Event) -> None:
        plain = isinstance(self.view, PlainView)
        interval = PLAIN_PROGRESS_INTERVAL if plain else LIVE_PROGRESS_INTERVAL
        if stop.wait(PROGRESS_AFTER):
            return
        names = [host.display for host in self.hosts]
        while True:
            waiting = [names[i] for i, at in enumerate(self.links.opened_at) if at is None]
            if not waiting or stop.is_set():
                return
            self.view.starting(connecting_text(len(names) - len(waiting), len(names), waiting))
            if stop.wait(interval):
                return

    def _await_hellos(self) -> None:
        """Every agent's hello, each agent judged from its own connection's opening: silent
        past a deadline that grows with the hosts, it is probed; gone, it is named at once;
        still running, it is named as slow and waited for up to a bound
        (zlaunch/launcher/first_contact.py). Meanwhile the console says who has answered."""
        hosts, ssh_timeout = len(self.hosts), self.options.ssh.timeout
        contact = FirstContact(
            [host.display for host in self.hosts],
            hello_deadline(hosts, ssh_timeout),
            hello_bound(hosts, ssh_timeout),
        )
        opened = [at for at in self.links.opened_at if at is not None]
        for node, at in enumerate(self.links.opened_at):
            if at is not None:
                contact.opened(node, at)
        started = min(opened, default=time.monotonic())
        plain = isinstance(self.view, PlainView)
        interval = PLAIN_PROGRESS_INTERVAL if plain else LIVE_PROGRESS_INTERVAL
        try:
            while not contact.done and self.machine.interrupt is None:
                match self.links.next(POLL):
                    case FrameIn(node, frames.Hello() as hello):
                        self.hellos[node] = hello
                        contact.answered(node)
                    case FrameIn():
                        pass  # nothing but a hello comes before the specs
                    case Garbled(node, why):
                        self.console.note(f"{self.hosts[node].display}: {why}", error=True)
                    case LinkClosed(node):
                        raise _ended_before_start(self.options, self.links, node)
                    case SignalIn(signum):
                        self._handle(SignalReceived(signum))
                    case None:
                        pass
                    case unexpected:
                        assert_never(unexpected)
                if self.links.waiting():
                    continue  # frames first: a hello already read is no silence
                now = time.monotonic()
                self._judge_first_contact(contact, contact.look(now, self.links.running))
                line = contact.progress(now, started, interval)
                if line is not None:
                    self.view.starting(line)
        finally:
            self.view.starting("")

    def _judge_first_contact(self, contact: FirstContact, judged: Judgement) -> None:
        if judged.gone:
            node = judged.gone[0]
            status = self.links.links[node].wait(0.0) if self.links.links[node] else None
            detail = "\n".join(f"    {line}" for line in self.links.stderr_tail(node, 10))
            raise LaunchError(
                f"no answer from the agent on {contact.names(judged.gone)}: silent "
                f"{contact.deadline:.0f}s after its connection opened, and its process is "
                "no longer running"
                + (f" (exit status {status})" if status is not None else "")
                + (f":\n{detail}" if detail else ""),
                hint=f"check that {self.options.python} starts there and can import zlaunch"
                " (--python sets the interpreter on the nodes)",
            )
        if judged.overdue:
            raise LaunchError(
                f"no answer from the agent on {contact.names(judged.overdue)} within "
                f"{contact.bound:.0f}s of its connection, though its session is still open "
                "(no exit status came)",
                hint="something holds up the agent's start there (a login script, a slow or "
                "hung shared filesystem under Python): time it by hand with "
                f"ssh HOST {self.options.python} -c 'import zlaunch.agent'",
            )
        if judged.newly_slow:
            self.console.note(
                f"agent slow to start on {contact.names(judged.newly_slow)}: still running, "
                f"no hello {contact.deadline:.0f}s after connecting; waiting up to "
                f"{contact.bound:.0f}s"
            )

    def _send_specs(self) -> None:
        master_addr, master_port = rendezvous(self.options, self.hellos)
        run_id = self.recorder.run_id
        plan = build_plan(
            self.options,
            self.hosts,
            master_addr=master_addr,
            master_port=master_port,
            run_id=run_id,
            attempt=self.number,
            usable_cpus=[hello.cpus if hello else None for hello in self.hellos],
        )
        self.plan = plan
        specs = _encode_specs(plan, self.options)
        self.recorder.open_metrics()
        slots = []
        for node in plan.nodes:
            for worker in node.workers:
                host = node.host.display
                slots.append(RankSlot(worker.rank, worker.local_rank, host, node.node_rank))
                log = self.recorder.open_rank_log(self.number, host, worker.rank)
                self.output.add_rank(worker.rank, host, log, plan.world_size)
        self.recorder.planned(plan)
        self.view.start(run_id, dict(collections.Counter(slot.host for slot in slots)))
        self._handle(AttemptPlanned(tuple(slots)))
        if self.number == 0:  # the run's id and where its logs are, as the ranks start
            threads = _threads_words(self.options, plan, self.hellos)
            self.console.note(
                f"run {run_id}  logs {self.recorder.path}{self.recorder.index_error}"
                + (f"  threads {threads}" if threads else "")
            )
            api = self.options.deepspeed_api
            if api is not None:  # which runtime serves `import deepspeed` (--runtime)
                self.console.note(api.describe())
            if dropped_pythonpath_entries(self.options):
                self.console.note(
                    "PYTHONPATH has an empty entry, which Python reads as the working "
                    "directory: the ranks get PYTHONPATH without it (write . to mean the "
                    "working directory)"
                )
        for index, spec in enumerate(specs):
            if not self.links.send(index, spec):
                self._lose_agent(index, "connection closed before the spec was sent")

    def _stream(self) -> None:
        watched = 0.0
        while not self.machine.done:
            item = self.links.next(POLL)
            self.output.tick(time.monotonic())  # collapsed lines whose time has come
            self.view.tick()  # live view: due line batches and panel refresh
            match item:
                case FrameIn(node, frame):
                    self._on_frame(node, frame)
                case Garbled(node, why):
                    self.console.note(f"{self.hosts[node].display}: {why}", error=True)
                case LinkClosed(node):
                    if not self.machine.agent_done[node]:
                        self._lose_agent(node, "connection to the agent lost")
                case SignalIn(signum):
                    self._handle(SignalReceived(signum))
                case None:
                    pass
                case unexpected:
                    assert_never(unexpected)
            # The timers look at every agent: a few times a second, not once per frame (at
            # 1,024 agents and thousands of frames a second, that was most of the loop's time).
            # The rank logs are written when nothing waits, or with the timers while busy.
            now = time.monotonic()
            due = item is None or now - watched >= WATCH_INTERVAL
            if due or not self.links.waiting():
                self.recorder.write_logs()
            if due:
                watched = now
                self._watch(now)

    # ---- frames and timers become events ---------------------------------------------------

    def _on_frame(self, index: int, frame: frames.Frame) -> None:
        match frame:
            case frames.Out():
                self.output.lines(frame.rank, frame.stream, frame.lines, frame.partial)
                self._record_ranks()
            case frames.Event():
                self._on_events(frame.rank, frame.events)
            case frames.Started():
                if frame.rank in self.machine.ranks:
                    self.view.rank_started(frame.rank, self.output.hosts[frame.rank])
                    self._handle(RankStarted(frame.rank, frame.pid))
            case frames.Exited():
                self._on_exit(frame)
            case frames.Error():
                if frame.cause == protocol.CAUSE_PREEMPTED:
                    deadline = time.monotonic() + self.options.preemption_deadline
                    self._handle(PreemptionNotice(index, deadline, frame.msg))
                elif frame.cause == protocol.CAUSE_NO_HEARTBEAT:
                    # The node no longer hears the controller: a failure of that node (its
                    # ranks' SIGTERM exits that follow are not), lost for --min-nodes.
                    self._handle(AgentCutOff(index, frame.msg))
                else:
                    self.console.note(f"{self.hosts[index].display}: {frame.msg}", error=True)
            case frames.Bye():
                self._handle(AgentFinished(index))
            case (
                frames.Hello()
                | frames.Spec()
                | frames.Heartbeat()
                | frames.Stop()
                | frames.Signal()
            ):
                pass  # a second hello, or a frame only the controller sends: nothing to do
            case unexpected:
                assert_never(unexpected)

    def _on_exit(self, frame: frames.Exited) -> None:
        if frame.rank not in self.machine.ranks:
            return
        self._trace(f"rank {frame.rank} exited with {frame.exit_code}")
        if frame.exit_code != 0:
            self.output.rank_failed(frame.rank)  # its held lines before the note about it
        self.view.rank_exited(frame.rank, self.output.hosts[frame.rank], frame.exit_code)
        tail = self.output.tail(frame.rank)
        self._handle(RankExited(frame.rank, frame.pid, frame.code, frame.signal, tail))

    def _collectives(self, rank: int, event: events.Collectives) -> None:
        """A rank's collective records (its agent sends them with a stacks request), checked
        record by record: what is kept goes to the hang report and `zlaunch stacks`."""
        decoded = decode_records(event.records)
        note = decoded.note(rank)
        if event.unreadable is not None:  # its agent refused the rank's file
            note = f"rank {rank}'s collective records are left out: {event.unreadable[:200]}"
        if note is not None and rank not in self._bad_records_said:
            self._bad_records_said.add(rank)
            self.console.note(note, error=True)
        if not decoded.records:
            return  # nothing readable: the report says what it says of a rank without any
        if self.output.capture is not None:
            self.output.capture.collectives(rank, decoded.records)
        self.recorder.collectives(rank, {**events.encode(event), "records": decoded.records})

    def _on_events(self, rank: int, received: list[events.WorkerEvent]) -> None:
        for event in received:
            match event:
                case events.Metrics():
                    if event.source == "engine":
                        self.hang.progress(time.monotonic())  # a step boundary
                    if self.plan is not None:
                        self._on_metrics(rank, event)
                case events.RuntimeReady():
                    self.hang.progress(time.monotonic())  # set-up done
                case events.StepBusy():
                    if self.plan is not None:
                        self._busy(rank, event)
                case events.StacksReady():
                    self._handle(StacksReady(rank))
                case events.Collectives():
                    self._collectives(rank, event)
                case events.CollectiveMismatch():
                    self._mismatch(rank, event)
                case events.SaveAck():
                    self._handle(SaveAcknowledged(rank))
                case events.SaveReady():
                    self._handle(SaveReady(rank))
                case events.Checkpoint():
                    state = CheckpointState(event.state)
                    self._handle(CheckpointReported(rank, state, event.step, event.requested))
                case events.ProcessGroup():
                    self._handle(
                        GroupReported(
                            rank, event.size, event.accelerate, event.accelerate_processes
                        )
                    )
                case events.Invalid():
                    self._refused(rank, event)
                case events.StacksDumped():
                    pass  # the agent's business: it stops waiting to fall back
                case unexpected:
                    assert_never(unexpected)

    def _on_metrics(self, rank: int, event: events.Metrics) -> None:
        host = self.output.hosts.get(rank)
        row = {"time": time.time(), "rank": rank, "host": host, **event.row()}
        if self.stragglers is not None and self.stragglers.said:
            # what is slow now (None once it recovered): the panel, status, the file
            row["slow"] = slow_text(self.stragglers.slow) or None
        self.recorder.metrics(row)
        if event.source != "user":
            self._handle(StepReached(event.step))
        self.view.metrics(rank, host, row)

    def _refused(self, rank: int, event: events.Invalid) -> None:
        """An event its agent refused (or this controller, from the frame): a malformed metrics
        event is named once, then counted, as is any other refused event."""
        if event.about == protocol.METRICS_EVENT:
            self.bad_metrics += 1
            if self.bad_metrics == 1:
                what = "kept without the bad fields" if event.kept else "dropped"
                self.console.note(
                    f"rank {rank} sent a malformed metrics event ({event.text}): {what}; "
                    "later ones are counted, not shown",
                    error=True,
                )
            return
        self.refused_events += 1
        if self.refused_events == 1:
            self.console.note(
                f"rank {rank} wrote something on its events fd that is not an event "
                f"({event.text[:300]}): refused; later ones are counted, not shown",
                error=True,
            )

    def _busy(self, rank: int, event: events.StepBusy) -> None:
        """A rank's own seconds of one step, scored against the fleet's: a host that stays slow
        is said once, and its recovery once (zlaunch/launcher/stragglers.py)."""
        times = event.busy[:MAX_BUSY_BATCH]
        waits: list[float | None] = list(event.waited or ())[:MAX_BUSY_BATCH]
        if len(waits) != len(times):
            waits = [None] * len(times)  # an older runtime: scored on its own times alone
        if self.stragglers is None:
            self.stragglers = StragglerWatch(self.output.hosts)
        for offset, (busy, waited) in enumerate(zip(times, waits, strict=True)):
            for finding in self.stragglers.add(rank, event.step + offset, busy, waited):
                self.console.note(finding.text, error=finding.slow)
                if finding.slow and self.options.slow_node == "exclude":
                    self._exclude(finding)

    def _exclude(self, finding: Finding) -> None:
        """--slow-node exclude: take the host out as a preempted one is (a save at the next
        step boundary, then the job goes on without it), unless that would leave fewer hosts
        than --min-nodes: then it is said, once per host, and the host stays."""
        names = [h.display for h in self.hosts]
        if finding.host not in names:
            return
        node = names.index(finding.host)
        watch = self.stragglers
        why = slow_why(finding, watch.window * watch.sustain if watch else 0)
        leaving = [n.host for n in self.machine.fleet.notices.values()]
        kept = why_kept(
            finding.host, names, len(self.options.spare_hosts), leaving, self.options.min_nodes
        )
        if kept is None:
            self._handle(SlowHost(node, why))
        elif finding.host not in self._kept_said:
            self._kept_said.add(finding.host)
            self.console.note(slow_kept_words(finding.host, why, kept), error=True)

    def _mismatch(self, rank: int, event: events.CollectiveMismatch) -> None:
        """A rank found its peers in another collective at its position: say so now, once
        per position (every rank of the group may report the same one)."""
        mine, peers = event.mine, event.peers
        key = (mine.get("group"), mine.get("seq"))
        if key in self.mismatches:
            return
        self.mismatches.add(key)
        others = "; ".join(
            f"rank {r} in {p.get('op')} {p.get('sizes')}"
            for r, p in sorted(peers.items())
            if isinstance(p, dict)
        )
        self.console.note(
            f"collective mismatch in group {mine.get('group')} at #{mine.get('seq')}: rank "
            f"{rank} in {mine.get('op')} {mine.get('sizes')}; {others}. The ranks disagree "
            "on which collective comes next: this job will hang (the hang report names the "
            "ranks at --hang-timeout)",
            error=True,
        )

    def _lose_agent(self, index: int, why: str) -> None:
        tail = self.links.stderr_tail(index, 5)
        message = why + (": " + " | ".join(tail) if tail else "")
        lost = [s for s in self.machine.ranks.live() if s.slot.node == index]
        tails = {s.rank: self.output.tail(s.rank) for s in lost}
        self._handle(AgentLost(index, message, tails))
        for state in lost:
            self.view.rank_lost(state.rank, state.slot.host)

    def _watch(self, now: float) -> None:
        """The timers: agents gone silent, a hang, a stop that takes too long."""
        self.links.awake(now)
        allowed = liveness.agent_silence_timeout(len(self.machine.ranks))
        for index, done in enumerate(self.machine.agent_done):
            silent = self.links.silent_for(index, now)
            if not done and silent > allowed:
                self._lose_agent(
                    index,
                    f"no word from the agent for {silent:.0f} s (network down or the host stopped)",
                )
        if self.output.capture is not None:
            if self.output.capture.done(now):
                self._report_hang()
        elif self.machine.hang is HangPhase.WATCHING and self.hang.due(now):
            self._handle(HangDue(now - self.hang.last, self.options.hang_timeout))
        if self.prober is not None:
            self._offer_ready_hosts()
        self._handle(Tick())
        if self.ranks_dirty:
            self._record_ranks()

    def _offer_ready_hosts(self) -> None:
        """Hosts that answered the prober may join, while the job is below --max-nodes: each is
        handed to the machine once per attempt (it decides when: --grow-interval, no save under
        way). Never waits: the prober's thread did the probing."""
        for note in self.prober.take_notes():
            self.console.note(note, error=True)
        room = (self.options.max_nodes or 0) - len(self.hosts) - len(self.offered)
        for host in self.prober.take_ready():
            if room <= 0:
                return
            if host.display in self.offered or host.name in {h.name for h in self.hosts}:
                continue
            if host.display in self._cannot_join_said:
                continue  # judged once per attempt (the check reads the config)
            why = self.grow_check([*self.offered.values(), host]) if self.grow_check else None
            if why is not None:
                self._cannot_join_said.add(host.display)
                self.console.note(f"{host.display} answers but cannot join: {why}", error=True)
                continue
            self.offered[host.display] = host
            room -= 1
            self._handle(HostReturned(host.display))

    def _report_hang(self) -> None:
        capture, self.output.capture = self.output.capture, None
        live = self.machine.ranks.live()
        failure = hang_failure(
            self.options.hang_timeout,
            capture.idle_s,
            {s.rank: s.slot.host for s in live},
            capture.dumps(),
            [s.rank for s in live if not s.stacks],
            capture.records,
            {s.rank: s.pid for s in live},
            by_faulthandler=capture.by_faulthandler(),
        )
        self._handle(HangStacksIn(failure))

    # ---- actions ----------------------------------------------------------------------------

    def _handle(self, event: Any) -> list[Action]:
        actions = self.machine.handle(event, time.monotonic())
        for action in actions:
            self._apply(action)
        return actions

    def _apply(self, action: Action) -> None:
        match action:
            case Note(text, error):
                self.console.note(text, error=error)
            case RecordRanks():
                self._record_ranks()
            case SetStatus(status):
                if status is not RunStatus.RUNNING:  # RUNNING is written with the plan
                    self.recorder.status(status)
                self.view.set_status(status)
            case StopRanks(grace):
                self.links.send_all(frames.encode(frames.Stop(grace)))
            case SignalRanks(sig):
                if self.machine.fleet.under_way and self.fleet_save_at is None:
                    self.fleet_save_at = time.monotonic()
                self.links.send_all(frames.encode(frames.Signal(sig)), parallel=False)
            case RequestStacks(by_node):
                ranks = [r for node_ranks in by_node.values() for r in node_ranks]
                self.output.stack_dumps.expect(ranks, time.monotonic())
                sig = int(protocol.STACKS_SIGNAL)
                for index, node_ranks in by_node.items():
                    self.links.send(index, frames.encode(frames.Signal(sig, list(node_ranks))))
            case CaptureStacks(ranks, idle_s):
                self.output.capture = StackCapture(ranks, time.monotonic(), idle_s)
            case RecordFleet():
                self.view.fleet(self.machine.fleet.describe(time.monotonic()))
            case unexpected:
                assert_never(unexpected)

    def _record_ranks(self, now: bool = False) -> None:
        """ranks.json, at most once a second: every start, exit and output frame of every rank
        comes here, and rewriting all N rows N times is quadratic (seconds of the controller's
        time at 1,024 ranks, while it should be stopping them). What is not written now is
        written by the loop within a second (``_watch``), and at the attempt's end."""
        if not now and not self.recorder.ranks_due():
            self.ranks_dirty = True
            return
        self.ranks_dirty = False
        rows = self.machine.ranks.rows(self.output.bars, self.output.output_at)
        self.recorder.ranks(self.number, rows)


class Job:
    """A whole run: the run directory, then attempts until one ends the job.
    ``run()`` returns 0 or raises WorkerFailed/Interrupted/LaunchError."""

    def __init__(self, options: LaunchOptions, console: Console):
        self.first = options
        self.options = options
        self.console = console
        self.policy = RestartPolicy(options.max_restarts, options.min_nodes)
        self.recorder: Recorder | None = None
        self.number = 0
        self.prober = _prober_of(options)

    def run(self) -> int:
        self.recorder = Recorder.create(self.options, self.console)
        if self.prober is not None:
            self.prober.start()
        try:
            while True:
                if self.prober is not None:
                    self.prober.running(self.options.hosts)
                attempt = Attempt(
                    self.options,
                    self.console,
                    self.recorder,
                    self.number,
                    self.prober,
                    self._why_cannot_grow,
                )
                try:
                    outcome = attempt.run()
                except HostUnreachable as err:
                    if self._after_unreachable(err):
                        continue
                    raise
                self._warn(outcome)
                if outcome.ending == Ending.SUCCEEDED:
                    self.recorder.end(RunStatus.SUCCEEDED, 0)
                    self._say_saved(attempt)
                    return 0
                if not self._after(attempt, outcome):
                    raise _error_of(outcome)
        except BaseException as err:
            self.recorder.end(RunStatus.FAILED, getattr(err, "exit_code", 1), _words(err))
            raise
        finally:
            if self.prober is not None:
                self.prober.close()
            self.recorder.close()

    def _why_cannot_grow(self, joining: list[Host]) -> str | None:
        """None when the job can run on its hosts plus ``joining`` (the global batch kept at
        that world size), else why not."""
        order = self.prober.order() if self.prober is not None else []
        try:
            options_after_grow(self.first, self.options, joining, order)
        except (LaunchError, UsageError) as err:
            return err.message
        return None

    def _may_come_back(self, names) -> None:
        """Hosts lost or out of reach: the prober tries them until they answer (--max-nodes)."""
        if self.prober is None:
            return
        hosts = [h for h in (*self.options.hosts, *self.first.hosts) if h.name in set(names)]
        self.prober.candidate(list({h.name: h for h in hosts}.values()))

    def _after(self, attempt: Attempt, outcome: Outcome) -> bool:
        """Record how the attempt ended; True when the next attempt is set up."""
        if outcome.failures:
            report = FailureReport(
                run_id=self.recorder.run_id,
                reason=outcome.failures[0].reason,
                exit_code=outcome.exit_code,
                summary=outcome.summary,
                root_cause=outcome.failures[0],
                failures=outcome.failures,
                stopped_ranks=outcome.stopped_ranks,
                log_dir=self.recorder.path,
                warnings=outcome.warnings,
            )
            self.recorder.failure(report)
            self.console.failure_report(report)
        lost = {self.options.hosts[node].name for node in attempt.machine.lost_nodes}
        self._may_come_back(lost)
        if outcome.ending == Ending.FLEET_CHANGED and outcome.fleet is not None:
            if outcome.fleet.joining and not outcome.fleet.leaving and not lost:
                self._after_grow(attempt, outcome)
            else:
                self._after_fleet_change(outcome, lost, attempt.machine.ranks.last_step)
            return True
        decision = self.policy.after(outcome, lost, time.monotonic())
        if isinstance(decision, GiveUp):
            self.recorder.end(outcome.status, outcome.exit_code)
            return False
        self.recorder.status(RunStatus.RESTARTING)
        self._restart(decision, outcome)
        return True

    def _restart(self, decision: Restart, outcome: Outcome) -> None:
        where = "all ranks"
        if decision.without:
            try:
                self.options = options_after_loss(self.first, self.options, decision.without)
            except LaunchError as stop:
                self.recorder.end(RunStatus.FAILED, stop.exit_code, stop.message)
                raise
            names = ", ".join(h.name for h in self.options.hosts)
            where = (
                f"on {names} without {', '.join(sorted(decision.without))} "
                f"(world {self.options.world_size})"
            )
        self.number += 1
        change = {"kind": "lost", "hosts": sorted(decision.without)} if decision.without else None
        self.recorder.attempt(self.first, self.number, self.options, outcome.message, change)
        self.recorder.restarting()
        resume = " from the latest checkpoint" if self.first.checkpoint_dir else ""
        self.console.note(
            f"{outcome.message}; restarting {where}{resume} (attempt {self.number}, "
            f"{decision.restarts_left} restart(s) left)",
            error=True,
        )

    def _after_fleet_change(self, outcome: Outcome, lost: set[str], last_step: int | None) -> None:
        """Hosts were preempted: the next attempt runs without them, from the checkpoint the
        ranks saved for it (or the previous one, when the save could not finish in time). Not
        a failure: no restart of --max-restarts is spent. LaunchError when the job cannot go on
        (no --min-nodes, or fewer hosts would be left)."""
        fleet = outcome.fleet
        preempted = {n.host for n in fleet.leaving}
        without = lost | {h.name for h in self.options.hosts if h.display in preempted}
        if fleet.saved:
            step = f" at step {fleet.saved_step}" if fleet.saved_step is not None else ""
            saved = f"saved{step} ({_latest_checkpoint(self.first.checkpoint_dir)})"
        elif self.first.checkpoint_dir:
            saved = (
                f"not saved ({fleet.why_unsaved or 'no save completed'}); the latest complete "
                f"checkpoint is {_latest_checkpoint(self.first.checkpoint_dir)}"
            )
        else:
            saved = "nothing saved (no --checkpoint-dir)"
        names = ", ".join(sorted(without))
        slow = sorted(h.name for h in self.options.hosts if h.display in _slow_hosts(fleet))
        taken = "preempted" if len(slow) < len(without) else "slow: taken out"
        if self.first.min_nodes is None:
            raise LaunchError(
                f"{names} preempted: {saved}; the job does not go on without it (no --min-nodes)",
                hint="run the same command with --resume to continue from the checkpoint; "
                "--min-nodes M --max-restarts N lets a job go on without preempted hosts",
            )
        try:
            self.options = options_after_loss(self.first, self.options, without)
        except LaunchError as stop:
            raise LaunchError(f"{stop.message}; {saved}") from None
        self.policy.reach_deadline = time.monotonic() + self.policy.window
        self.number += 1
        message = f"{names} {taken}: {saved}"
        self.recorder.status(RunStatus.RESTARTING)
        now = time.monotonic()
        change = {
            "kind": "preempted" if len(slow) < len(without) else "slow",
            "hosts": sorted(without),
            # the slow hosts taken out (--slow-node exclude), each with its figure
            **({"slow": {n.host: n.why for n in fleet.leaving if n.slow}} if slow else {}),
            "saved_step": fleet.saved_step if fleet.saved else None,
            "last_step": last_step,
            # A save at the step the ranks were in costs none; without one, the steps since the
            # script's own last checkpoint are run again.
            "steps_lost": (
                max(0, last_step - fleet.saved_step)
                if fleet.saved and last_step is not None and fleet.saved_step is not None
                else None
            ),
            "deadline_missed": fleet.missed_deadline,
            "notice_to_restart_s": round(now - min(n.at for n in fleet.leaving), 3)
            if fleet.leaving
            else None,
        }
        self.recorder.attempt(self.first, self.number, self.options, message, change)
        self.recorder.restarting()
        resume = " from that checkpoint" if fleet.saved else " from the latest checkpoint"
        self.console.note(
            f"{message}; going on on {', '.join(h.name for h in self.options.hosts)} without "
            f"it (world {self.options.world_size}, global batch kept){resume} (attempt "
            f"{self.number}; no restart spent)",
            error=True,
        )

    def _after_grow(self, attempt: Attempt, outcome: Outcome) -> None:
        """Hosts joined (--max-nodes): the ranks saved at a step boundary, the next attempt runs
        on the larger set from that checkpoint with the global batch kept. Not a failure: no
        restart of --max-restarts is spent. When the save did not complete, the job grows all
        the same from the latest complete checkpoint (said, with the steps that costs)."""
        fleet = outcome.fleet
        joining = [attempt.offered[name] for name in fleet.joining if name in attempt.offered]
        last_step = attempt.machine.ranks.last_step
        if fleet.saved:
            step = f" at step {fleet.saved_step}" if fleet.saved_step is not None else ""
            saved = f"saved{step} ({_latest_checkpoint(self.first.checkpoint_dir)})"
        else:
            saved = (
                f"not saved ({fleet.why_unsaved or 'no save completed'}); the latest complete "
                f"checkpoint is {_latest_checkpoint(self.first.checkpoint_dir)}"
            )
        order = self.prober.order() if self.prober is not None else []
        self.options, grown = options_after_grow(self.first, self.options, joining, order)
        self.policy.reach_deadline = time.monotonic() + self.policy.window
        self.number += 1
        now = time.monotonic()
        joined = ", ".join(grown.joined)
        message = f"{joined} joined: {saved}"
        self.recorder.status(RunStatus.RESTARTING)
        change = {
            "kind": "joined",
            "hosts": list(grown.joined),
            "saved_step": fleet.saved_step if fleet.saved else None,
            "last_step": last_step,
            "steps_lost": (
                max(0, last_step - fleet.saved_step)
                if fleet.saved and last_step is not None and fleet.saved_step is not None
                else None
            ),
            # what growing cost the job in time: from the save request to this restart
            "save_to_restart_s": round(now - attempt.fleet_save_at, 3)
            if attempt.fleet_save_at is not None
            else None,
        }
        self.recorder.attempt(self.first, self.number, self.options, message, change)
        self.recorder.restarting()
        resume = " from that checkpoint" if fleet.saved else " from the latest checkpoint"
        self.console.note(
            f"{message}; growing onto {', '.join(h.name for h in self.options.hosts)} (world "
            f"{self.options.world_size}, global batch kept){resume} (attempt {self.number}; no "
            "restart spent)",
            error=True,
        )

    def _after_unreachable(self, err: HostUnreachable) -> bool:
        """A restart found hosts out of reach: wait for them (a route or link coming back),
        or go on without them (--min-nodes); False to give up."""
        unreachable = err.hosts
        decision = self.policy.unreachable(unreachable, time.monotonic())
        if isinstance(decision, GiveUp):
            return False
        if isinstance(decision, Retry):
            self.console.note(f"{err.message}; trying again", error=True)
            time.sleep(decision.wait)
        elif isinstance(decision, GoOnWithout):
            self.options = options_after_loss(self.first, self.options, decision.hosts)
            self._may_come_back(decision.hosts)
            self.console.note(
                f"{err.message}; going on without {', '.join(unreachable)} on "
                f"{', '.join(h.name for h in self.options.hosts)} "
                f"(world {self.options.world_size})",
                error=True,
            )
            self.recorder.attempt(
                self.first, self.number, self.options, f"{err.message}; went on without them"
            )
        self.recorder.restarting()
        return True

    def _warn(self, outcome: Outcome) -> None:
        """What the attempt's end must say whatever its outcome: in run.json and in the last
        lines (a failure's report repeats it in failure.json)."""
        if not outcome.warnings:
            return
        self.recorder.warnings(self.number, outcome.warnings)
        for text in outcome.warnings:
            self.console.note(f"warning: {text}", error=True)

    def _say_saved(self, attempt: Attempt) -> None:
        if attempt.machine.save_requested and self.first.checkpoint_dir:
            self.console.note(
                f"saved checkpoint {_latest_checkpoint(self.first.checkpoint_dir)}; "
                "continue with the same command plus --resume"
            )


def _policy_of(options: LaunchOptions) -> Policy:
    save_signal = signal.Signals[options.save_on] if options.save_on else None
    return Policy(
        grace=options.grace_period,
        checkpoint_dir=bool(options.checkpoint_dir),
        save_signal=int(save_signal) if save_signal is not None else None,
        grow_interval=options.grow_interval,
        goes_on_without=options.min_nodes is not None,
    )


def _prober_of(options: LaunchOptions) -> HostProber | None:
    """The probe of hosts that may join a job that can grow (--max-nodes), or None. Spares
    (listed beyond the hosts the job starts on) are probed from the start."""
    if options.max_nodes is None:
        return None
    watch = HostfileWatch(options.hostfile, options.slots_per_host) if options.hostfile else None
    prober = HostProber(ssh_probe(options.ssh), watch)
    prober.list_hosts([*options.hosts, *options.spare_hosts])
    prober.running(options.hosts)
    prober.candidate(options.spare_hosts)
    return prober


def _slow_hosts(fleet) -> set[str]:
    return {n.host for n in fleet.leaving if n.slow}


def rendezvous(options: LaunchOptions, hellos: list[frames.Hello]) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT: the first host, as the others reach it, and the port its
    agent found free (or what the user gave)."""
    hosts, first = options.hosts, hellos[0]
    if options.master_addr:
        addr = options.master_addr
    elif all(h.is_local for h in hosts):
        addr = "127.0.0.1"
    elif hosts[0].is_local:
        # This machine is the master: use the address the other hosts see us coming from.
        seen = [h.client_addr for h in hellos if h and h.client_addr]
        addr = seen[0] if seen else hosts[0].name
    elif options.launcher == Launcher.SLURM:
        addr = hosts[0].name  # the node's name in the allocation, which every node resolves
    else:  # over SSH, or dialed in: the address this node is reached at
        addr = first.addr or hosts[0].name
    return addr, options.master_port or first.port


def _threads_words(options: LaunchOptions, plan: Plan, hellos: list[frames.Hello | None]) -> str:
    """What the start line says of OMP_NUM_THREADS: the default zlaunch set, per node."""
    if THREADS_ENV in options.env:
        return ""  # the user's own value: nothing to say
    per_node = []
    for node, hello in zip(plan.nodes, hellos, strict=True):
        value = node.workers[0].env.get(THREADS_ENV) if node.workers else None
        cpus = hello.cpus if hello and hello.cpus else 0
        per_node.append((node.host.display, cpus, len(node.workers), value))
    return threads_words(per_node)


def _encode_specs(plan: Plan, options: LaunchOptions) -> list[bytes]:
    """Every node's spec, each checked (size, encoding) before any is sent: a job starts on
    all nodes or none."""
    preemption_signal = (
        int(signal.Signals[options.preemption_signal]) if options.preemption_signal else None
    )
    return [
        encode_spec(
            dataclasses.replace(
                node_spec(
                    node,
                    master_addr=plan.master_addr,
                    grace=options.grace_period,
                    heartbeat_timeout=liveness.heartbeat_timeout(plan.world_size),
                ),
                preemption_signal=preemption_signal,
                preemption_check=options.preemption_check,
                preemption_check_interval=options.preemption_check_interval,
            ),
            node.host.display,
        )
        for node in plan.nodes
    ]


def _ended_before_start(options: LaunchOptions, links: AgentLinks, index: int) -> LaunchError:
    link = links.links[index]
    status = link.wait(1.0) if link else None
    detail = "\n".join(f"    {line}" for line in links.stderr_tail(index, 10))
    return LaunchError(
        f"the agent on {links.hosts[index].display} ended before it started"
        + (f" (exit status {status})" if status is not None else "")
        + (f":\n{detail}" if detail else ""),
        hint=f"check that {options.python} exists there and can import zlaunch"
        " (--python sets the interpreter on the nodes)",
    )


def _route_signals(queue: Any, save_signal: int | None) -> dict[int, Any]:
    """Signals to the controller become queue items for the attempt's loop (a handler must
    not act itself: it runs between any two bytecodes of the loop)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    wanted = [protocol.STACKS_SIGNAL, signal.SIGINT, signal.SIGTERM]
    if save_signal is not None:
        wanted.append(save_signal)
    return {
        signum: signal.signal(signum, lambda s, _f: queue.put(SignalIn(s))) for signum in wanted
    }


def _restore_signals(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _error_of(outcome: Outcome) -> Exception:
    if outcome.ending == Ending.INTERRUPTED:
        return Interrupted(outcome.message, exit_code=outcome.exit_code)
    if outcome.ending == Ending.RANKS_FAILED:
        return WorkerFailed(outcome.message, exit_code=outcome.exit_code)
    return LaunchError(outcome.message)


def _words(err: BaseException) -> str:
    return getattr(err, "message", None) or str(err) or type(err).__name__


def launch(options: LaunchOptions) -> int:
    """Run the job described by ``options``; 0 when every rank exited 0.

    Raises WorkerFailed (the failing rank's code), Interrupted (130/143), HostUnreachable or
    LaunchError (1) otherwise, after everything it started is stopped.
    """
    hosts = len(options.hosts) + len(options.spare_hosts)
    ensure_open_files(options.world_size, hosts)  # a log per rank: raised, or refused here
    console = Console(color=options.color, ranks=options.ranks_filter)
    try:
        return Job(options, console).run()
    finally:
        console.close()  # everything queued for the console is written before the exit


def _latest_checkpoint(directory: str) -> str:
    from .saved_checkpoint import latest_tag

    tag, why = latest_tag(directory)
    if tag is None:
        return f"in {directory} ({why}: did the ranks save?)"
    return os.path.join(directory, tag)
