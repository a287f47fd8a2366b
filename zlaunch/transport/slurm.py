"""Slurm transport: the agent of each node is a one-task job step started with ``srun``.

Inside an allocation (``SLURM_JOB_ID`` set: a ``salloc`` shell or an ``sbatch`` script) the
hosts are the allocation's nodes (``SLURM_JOB_NODELIST``, Slurm's hostlist grammar) and the
slots of each node come from the allocation (:func:`allocation_hosts`). For every node the
controller runs::

    srun --jobid=J --nodes=1 --ntasks=1 --nodelist=NODE --overlap --cpu-bind=none \\
         --kill-on-bad-exit=1 --quiet --unbuffered -- python -u -m zlaunch.agent

as a local subprocess: srun relays the agent's stdin and stdout, so the agent speaks the same
frames as over SSH and everything above the transport is unchanged. This is ``--slurm-mode
step-per-node`` (the default up to 8 nodes): each agent gets its own stdin (the spec differs per
node, ``stop`` and ``signal`` frames go to one node), and one node's step ending does not end
the others. Above that, one step of N tasks whose agents connect back over TCP costs the
controller's host one srun instead of N (transport/slurm_one_step.py).

Without cgroups Slurm loses track of double-forked processes, so nothing relies on Slurm to
reap workers: the agent kills its workers' process groups on EOF or a missed heartbeat, as it
does over SSH. A step that Slurm ends (``scancel``, time limit, preemption) says so on srun's
stderr; :func:`ended_by_slurm` turns that into the reason reported for the lost node.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence

from zlaunch.errors import UsageError
from zlaunch.job import MAX_SLOTS, Host
from zlaunch.transport.local import LocalLink, require_program

__all__ = [
    "SlurmLink",
    "allocation_hosts",
    "ended_by_slurm",
    "in_allocation",
    "parse_tasks_per_node",
    "srun_argv",
]

# "2(x3),1" -> [2, 2, 2, 1]
_COUNT = re.compile(r"^([0-9]+)(?:\(x([0-9]+)\))?$")
# slurmstepd: error: *** STEP 12.0 ON node1 CANCELLED AT 2026-11-30T16:40:01 DUE TO TIME LIMIT ***
_CANCELLED = re.compile(
    r"\*\*\* (?:STEP|JOB) (\S+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([^*]+?))?\s*\*\*\*"
)


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Inside a Slurm allocation: a salloc shell, an sbatch script or a step."""
    return bool(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))


def job_id(environ: Mapping[str, str]) -> str:
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or ""
    if not job:
        raise UsageError(
            "--launcher slurm needs a Slurm allocation: SLURM_JOB_ID is not set",
            hint="run zlaunch inside salloc or an sbatch script (salloc -N 3 zlaunch ...)",
        )
    return job


def parse_tasks_per_node(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Slurm's compressed counts: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in text.split(","):
        match = _COUNT.match(item.strip())
        if match is None:
            raise UsageError(
                f"{variable}={text!r}: {item!r} is not a count or COUNT(xREPEAT)",
                hint="Slurm writes it as e.g. 2(x3),1; unset it or fix the value",
            )
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat > MAX_SLOTS * 64:
            raise UsageError(f"{variable}={text!r}: repeat {repeat} is too large")
        counts.extend([count] * repeat)
    return counts


def _gpus_per_node(environ: Mapping[str, str]) -> int | None:
    """``SLURM_GPUS_PER_NODE`` (from --gpus-per-node): ``4``, ``a100:4`` or ``gpu:a100:4``."""
    raw = environ.get("SLURM_GPUS_PER_NODE", "").strip()
    if not raw:
        return None
    last = raw.split(",")[0].split(":")[-1]
    if not (last.isascii() and last.isdigit()):
        raise UsageError(
            f"SLURM_GPUS_PER_NODE={raw!r}: no GPU count at its end",
            hint="Slurm writes it as 4 or a100:4; --num-gpus N sets the slots instead",
        )
    return int(last)


def allocation_hosts(environ: Mapping[str, str], num_gpus: int | None = None) -> list[Host]:
    """The allocation's nodes in Slurm's order, each with its slots.

    Slots per node, first that applies: ``--num-gpus``; the GPUs per node the job asked for
    (``SLURM_GPUS_PER_NODE``); the tasks per node (``SLURM_TASKS_PER_NODE``, which Slurm always
    sets: 1 per node unless --ntasks/--ntasks-per-node said otherwise).
    """
    from zlaunch.wire import HostlistError, expand

    job_id(environ)
    var = next((n for n in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if environ.get(n)), None)
    if var is None:
        raise UsageError(
            "--launcher slurm: SLURM_JOB_NODELIST is not set, so the allocation's nodes are "
            "unknown",
            hint="run zlaunch inside salloc or an sbatch script, or give --hostfile",
        )
    try:
        names = expand(environ[var])
    except HostlistError as err:
        raise UsageError(f"{var}: {err}") from None
    if not names:
        raise UsageError(f"{var} is empty: the allocation has no nodes")
    if num_gpus is not None:
        if not 1 <= num_gpus <= MAX_SLOTS:
            raise UsageError(f"--num-gpus must be 1-{MAX_SLOTS}, got {num_gpus}")
        counts = [num_gpus] * len(names)
    elif (gpus := _gpus_per_node(environ)) is not None:
        counts = [gpus] * len(names)
    elif environ.get("SLURM_TASKS_PER_NODE"):
        counts = parse_tasks_per_node(environ["SLURM_TASKS_PER_NODE"])
        if len(counts) != len(names):
            raise UsageError(
                f"SLURM_TASKS_PER_NODE={environ['SLURM_TASKS_PER_NODE']!r} counts {len(counts)} "
                f"nodes but {var} names {len(names)}",
                hint="--num-gpus N sets the slots per node instead",
            )
    else:
        counts = [1] * len(names)
    for name, count in zip(names, counts, strict=True):
        if not 1 <= count <= MAX_SLOTS:
            raise UsageError(
                f"node {name} of the allocation has {count} slots",
                hint="--num-gpus N sets the slots per node",
            )
    return [Host(name, tuple(range(count))) for name, count in zip(names, counts, strict=True)]


def srun_argv(
    host: str, job: str, argv: Sequence[str], extra: Sequence[str] = (), srun: str = "srun"
) -> list[str]:
    """The srun command line that starts ``argv`` (the agent) as a one-task step on ``host``.

    ``--overlap``: the agents' steps and any later attempt's steps share the allocation's CPUs
    (a step would otherwise wait for another's). ``--cpu-bind=none``: the workers' binding is
    the agent's business, not one CPU of a one-task step. ``--kill-on-bad-exit``: the step ends
    with its agent. ``--quiet``: srun's own progress lines stay out of the agent's stderr.
    ``--unbuffered``: frames go through as they are written.
    """
    return [
        srun,
        f"--jobid={job}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={host}",
        "--overlap",
        "--cpu-bind=none",
        "--kill-on-bad-exit=1",
        "--quiet",
        "--unbuffered",
        f"--job-name=zlaunch-agent-{host}",
        *extra,
        "--",
        *argv,
    ]


def ended_by_slurm(stderr_lines: Sequence[str]) -> str | None:
    """Why Slurm ended the step, from srun's stderr: ``"cancelled by Slurm (scancel)"``,
    ``"... due to time limit"``, ...; None when srun said no such thing."""
    for line in reversed(stderr_lines):
        match = _CANCELLED.search(line)
        if match:
            kind = "job" if "*** JOB" in line else "step"
            due = match.group(4)
            what = f"Slurm cancelled {kind} {match.group(1)} on {match.group(2)}"
            return f"{what} due to {due.strip().lower()}" if due else f"{what} (scancel)"
    return None


class SlurmLink(LocalLink):
    """An agent started by srun on one node; the srun process is the controller's child."""

    job: str = ""

    @classmethod
    def start_on(
        cls,
        host: Host,
        argv: Sequence[str],
        environ: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> SlurmLink:
        environ = os.environ if environ is None else environ
        srun = require_program(
            "srun",
            environ,
            "slurm",
            "load Slurm's client tools (module load slurm), or use --hostfile over SSH",
        )
        job = job_id(environ)
        link = cls.start(host, srun_argv(host.name, job, argv, extra, srun=srun))
        link.job = job
        return link

    def end_reason(self, wait: float = 2.0) -> str | None:
        """Why the step ended, when Slurm ended it (scancel, time limit, preemption); None when
        it did not (or srun has not said so within ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while True:
            reason = ended_by_slurm(self.stderr_tail())
            if reason is not None or wait <= 0 or time.monotonic() > deadline:
                return reason
            if self.proc.poll() is not None:  # srun is gone: its last stderr lines are in
                time.sleep(0.1)
                return ended_by_slurm(self.stderr_tail())
            time.sleep(0.05)
