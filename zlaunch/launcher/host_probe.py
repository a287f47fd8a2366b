"""Hosts that may join a job that can grow (``--max-nodes``): who is probed, when, and how.

A job with a node range keeps looking at the hosts it does not run on: hosts lost in an
earlier attempt (a link down, a reboot), spares listed beyond the hosts it started on, and
hosts that appear in the hostfile while it runs (the file is re-read when it changes). Each
is probed with one connection attempt of a short timeout (`ssh_probe`: an SSH login, closed at
once); a host that does not answer is tried again later, the wait doubling up to a cap
(`Backoff`, pure: no clock, no I/O). A host that answers is *ready*: the attempt's loop takes
it (`HostProber.take_ready`, never blocking) and hands it to the state machine
(``HostReturned``), which decides whether the job grows now (zlaunch/launcher/fleet_state.py).

Probes run on a thread of their own, at most `MAX_PARALLEL_PROBES` at a time, so a host whose
packets vanish (a probe waits its whole timeout) never holds up the controller's event loop.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from zlaunch.job import Host, SshOptions

__all__ = [
    "FIRST_WAIT",
    "MAX_WAIT",
    "PROBE_TIMEOUT",
    "HOSTFILE_INTERVAL",
    "MAX_PARALLEL_PROBES",
    "Backoff",
    "HostfileWatch",
    "HostProber",
    "ssh_probe",
]

FIRST_WAIT = 2.0
"""Seconds from a host's becoming a candidate (lost, listed) to its first probe."""
MAX_WAIT = 60.0
"""The longest wait between two probes of a host that keeps not answering."""
PROBE_TIMEOUT = 5.0
"""Seconds one probe waits for the host (at most --ssh-timeout)."""
HOSTFILE_INTERVAL = 2.0
"""Seconds between two looks at the hostfile (a stat; it is read only when it changed)."""
MAX_PARALLEL_PROBES = 4
LOOP_WAIT = 0.25


class Backoff:
    """When each candidate host is probed next: ``FIRST_WAIT`` after it became one, then
    after each failed probe twice the last wait, at most ``MAX_WAIT``. A host being probed is
    not due again until its probe ends; a host that answered is no candidate any more."""

    def __init__(self, first: float = FIRST_WAIT, cap: float = MAX_WAIT):
        if not 0 < first <= cap:
            raise ValueError(f"backoff needs 0 < first <= cap, got {first}, {cap}")
        self.first, self.cap = first, cap
        self.next_at: dict[str, float] = {}
        self.wait: dict[str, float] = {}
        self.in_flight: set[str] = set()

    @property
    def hosts(self) -> set[str]:
        return set(self.next_at) | self.in_flight

    def add(self, host: str, now: float) -> None:
        """``host`` is a candidate from now on (again: its wait starts over)."""
        if host in self.in_flight:
            return
        self.next_at[host] = now + self.first
        self.wait[host] = self.first

    def drop(self, host: str) -> None:
        """No longer a candidate (it runs in the attempt, or left the hostfile)."""
        self.next_at.pop(host, None)
        self.wait.pop(host, None)
        self.in_flight.discard(host)

    def due(self, now: float) -> list[str]:
        """Hosts whose probe is due, in the order they became due; marked in flight."""
        hosts = sorted((at, h) for h, at in self.next_at.items() if at <= now)
        for _, host in hosts:
            del self.next_at[host]
            self.in_flight.add(host)
        return [h for _, h in hosts]

    def failed(self, host: str, now: float) -> float | None:
        """The probe of ``host`` got no answer: the seconds until the next (None: dropped
        while it ran)."""
        if host not in self.in_flight:
            return None
        self.in_flight.discard(host)
        wait = min(self.cap, self.wait.get(host, self.first) * 2)
        self.wait[host] = wait
        self.next_at[host] = now + wait
        return wait

    def answered(self, host: str) -> bool:
        """The probe of ``host`` got an answer; False when it was dropped while it ran."""
        if host not in self.in_flight:
            return False
        self.drop(host)
        return True


class HostfileWatch:
    """The job's hostfile, re-read when it changes (size, time or inode): its hosts in file
    order, with at most ``slots`` slots each (``--num-gpus``); hosts without enough slots are
    left out, as spares are."""

    def __init__(self, path: str, slots: int | None):
        self.path = path
        self.slots = slots
        self.seen = self._stamp()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def changed(self) -> list[Host] | str | None:
        """The hosts when the file changed since last looked at, a sentence when it changed
        but cannot be read as a hostfile (the hosts known stay), None when unchanged."""
        from zlaunch.errors import ZlaunchError
        from zlaunch.job import load_hostfile

        stamp = self._stamp()
        if stamp == self.seen:
            return None
        self.seen = stamp
        if stamp is None:
            return f"hostfile {self.path} is gone; the hosts known stay candidates"
        try:
            listed = load_hostfile(self.path)
        except (ZlaunchError, OSError, UnicodeDecodeError) as err:
            message = getattr(err, "message", None) or str(err)
            return f"hostfile {self.path} changed but cannot be read ({message}); ignored"
        return [h for h in (self._trimmed(host) for host in listed) if h is not None]

    def _trimmed(self, host: Host) -> Host | None:
        if not host.slots:
            return None
        if self.slots is None:
            return host
        if len(host.slots) < self.slots:
            return None
        return dataclasses.replace(host, slots=host.slots[: self.slots])


class HostProber:
    """The probing thread of one job. The job says which hosts it runs on (`running`) and which
    may join (`candidate`); the attempt's loop takes the hosts that answered (`take_ready`)
    and the sentences to say (`take_notes`). Hosts new in a re-read hostfile become candidates
    by themselves (`listed` is then the new file order)."""

    def __init__(
        self,
        probe: Callable[[Host], str | None],
        hostfile: HostfileWatch | None = None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.probe = probe
        self.hostfile = hostfile
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.lock = threading.Lock()
        self.known: dict[str, Host] = {}
        """Every host the job knows of, by name."""
        self.listed: list[str] = []
        """Every host the job may use, in hostfile order (the rank order)."""
        self.in_job: set[str] = set()
        self.ready: dict[str, Host] = {}
        self.notes: list[str] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.hostfile_at = 0.0

    # ---- the job's side ---------------------------------------------------------------------

    def list_hosts(self, hosts: Iterable[Host]) -> None:
        """The hosts the job may use, in order (the first attempt's hosts, then the spares)."""
        with self.lock:
            for host in hosts:
                if host.name not in self.known:
                    self.listed.append(host.name)
                self.known[host.name] = host

    def running(self, hosts: Iterable[Host]) -> None:
        """The attempt about to start runs on ``hosts``: they are no candidates."""
        with self.lock:
            self.in_job = {h.name for h in hosts}
            for name in self.in_job:
                self.backoff.drop(name)
                self.ready.pop(name, None)

    def candidate(self, hosts: Iterable[Host]) -> None:
        """``hosts`` may join later (spares, hosts lost from the attempt that just ended: no
        longer in the job): probe them."""
        now = self.clock()
        with self.lock:
            for host in hosts:
                self.known.setdefault(host.name, host)
                if host.name not in self.listed:
                    self.listed.append(host.name)
                self.in_job.discard(host.name)
                self.ready.pop(host.name, None)  # answered before it was lost: ask again
                self.backoff.add(host.name, now)

    def take_ready(self) -> list[Host]:
        """Hosts that answered, in hostfile order; they stay ready until `running` takes them
        (or a later `candidate` asks to probe them again)."""
        with self.lock:
            order = {name: i for i, name in enumerate(self.listed)}
            return sorted(self.ready.values(), key=lambda h: order.get(h.name, len(order)))

    def take_notes(self) -> list[str]:
        with self.lock:
            notes, self.notes = self.notes, []
            return notes

    def host(self, name: str) -> Host | None:
        with self.lock:
            return self.known.get(name)

    def order(self) -> list[str]:
        with self.lock:
            return list(self.listed)

    # ---- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="host-probe", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(PROBE_TIMEOUT + 1)

    def _run(self) -> None:
        pending: dict[Future, str] = {}
        pool = _DaemonPool()
        while not self.stop.is_set():
            self.step(pool, pending)
            self.stop.wait(LOOP_WAIT)

    def step(self, pool, pending: dict[Future, str]) -> None:
        """One look: the hostfile when due, the probes that ended, the probes now due."""
        now = self.clock()
        if self.hostfile is not None and now - self.hostfile_at >= HOSTFILE_INTERVAL:
            self.hostfile_at = now
            self._reread(now)
        for future in [f for f in pending if f.done()]:
            name = pending.pop(future)
            try:
                why = future.result()
            except Exception as err:  # a probe's own bug must not end the prober
                why = f"probe failed: {type(err).__name__}: {err}"
            self._probed(name, why, self.clock())
        room = MAX_PARALLEL_PROBES - len(pending)
        with self.lock:
            due = self.backoff.due(now)
            for name in due[room:]:  # no room now: due again at once when there is
                self.backoff.in_flight.discard(name)
                self.backoff.next_at[name] = now
            hosts = [(name, self.known[name]) for name in due[:room] if name in self.known]
        for name, host in hosts:
            pending[pool.submit(self.probe, host)] = name

    def _probed(self, name: str, why: str | None, now: float) -> None:
        with self.lock:
            if why is None:
                if self.backoff.answered(name) and name not in self.in_job:
                    self.ready[name] = self.known[name]
            else:
                self.backoff.failed(name, now)

    def _reread(self, now: float) -> None:
        got = self.hostfile.changed()
        if got is None:
            return
        if isinstance(got, str):
            with self.lock:
                self.notes.append(got)
            return
        with self.lock:
            names = [h.name for h in got]
            new = [h for h in got if h.name not in self.known]
            gone = [name for name in self.listed if name not in names]
            for host in got:
                self.known[host.name] = host
            self.listed = names
            for name in gone:
                self.backoff.drop(name)
                self.ready.pop(name, None)
            for host in new:
                if host.name not in self.in_job:
                    self.backoff.add(host.name, now)
            if new:
                self.notes.append(
                    f"hostfile {self.hostfile.path} lists new host(s) "
                    f"{', '.join(h.name for h in new)}: probing them, to join the job"
                )


class _DaemonPool:
    """Each probe on a daemon thread of its own (`HostProber.step` bounds how many run): the
    job's end never waits for a login still timing out (a thread pool's workers are joined
    at exit)."""

    def submit(self, fn: Callable[[Host], str | None], host: Host) -> Future:
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn(host))
            except BaseException as err:  # handed to the prober, which counts it as no answer
                future.set_exception(err)

        threading.Thread(target=run, name=f"probe-{host.name}", daemon=True).start()
        return future


def ssh_probe(ssh: SshOptions, timeout: float = PROBE_TIMEOUT) -> Callable[[Host], str | None]:
    """One SSH login to a host, closed at once: None when it answered, else why not. A local
    host always answers (its agent is a subprocess)."""
    options = dataclasses.replace(ssh, timeout=min(timeout, ssh.timeout))

    def probe(host: Host) -> str | None:
        if host.is_local:
            return None
        from zlaunch.transport import reachable

        return reachable(host, options)

    return probe
