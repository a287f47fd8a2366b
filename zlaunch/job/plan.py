"""Hosts + options -> the per-node rank plan and every worker's environment (pure, no I/O).

Ranks follow hostfile order, then slot order: with hosts a (2 slots) and b (3 slots), a runs
ranks 0-1 and b ranks 2-4. LOCAL_RANK counts 0..n-1 on every host, whatever the other hosts
hold. The worker env is what the agent adds to (or puts over) its own base env: the
controller's forwarded names, env files and --env first, then the names below, which always
win because they define the job:

    RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, NUM_NODES        (torchrun)
    GROUP_RANK (= NODE_RANK), TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT
    (= attempt), TORCHELASTIC_MAX_RESTARTS                                          (torchrun)
    CROSS_RANK (= NODE_RANK), CROSS_SIZE (= NUM_NODES), LOCAL_SIZE (= LOCAL_WORLD_SIZE)
                                                                                    (DeepSpeed)
    MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES (the host's selected slots, comma-joined),
    ZLAUNCH_RUN_ID, ZLAUNCH_ATTEMPT, ZLAUNCH_CONFIG (only when there is a config),
    ZLAUNCH_STACKS_SIGNAL (the signal number `zlaunch stacks` uses, see runtime/observe/stacks.py)
    ZLAUNCH_CHECKPOINT_DIR, ZLAUNCH_SAVE_ON, ZLAUNCH_RESUME (with --checkpoint-dir; RESUME
    with --resume and on every restart)

OMP_NUM_THREADS, where the user did not set it, is the node's usable cores divided by its
ranks (zlaunch/job/threads.py); unlike the names above it gives way to the user's value.

ZLAUNCH_EVENTS_FD and the *_SOCKET_IFNAME defaults are added by the agent on each host.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from zlaunch.job.hostfile import Host
from zlaunch.job.options import LaunchOptions
from zlaunch.job.threads import thread_env
from zlaunch.text import redact_argv, shown_env_value
from zlaunch.wire import protocol
from zlaunch.worker import without_empty_entries

__all__ = [
    "WorkerSpec",
    "NodePlan",
    "Plan",
    "build_plan",
    "render_plan",
    "shared_env",
    "redact",
    "new_run_id",
    "RESERVED_ENV",
    "AUTO_PORT",
]

# Names the plan sets for every worker; user-supplied values for them are overridden.
RESERVED_ENV = protocol.JOB_ENV_NAMES

# master_port value meaning "not chosen yet: probed on the master host at launch".
AUTO_PORT = 0


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process: its ranks, its command and its environment."""

    rank: int
    """Global rank, 0..world_size-1."""
    local_rank: int
    """Rank on its host, 0..n-1 in slot order."""
    slot: int
    """The slot (GPU index) this worker belongs to."""
    argv: tuple[str, ...]
    """Full argv (python path, -u, script, args), exec'd directly with no shell."""
    env: Mapping[str, str]
    """Everything the worker adds to or over the agent's base env."""


@dataclass(frozen=True)
class NodePlan:
    """The workers of one host."""

    node_rank: int
    """Index of the host in the job, 0..num_nodes-1."""
    host: Host
    """The host, with its selected slots."""
    cwd: str
    """Working directory of the workers."""
    workers: tuple[WorkerSpec, ...]
    """The workers, in local-rank order."""


@dataclass(frozen=True)
class Plan:
    """The whole job for one attempt."""

    run_id: str
    """Unique id of the run (shared by all its attempts)."""
    attempt: int
    """Attempt number, 0 for the first start; also TORCHELASTIC_RESTART_COUNT."""
    world_size: int
    """Number of workers in the job."""
    master_addr: str
    """Rendezvous address every worker connects to."""
    master_port: int
    """Rendezvous port (AUTO_PORT = 0 while not chosen yet, as in --dry-run)."""
    nodes: tuple[NodePlan, ...]
    """One entry per host, in rank order."""

    @property
    def workers(self) -> tuple[WorkerSpec, ...]:
        """Every worker of the job, in rank order."""
        return tuple(w for node in self.nodes for w in node.workers)


def new_run_id(now: float | None = None) -> str:
    """A sortable, unique run id like 20261129-093012-a1b2c3 (UTC time + random suffix)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


def worker_argv(options: LaunchOptions, local_rank: int) -> tuple[str, ...]:
    """The argv of one worker: the program, behind the interpreter unless --no-python."""
    argv = options.program if options.no_python else (options.python, "-u", *options.program)
    if options.pass_local_rank:
        argv = (*argv, f"--local_rank={local_rank}")
    return tuple(argv)


def build_plan(
    options: LaunchOptions,
    hosts: Sequence[Host],
    *,
    master_addr: str,
    master_port: int,
    run_id: str,
    attempt: int,
    usable_cpus: Sequence[int | None] = (),
) -> Plan:
    """Lay out every rank of the job on `hosts` (usually `options.hosts`). ``usable_cpus``:
    per host, the cores its agent may use (its hello), for the ranks' thread default."""
    hosts = tuple(hosts)
    if not hosts:
        raise ValueError("build_plan needs at least one host")
    for host in hosts:
        if not host.slots:
            raise ValueError(f"host {host.display} has no slots selected")
    world_size = sum(len(host.slots) for host in hosts)
    job_env = {
        "WORLD_SIZE": str(world_size),
        "NUM_NODES": str(len(hosts)),
        "CROSS_SIZE": str(len(hosts)),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        **_run_env(options, run_id, attempt),
        **_checkpoint_env(options, attempt),
    }
    nodes = []
    first_rank = 0
    for node_rank, host in enumerate(hosts):
        cpus = usable_cpus[node_rank] if node_rank < len(usable_cpus) else None
        nodes.append(_node_plan(options, node_rank, host, first_rank, job_env, cpus))
        first_rank += len(host.slots)
    return Plan(
        run_id=run_id,
        attempt=attempt,
        world_size=world_size,
        master_addr=master_addr,
        master_port=master_port,
        nodes=tuple(nodes),
    )


def _run_env(options: LaunchOptions, run_id: str, attempt: int) -> dict[str, str]:
    """Which run and attempt this is, and what the runtime is to use in it."""
    env = {
        protocol.RUN_ID_ENV: run_id,
        protocol.ATTEMPT_ENV: str(attempt),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(getattr(options, "max_restarts", 0)),
        # `zlaunch stacks`: the signal on which the runtime dumps every thread's stack
        protocol.STACKS_SIGNAL_ENV: str(int(protocol.STACKS_SIGNAL)),
    }
    if options.config_path is not None:
        env[protocol.CONFIG_ENV] = options.config_path
    batch = getattr(options, "batch", None)
    if batch:
        env[protocol.BATCH_ENV] = batch
    collective_timeout = getattr(options, "collective_timeout", None)
    if collective_timeout is not None:
        env[protocol.COLLECTIVE_TIMEOUT_ENV] = f"{collective_timeout:g}"
    api = getattr(options, "deepspeed_api", None)
    if api is not None:  # `import deepspeed` -> the runtime --runtime chose
        from zlaunch.job.deepspeed_api import worker_pythonpath

        current = options.env.get("PYTHONPATH")
        path = worker_pythonpath(api, current)
        if path != current and path is not None:
            env["PYTHONPATH"] = path
    if "PYTHONPATH" not in env and dropped_pythonpath_entries(options):
        env["PYTHONPATH"] = without_empty_entries(options.env["PYTHONPATH"])[0]
    return env


def dropped_pythonpath_entries(options: LaunchOptions) -> bool:
    """The workers' PYTHONPATH (forwarded, an env file or --env) has an empty entry, which
    Python reads as the working directory before the script's own code runs (a co-user's
    ``encodings.py`` there would run in every rank): the ranks get it without, and the start
    line says so (zlaunch/worker/python_start.py)."""
    return without_empty_entries(options.env.get("PYTHONPATH", ""))[1]


def _checkpoint_env(options: LaunchOptions, attempt: int) -> dict[str, str]:
    """Checkpoints: where, whether to resume (always on a restart), which signal saves."""
    checkpoint_dir = getattr(options, "checkpoint_dir", None)
    if not checkpoint_dir:
        return {}
    env = {protocol.CHECKPOINT_DIR_ENV: checkpoint_dir}
    if getattr(options, "resume", False) or attempt > 0:
        env[protocol.RESUME_ENV] = "1"
    save_on = getattr(options, "save_on", None)
    if save_on:
        env[protocol.SAVE_ON_ENV] = save_on
    return env


def _node_plan(
    options: LaunchOptions,
    node_rank: int,
    host: Host,
    first_rank: int,
    job_env: dict[str, str],
    cpus: int | None = None,
) -> NodePlan:
    """The workers of one host, ranks from ``first_rank`` on in slot order."""
    base_env = {k: v for k, v in options.env.items() if k not in RESERVED_ENV}
    base_env.update(thread_env(options.env, cpus, len(host.slots)))
    local_size = str(len(host.slots))
    node_env = {
        **job_env,
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "CROSS_RANK": str(node_rank),
        "LOCAL_WORLD_SIZE": local_size,
        "LOCAL_SIZE": local_size,
        "CUDA_VISIBLE_DEVICES": ",".join(str(slot) for slot in host.slots),
    }
    workers = []
    for local_rank, slot in enumerate(host.slots):
        rank = first_rank + local_rank
        env = {**base_env, **node_env, "RANK": str(rank), "LOCAL_RANK": str(local_rank)}
        argv = worker_argv(options, local_rank)
        workers.append(WorkerSpec(rank, local_rank, slot, argv, env))
    return NodePlan(node_rank, host, options.cwd, tuple(workers))


def shared_env(envs: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The names (and values) that every one of ``envs`` has in common."""
    if not envs:
        return {}
    common = dict(envs[0])
    for env in envs[1:]:
        common = {k: v for k, v in common.items() if env.get(k) == v}
    return common


def redact(name: str, value: str) -> str:
    """The value --dry-run shows: hidden when it looks secret (see zlaunch/text/redact.py)."""
    return shown_env_value(name, value)


def _show(value: str) -> str:
    """A value as one readable line: plain when safe, JSON-quoted when it holds odd chars."""
    if value and all(c.isprintable() and not c.isspace() for c in value) and '"' not in value:
        return value
    return json.dumps(value, ensure_ascii=False)


def _show_argv(argv: Sequence[str]) -> str:
    """Shell-like command line for display only (workers are exec'd, never via a shell)."""
    return " ".join(shlex.quote(a) if a.isprintable() else _show(a) for a in argv)


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def render_plan(plan: Plan) -> str:
    """Human-readable plan for --dry-run: per host its ranks, slots and command; env shown once.

    Values that look secret are redacted (zlaunch/text/redact.py: by name, token format, URL
    password; arguments like --api-token=X too); names are sorted. The env every worker of the
    job shares is printed once, at the end ("env of every rank"); a host's "env:" block holds
    only what its workers share and others do not (CUDA_VISIBLE_DEVICES, NODE_RANK, ...); the
    rank lines show what differs per rank (RANK and LOCAL_RANK, and anything else that would).
    """
    port = "auto" if plan.master_port == AUTO_PORT else str(plan.master_port)
    master = f"[{plan.master_addr}]" if ":" in plan.master_addr else plan.master_addr
    lines = [
        f"run {plan.run_id}  attempt {plan.attempt}  world size {plan.world_size}  "
        f"nodes {len(plan.nodes)}  master {master}:{port}",
    ]
    every = shared_env([_shown_env(plan, w) for w in plan.workers])
    for node in plan.nodes:
        lines.append("")
        lines.extend(_node_lines(plan, node, every))
    lines.append("")
    lines.append("env of every rank:")
    lines.extend(_env_lines(every, "    "))
    return "\n".join(lines) + "\n"


def _shown_env(plan: Plan, worker: WorkerSpec) -> dict[str, str]:
    env = dict(worker.env)
    if plan.master_port == AUTO_PORT:
        env["MASTER_PORT"] = "auto"
    return env


def _env_lines(env: Mapping[str, str], indent: str) -> list[str]:
    return [f"{indent}{name}={_show(redact(name, env[name]))}" for name in sorted(env)]


def _node_lines(plan: Plan, node: NodePlan, every: Mapping[str, str]) -> list[str]:
    """One host of the plan: where, its ranks and their commands, what only its ranks share."""
    host = node.host
    where = f"{host.user}@{host.display}" if host.user else host.display
    if host.port:
        where += f" (ssh port {host.port})"
    ranks = [w.rank for w in node.workers]
    lines = [
        f"node {node.node_rank}: {where}  ranks {_ranks_text(ranks)}  "
        f"slots {','.join(map(str, host.slots))}  cwd {_show(node.cwd)}"
    ]
    common = shared_env([_shown_env(plan, w) for w in node.workers])
    for worker in node.workers:
        own = {k: v for k, v in _shown_env(plan, worker).items() if k not in common}
        lines.append(
            f"  rank {worker.rank} (local {worker.local_rank}, slot {worker.slot}): "
            f"{_show_argv(redact_argv(worker.argv))}"
        )
        if own:
            lines.append("    " + " ".join(_env_lines(own, "")))
    node_only = {k: v for k, v in common.items() if k not in every}
    if node_only:
        lines.append("  env:")
        lines.extend(_env_lines(node_only, "    "))
    return lines
