"""``--slurm-mode one-step``: one ``srun`` for the whole allocation, one task per node, each task
an agent that connects back to the controller over TCP (transport/connect_back.py)::

    srun --jobid=J --nodes=N --ntasks=N --ntasks-per-node=1 --nodelist=A,B,... --overlap
         --cpu-bind=none --kill-on-bad-exit=0 --wait=0 --label --input=none --quiet
         --job-name=zlaunch-agents-XXXXXXXX -- python -u -m zlaunch.agent --connect ADDR:PORT

One process and one step-creation RPC for any number of nodes (srun fans out through
slurmstepd's tree), where ``step-per-node`` (transport/slurm.py) costs one srun process (about
9 MiB and 5 threads) and one RPC per node. The price: the nodes must reach the controller over
TCP, and the nodes share one process, so srun ending loses every agent at once.

The job's token goes to the agents through srun's environment (``--export`` passes it on), never
argv. ``--kill-on-bad-exit=0`` and ``--wait=0``: one agent ending (its node's ranks done, or a
failed start) must not end the others; the controller decides what a lost node means.
"""

from __future__ import annotations

import collections
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from zlaunch.errors import HostUnreachable, Interrupted, LaunchError, UsageError
from zlaunch.job import Host
from zlaunch.transport.connect_back import ConnectBackLink, Listener
from zlaunch.transport.local import require_program
from zlaunch.transport.roster import HostRoster
from zlaunch.transport.slurm import ended_by_slurm, job_id
from zlaunch.wire import Answer, protocol

__all__ = [
    "CONNECT_TIMEOUT",
    "ONE_STEP_ABOVE_NODES",
    "SlurmStep",
    "controller_address",
    "one_step_argv",
    "open_one_step",
]

# `--slurm-mode auto` picks one-step above this many nodes. Up to 8 nodes the step per node
# costs the controller's host under 100 MiB and 40 threads and keeps what works everywhere (no
# TCP port the nodes must reach, each node's step its own); above it the per-node cost grows
# to gigabytes and thousands of threads (measured: docs/benchmarks.md, "Slurm and MPI").
ONE_STEP_ABOVE_NODES = 8
# Every agent must have connected within this many seconds of srun's start.
CONNECT_TIMEOUT = 60.0
STDERR_LINES = 2000
# `--label`: "3: text" is task 3's line; srun's own lines carry no label.
_LABEL = re.compile(r"^\s*([0-9]+): ?(.*)$")
# srun: error: node3: task 2: Exited with exit code 2
_TASK_EXITED = re.compile(r"^srun: error: (\S+): tasks? [0-9,-]+: (?:Exited|Killed|Terminated)")


def one_step_argv(
    hosts: Sequence[str],
    job: str,
    argv: Sequence[str],
    address: str,
    name: str,
    extra: Sequence[str] = (),
    srun: str = "srun",
) -> list[str]:
    """The one srun that starts an agent (``argv``) on every one of ``hosts``, each told to
    connect back to ``address``."""
    n = len(hosts)
    return [
        srun,
        f"--jobid={job}",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(hosts)}",
        "--overlap",
        "--cpu-bind=none",
        "--kill-on-bad-exit=0",
        "--wait=0",
        "--label",
        "--input=none",
        "--quiet",
        f"--job-name={name}",
        *extra,
        "--",
        *argv,
        "--connect",
        address,
    ]


def controller_address(hosts: Sequence[Host], given: str | None) -> str:
    """The address of this machine the nodes reach: ``given`` (--controller-addr), else the one
    this machine sends from to reach the allocation's nodes (the kernel's route to them: the
    interface the nodes share with us, not the first one up)."""
    if given:
        return given
    tried: list[str] = []
    loopback: list[str] = []
    for host in hosts[:4]:
        try:
            target = _node_address(host.name)
            info = socket.getaddrinfo(target, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(info[0], socket.SOCK_DGRAM) as probe:
                probe.connect(info[4])  # UDP: no packet is sent, only the route is chosen
                addr = probe.getsockname()[0]
        except OSError as err:
            tried.append(f"{host.name}: {err}")
            continue
        if not (addr.startswith("127.") or addr == "::1"):
            return addr
        tried.append(f"{host.name}: reached over loopback ({addr})")
        loopback.append(addr)
    if len(loopback) == len(hosts):
        return loopback[0]  # every node is this machine (a one-node allocation run on it)
    raise UsageError(
        "cannot tell at which address the nodes reach this machine (" + "; ".join(tried) + ")",
        hint="--controller-addr ADDR: an address of this machine the nodes can connect to",
    )


def _end_all(step: SlurmStep, links: Sequence[ConnectBackLink | None]) -> None:
    """A start that failed: every agent that connected is told to stop, then the step ends."""
    for link in links:
        if link is not None:
            link.cut()
    if not any(links):
        step.end(wait=0.0)
        return
    for link in links:
        if link is not None:
            link.terminate(0.5)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _node_address(name: str) -> str:
    """How this machine reaches node ``name``: its name where the resolver knows it, else the
    address Slurm reaches it at (NodeAddr: a cluster whose node names only Slurm knows)."""
    try:
        socket.getaddrinfo(name, 9, type=socket.SOCK_DGRAM)
        return name
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", name],
            capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:
        raise OSError(f"not resolvable, and scontrol failed: {err}") from None
    for field in out.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    raise OSError("not resolvable, and Slurm gives no NodeAddr")


class SlurmStep:
    """The one srun process: its labelled output, its exit, the links of its agents."""

    def __init__(self, proc: subprocess.Popen, job: str, name: str):
        self.proc = proc
        self.job = job
        self.name = name
        self.links: list[ConnectBackLink] = []
        self.exited_nodes: set[str] = set()
        self._lines: collections.deque[tuple[int | None, str]] = collections.deque(
            maxlen=STDERR_LINES
        )
        self._lock = threading.Lock()
        self._released = 0
        self._end_reason: tuple[str | None] | None = None
        self.ended = threading.Event()
        self._reader = threading.Thread(target=self._read, name="srun-output", daemon=True)
        self._reader.start()
        threading.Thread(target=self._watch, name="srun-exit", daemon=True).start()

    # ---- srun's output and exit -------------------------------------------------------------

    def _read(self) -> None:
        partial = b""
        fd = self.proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for line in lines:
                self._note(line.decode("utf-8", "replace"))
        if partial:
            self._note(partial.decode("utf-8", "replace"))

    def _watch(self) -> None:
        # srun's exit, not the end of its output: a helper srun forked may hold the pipe open
        code = self.proc.wait()
        self._reader.join(1.0)  # its last lines first
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit status {code}"
        with self._lock:  # every node's tail says it: each one's agent went with it
            self._lines.append((None, f"srun (the one step of every node's agent) ended: {how}"))
        self.ended.set()
        # srun is gone: so is every agent's step. Readers see EOF now, not when TCP notices.
        with self._lock:
            links = list(self.links)
        for link in links:
            link.cut()

    def _note(self, line: str) -> None:
        match = _LABEL.match(line)
        with self._lock:
            if match:
                self._lines.append((int(match.group(1)), match.group(2)))
            else:
                self._lines.append((None, line))
                exited = _TASK_EXITED.match(line)
                if exited:
                    self.exited_nodes.add(exited.group(1))

    def stderr_tail(
        self, task: int | None, link: ConnectBackLink | None = None, lines: int = 40
    ) -> list[str]:
        """Task ``task``'s lines and srun's own (all tasks' lines for ``None``); each agent of
        the step is known by its task id, so ``link`` adds nothing."""
        if not self.ended.is_set() and self._exited():
            # srun is dead but its watcher has not said so yet (it first waits up to 1 s for
            # srun's last lines): an agent lost with srun must be told it went with srun
            self.ended.wait(2.0)
        with self._lock:
            picked = [t for k, t in self._lines if task is None or k is None or k == task]
        return picked[-lines:]

    def _exited(self) -> bool:
        """srun has exited: reaped by its watcher, or a zombie the watcher is about to reap."""
        if self.proc.returncode is not None:
            return True
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                # the state follows the command name's closing parenthesis
                return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except (OSError, IndexError):
            return False

    def unclaimed_tail(self, lines: int = 10) -> list[str]:
        """Lines of tasks that never connected, and srun's own."""
        with self._lock:
            claimed = {link.task for link in self.links}
            picked = [t if k is None else f"{k}: {t}" for k, t in self._lines if k not in claimed]
        return picked[-lines:]

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def end_reason(self, wait: float = 2.0) -> str | None:
        """Why the step ended, when Slurm ended it (scancel, time limit); as SlurmLink's."""
        if self._end_reason is not None:  # asked once per node: read srun's lines once
            return self._end_reason[0]
        deadline = time.monotonic() + wait
        while True:
            reason = ended_by_slurm(self.stderr_tail(None, lines=STDERR_LINES))
            if reason is not None or time.monotonic() >= deadline:
                break
            if self.ended.is_set():
                reason = ended_by_slurm(self.stderr_tail(None, lines=STDERR_LINES))
                break
            time.sleep(0.05)
        if reason is not None or self.ended.is_set():
            self._end_reason = (reason,)
        return reason

    # ---- ending -----------------------------------------------------------------------------

    def add(self, link: ConnectBackLink) -> None:
        with self._lock:
            self.links.append(link)
        if self.ended.is_set():
            link.cut()

    def release(self, link: ConnectBackLink) -> None:
        """A link is done (its agent told to stop); with the last one, the step ends."""
        with self._lock:
            self._released += 1
            last = self._released >= len(self.links)
        if last:
            self.end()

    def settle(self) -> None:
        """Nothing to wait for: the last ``release`` ends the step itself."""

    def end(self, wait: float = 2.0) -> None:
        """srun exits once every agent has; if it does not, cancel the step (Slurm then ends
        its tasks on every node), then kill srun. Short waits: the controller closes its links
        within 5 s (launcher/agent_links.py) and may exit right after."""
        if self.wait(wait) is not None:
            return
        self.cancel()
        if self.wait(2.0) is None:
            self.proc.kill()
            self.proc.wait()

    def cancel(self) -> None:
        """scancel this step, found by its name among the job's steps."""
        try:
            out = subprocess.run(
                ["squeue", "-h", "-s", "-j", self.job, "-o", "%i %j"],
                capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            steps = [f.split()[0] for f in out.stdout.splitlines() if f.split()[1:] == [self.name]]
            if steps:
                subprocess.run(
                    ["scancel", *steps], capture_output=True, timeout=10, stdin=subprocess.DEVNULL
                )
        except (OSError, subprocess.SubprocessError, IndexError):
            pass  # the agents' own EOF handling and srun's kill below still apply


def open_one_step(
    hosts: Sequence[Host],
    argv: Sequence[str],
    *,
    on_open: Callable[[int, ConnectBackLink], object] | None = None,
    extra: Sequence[str] = (),
    controller_addr: str | None = None,
    on_refused: Callable[[str], None] = lambda _w: None,
    interrupted: Callable[[], int | None] = lambda: None,
    environ: Mapping[str, str] | None = None,
    timeout: float = CONNECT_TIMEOUT,
) -> list[ConnectBackLink]:
    """Start every host's agent with one srun and wait until each has connected back; links in
    host order. If some never connect, everything started is ended and HostUnreachable names
    them (``.hosts``), with srun's last words; if ``interrupted()`` names a signal (Ctrl-C)
    before they all have, everything started is ended and Interrupted raised."""
    environ = os.environ if environ is None else environ
    srun = require_program(
        "srun", environ, "slurm", "load Slurm's client tools (module load slurm), or use --hostfile"
    )
    job = job_id(environ)
    token = secrets.token_hex(32)
    listener = Listener(controller_address(hosts, controller_addr), token)
    name = f"zlaunch-agents-{secrets.token_hex(4)}"
    command = one_step_argv(
        [h.name for h in hosts], job, argv, listener.address, name, extra, srun=srun
    )
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd="/",
            env={**environ, protocol.CONNECT_TOKEN_ENV: token},
            start_new_session=True,  # Ctrl-C is the controller's to handle, as for every link
        )
    except OSError as err:
        listener.close()
        raise LaunchError(f"cannot start {srun}: {err}") from err
    step = SlurmStep(proc, job, name)
    links: list[ConnectBackLink | None] = [None] * len(hosts)

    def on_agent(index: int, sock: socket.socket, answer: Answer) -> None:
        link = ConnectBackLink(hosts[index], sock, answer.task, step)
        links[index] = link
        step.add(link)
        if on_open is not None:
            on_open(index, link)

    def no_more_coming() -> bool:
        if step.ended.is_set() or interrupted() is not None:
            return True
        waiting = {h.name for h, link in zip(hosts, links, strict=True) if link is None}
        return bool(waiting) and waiting <= step.exited_nodes

    try:
        missing = listener.accept_agents(
            HostRoster(hosts), time.monotonic() + timeout, on_agent, on_refused, no_more_coming
        )
    finally:
        listener.close()
    if missing:
        status = step.wait(0.5)
        _end_all(step, links)
        signum = interrupted()
        if signum is not None:
            raise Interrupted(
                f"stopped by {_signal_name(signum)} while the agents were connecting back "
                f"({len(missing)} of {len(hosts)} not yet)",
                exit_code=128 + signum,
            )
        names = [hosts[i].name for i in missing]
        exited = status is not None or set(names) <= step.exited_nodes
        if status is not None:
            why = f"srun exited with status {status}"
        elif exited:
            why = "their tasks exited before connecting" if len(names) > 1 else "its task exited"
        else:
            why = f"not within {timeout:.0f} s"
        hint = (
            f"check that {argv[0]} exists on those nodes and can import zlaunch (--python sets "
            "the interpreter on the nodes)"
            if exited
            else "the nodes must reach this machine over TCP: --controller-addr sets the "
            "address they connect to; --slurm-mode step-per-node needs no connection back"
        )
        tail = "\n".join(f"    {line}" for line in step.unclaimed_tail())
        raise HostUnreachable(
            f"the agent on {', '.join(names[:10])}"
            + (f" and {len(names) - 10} more" if len(names) > 10 else "")
            + f" did not connect back to {listener.address} ({why})"
            + (f":\n{tail}" if tail else ""),
            hosts=names,
            hint=hint,
        )
    return [link for link in links if link is not None]
