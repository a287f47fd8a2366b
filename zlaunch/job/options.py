"""The typed description of one launch, built once from the command line.

`zlaunch/commands/run_options.py` turns argv into a `LaunchOptions`; nothing below it sees raw
arguments. Everything here is already validated (files exist, config parsed, selectors
applied), so the launcher can trust it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zlaunch.errors import UsageError
from zlaunch.job.hostfile import Host

if TYPE_CHECKING:
    from zlaunch.job.deepspeed_api import DeepSpeedApi

__all__ = [
    "SshOptions",
    "K8sOptions",
    "LaunchOptions",
    "DEFAULT_LOG_DIR",
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_PREEMPTION_DEADLINE",
    "DEFAULT_GROW_INTERVAL",
    "LAUNCHERS",
    "Launcher",
    "SLURM_MODES",
    "SlurmMode",
]

DEFAULT_LOG_DIR = "zlaunch_runs"
DEFAULT_GRACE_PERIOD = 5.0


class Launcher(enum.StrEnum):
    """How agents are started (zlaunch/transport/): over SSH (a local subprocess for local
    hosts), by Slurm's srun, by Open MPI's mpirun, by someone else (they dial in), as actors
    on a Ray cluster, or as the pods of a Kubernetes Job. A str, as --launcher spells it."""

    SSH = "ssh"
    SLURM = "slurm"
    MPI = "mpi"
    DIALIN = "dialin"
    RAY = "ray"
    K8S = "k8s"


class SlurmMode(enum.StrEnum):
    """How --launcher slurm starts the agents: one srun step per node, or one srun for all
    nodes whose agents connect back over TCP (zlaunch/transport/slurm_one_step.py)."""

    STEP_PER_NODE = "step-per-node"
    ONE_STEP = "one-step"


#: --launcher's and --slurm-mode's choices, as the command line spells them.
LAUNCHERS = tuple(launcher.value for launcher in Launcher)
SLURM_MODES = tuple(mode.value for mode in SlurmMode)
DEFAULT_HANG_TIMEOUT = 900.0
"""15 minutes: half of torch's default collective timeout, so a hang is reported with every
rank's stacks before torch's own timeout ends ranks one by one without them; long enough for
a slow step or a checkpoint save (each ends at a step boundary)."""
DEFAULT_PREEMPTION_DEADLINE = 30.0
"""Seconds from a preemption notice to the host's going, when the notice does not say: the
shortest warning the common clouds give (a spot instance's is two minutes, a preemptible
VM's thirty seconds)."""
DEFAULT_PREEMPTION_CHECK_INTERVAL = 5.0
DEFAULT_GROW_INTERVAL = 60.0
"""Seconds an attempt runs at least before a job grows onto a host that came back: every grow
costs a save and a restart, so a host that flaps does not keep the job restarting."""


@dataclass(frozen=True)
class SshOptions:
    """How to reach remote hosts."""

    config_file: str | None = None
    """ssh config file (`ssh -F`); None = the user's ~/.ssh/config."""
    port: int | None = None
    """ssh port for hosts whose hostfile line has no `port=`; None = ssh's default."""
    identity: str | None = None
    """Private key file (`ssh -i`); None = ssh's default keys and agent."""
    timeout: float = 10.0
    """Seconds to wait for each ssh connection before the host counts as unreachable."""
    accept_new_hosts: bool = False
    """Trust a host whose key is in no known_hosts file, and record it (ssh's accept-new)."""

    def __post_init__(self) -> None:
        if self.port is not None and not 1 <= self.port <= 65535:
            raise UsageError(f"--ssh-port must be 1-65535, got {self.port}")
        if not self.timeout > 0 or self.timeout == float("inf"):
            raise UsageError(
                f"--ssh-timeout must be more than 0 seconds (and finite), got {self.timeout}"
            )


@dataclass(frozen=True)
class K8sOptions:
    """--launcher k8s: where and as what the pods run (zlaunch/transport/k8s.py)."""

    image: str
    namespace: str = "default"
    context: str | None = None
    """The kubeconfig context (None: its current one, else the in-cluster configuration)."""
    cpu: str | None = None
    memory: str | None = None
    gpus: int = 0
    python: str = "python"
    """The interpreter in the image that runs the agent."""


@dataclass(frozen=True)
class LaunchOptions:
    """Everything the launcher needs to run one job."""

    hosts: tuple[Host, ...]
    """The selected hosts, in rank order, each with its selected slots."""
    program: tuple[str, ...]
    """What runs: (script, *args) | ("-m", module, *args) | (exe, *args) with no_python."""
    python: str
    """Interpreter on the nodes (default: the controller's sys.executable)."""
    no_python: bool = False
    """program[0] is an executable run directly, not a Python script."""
    module: bool = False
    """program is ("-m", module, *args): run a module like `python -m`."""
    config_path: str | None = None
    """Absolute path of the training config, already validated; exported as ZLAUNCH_CONFIG."""
    cwd: str = "."
    """Working directory of every worker (absolute)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Worker environment from the controller: forwarded names + env files + --env, merged."""
    master_addr: str | None = None
    """Rendezvous address; None = the first host, by an address the others can reach."""
    master_port: int | None = None
    """Rendezvous port; None = a free port probed on the master host."""
    ssh: SshOptions = field(default_factory=SshOptions)
    """How to reach remote hosts."""
    launcher: Launcher = Launcher.SSH
    """How agents start: "ssh", "slurm" (one srun step per node), "mpi" (mpirun per node) or
    "dialin" (started by someone else, they dial in: zlaunch/transport/dialin.py) or "ray"
    (agent actors on a Ray cluster, dialing in: zlaunch/transport/ray_scheduler.py)."""
    launcher_args: tuple[str, ...] = ()
    """Extra arguments for srun (--slurm-args) or mpirun (--mpirun-args)."""
    slurm_mode: SlurmMode = SlurmMode.STEP_PER_NODE
    """With --launcher slurm: "step-per-node" (one srun per node) or "one-step" (one srun for
    all nodes, the agents connecting back over TCP); --slurm-mode auto is resolved before."""
    controller_addr: str | None = None
    """one-step: the address of this machine the agents connect to; None = the one that routes
    to the nodes."""
    controller_port: int = 0
    """--launcher dialin: the port the agents dial in to; 0 = any free one (said at start)."""
    token_file: str | None = None
    """--launcher dialin: the private file holding the job's token (written if absent)."""
    ray_address: str | None = None
    """--launcher ray: the cluster (--ray-address); None = RAY_ADDRESS, else a local Ray."""
    ray_include: tuple[str, ...] = ()
    ray_exclude: tuple[str, ...] = ()
    """--launcher ray: the Ray nodes (ids or IPs) the agents may, or may not, be placed on."""
    k8s: K8sOptions | None = None
    """--launcher k8s: the pods' namespace, image, context and resources."""
    log_dir: str = DEFAULT_LOG_DIR
    """Root of the run directories (absolute once built by the CLI)."""
    ranks_filter: frozenset[int] | None = None
    """Ranks whose output the console shows; None = all. Log files always hold every rank."""
    color: bool | None = None
    """Console color: None = auto (a TTY and no NO_COLOR), False = never, True = always."""
    collapse: bool | None = None
    """Identical lines of many ranks shown once on the console (zlaunch/console/collapse.py):
    None = when more than 8 ranks are shown, False = never (--no-collapse), True = always."""
    grace_period: float = DEFAULT_GRACE_PERIOD
    """Seconds between SIGTERM and SIGKILL when stopping workers."""
    dry_run: bool = False
    """Print the plan and start nothing."""
    pass_local_rank: bool = False
    """Append `--local_rank=N` to every worker's arguments, as DeepSpeed's launcher does."""
    checkpoint_dir: str | None = None
    """Absolute checkpoint directory, exported as ZLAUNCH_CHECKPOINT_DIR."""
    resume: bool = False
    """Workers load the latest checkpoint in checkpoint_dir at start (ZLAUNCH_RESUME=1)."""
    max_restarts: int = 0
    """Restarts of the whole job after a rank fails (a budget for the whole job)."""
    save_on: str | None = "SIGUSR1"
    """Signal that makes every rank save at the next step and exit 0; None disables."""
    hang_timeout: float = DEFAULT_HANG_TIMEOUT
    """Seconds without any rank reaching a step boundary before the job is declared hung
    (stacks collected, every rank stopped, restarted if restarts are left); 0 disables."""
    min_nodes: int | None = None
    """With --max-restarts: a host whose agent is lost is dropped and the job restarts on the
    rest (plus spare_hosts) while at least this many hosts remain; None: restart on the same
    hosts."""
    spare_hosts: tuple[Host, ...] = ()
    """Hosts listed beyond --num-nodes, taken in order to replace lost ones."""
    max_nodes: int | None = None
    """--max-nodes (or --nnodes MIN:MAX): the job grows back up to this many hosts when hosts
    that were lost, spares, or hosts added to the hostfile answer a probe; None: it never
    grows."""
    grow_interval: float = DEFAULT_GROW_INTERVAL
    """--grow-interval: the least seconds an attempt runs before the job grows."""
    hostfile: str | None = None
    """The hostfile's absolute path, re-read while a job that can grow runs (new hosts may
    join); None: no hostfile."""
    slots_per_host: int | None = None
    """--num-gpus: the slots a host added to the hostfile runs (None: all it lists)."""
    preemption_signal: str | None = None
    """Canonical name of the signal that, sent to a host's agent, is that host's preemption
    notice (--preemption-signal; Slurm's --signal reaches the agents); None: none is."""
    preemption_deadline: float = DEFAULT_PREEMPTION_DEADLINE
    """Seconds from a preemption notice to the host's going: the ranks' save must be complete
    by then, or it is discarded and every rank stopped."""
    preemption_check: str | None = None
    """A shell command every agent runs every preemption_check_interval seconds; exit 0 is
    that host's preemption notice."""
    preemption_check_interval: float = DEFAULT_PREEMPTION_CHECK_INTERVAL
    slow_node: str = "warn"
    """--slow-node: "warn" (a host that stays slow is named) or "exclude" (it is also taken
    out at the next step boundary after a save, and the job goes on without it:
    zlaunch/launcher/slow_nodes.py)."""
    batch: str | None = None
    """The batch triple the ranks use instead of their config's ("TB,MICRO,GAS"), set for a
    restart on another world size; exported as ZLAUNCH_BATCH."""
    collective_timeout: float | None = None
    """torch.distributed's collective timeout in seconds for the workers; None: the
    runtime's default (DEEPSPEED_TIMEOUT minutes if set, else 30 minutes)."""
    deepspeed_api: DeepSpeedApi | None = None
    """Which runtime serves ``import deepspeed`` in the workers (--runtime); None: the
    workers' path is left as it is (no Python program, or options built by a test)."""

    def __post_init__(self) -> None:
        if not self.hosts:
            raise UsageError("no hosts selected")
        if not self.program:
            raise UsageError("nothing to run: give a SCRIPT")
        if self.no_python and self.module:
            raise UsageError("--module and --no-python cannot be used together")
        if self.module and (len(self.program) < 2 or self.program[0] != "-m"):
            raise UsageError("with --module, program must be ('-m', MODULE, *ARGS)")
        if self.master_port is not None and not 0 <= self.master_port <= 65535:
            raise UsageError(f"--master-port must be 0-65535, got {self.master_port}")
        if self.launcher not in LAUNCHERS:
            raise UsageError(
                f"--launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}"
            )
        if self.slurm_mode not in SLURM_MODES:
            raise UsageError(
                f"--slurm-mode must be one of {', '.join(SLURM_MODES)}, got {self.slurm_mode!r}"
            )
        # A plain string from a caller (a test, a script) becomes the member it names.
        object.__setattr__(self, "launcher", Launcher(self.launcher))
        object.__setattr__(self, "slurm_mode", SlurmMode(self.slurm_mode))
        if self.launcher == Launcher.K8S and self.k8s is None:
            raise UsageError("--launcher k8s needs --image IMAGE: the pods' image with zlaunch")
        if self.launcher == Launcher.DIALIN and not self.token_file:
            raise UsageError(
                "--launcher dialin needs --token-file FILE: where the job's token is kept "
                "(written, private, if it does not exist) for the agents to prove it"
            )
        if not 0 <= self.controller_port <= 65535:
            raise UsageError(f"--controller-port must be 0-65535, got {self.controller_port}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be 0 or more, got {self.max_restarts}")
        if self.resume and not self.checkpoint_dir:
            raise UsageError("--resume needs --checkpoint-dir DIR (where to resume from)")
        if self.min_nodes is not None:
            if not 1 <= self.min_nodes <= len(self.hosts):
                raise UsageError(
                    f"--min-nodes must be between 1 and the {len(self.hosts)} selected host(s), "
                    f"got {self.min_nodes}"
                )
            if self.max_restarts < 1:
                raise UsageError(
                    "--min-nodes only matters when the job restarts",
                    hint="add --max-restarts N (the restarts that may drop lost hosts)",
                )
        self._check_node_range()
        if not 0 <= self.hang_timeout < float("inf"):  # also refuses nan
            raise UsageError(
                f"--hang-timeout must be 0 (off) or more seconds, got {self.hang_timeout}"
            )
        if self.collective_timeout is not None and not 0 < self.collective_timeout < float("inf"):
            raise UsageError(
                f"--collective-timeout must be more than 0 seconds, got {self.collective_timeout}"
            )
        if not 0 < self.preemption_deadline < float("inf"):  # also refuses nan
            raise UsageError(
                f"--preemption-deadline must be more than 0 seconds, got {self.preemption_deadline}"
            )
        if not 0.1 <= self.preemption_check_interval < float("inf"):
            raise UsageError(
                "--preemption-check-interval must be at least 0.1 seconds, got "
                f"{self.preemption_check_interval}"
            )
        if self.preemption_check is not None and not self.preemption_check.strip():
            raise UsageError("--preemption-check needs a command", hint="e.g. ./about-to-go.sh")
        if self.slow_node not in ("warn", "exclude"):
            raise UsageError(f"--slow-node must be warn or exclude, got {self.slow_node!r}")
        if self.slow_node == "exclude" and (self.min_nodes is None or not self.checkpoint_dir):
            raise UsageError(
                "--slow-node exclude takes a slow host out by saving and going on without it: "
                "it needs --checkpoint-dir DIR and --min-nodes M (with --max-restarts N)",
                hint="add --checkpoint-dir DIR --max-restarts 1 --min-nodes M, or use "
                "--slow-node warn",
            )
        if not 0 <= self.grace_period < float("inf"):  # also refuses nan
            raise UsageError(f"--grace-period must be 0 or more (seconds), got {self.grace_period}")
        # Own copies, so later changes to the caller's dict or lists do not leak in.
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "spare_hosts", tuple(self.spare_hosts))

    def _check_node_range(self) -> None:
        """--max-nodes: a range the job can grow in, and what growing needs."""
        if not 0 <= self.grow_interval < float("inf"):  # also refuses nan
            raise UsageError(f"--grow-interval must be 0 or more seconds, got {self.grow_interval}")
        if self.max_nodes is None:
            return
        if self.min_nodes is None:
            raise UsageError(
                f"--max-nodes {self.max_nodes} needs --min-nodes M: a job grows and shrinks "
                "within a range of hosts",
                hint=f"e.g. --nnodes 1:{self.max_nodes} (or --min-nodes 1 --max-nodes "
                f"{self.max_nodes}) with --max-restarts N",
            )
        if self.max_nodes < len(self.hosts):
            raise UsageError(
                f"--max-nodes {self.max_nodes} is fewer than the {len(self.hosts)} host(s) the "
                "job starts on",
                hint=f"raise --max-nodes, or start on fewer: --num-nodes {self.max_nodes}",
            )
        if not self.checkpoint_dir or self.save_on is None:
            raise UsageError(
                "--max-nodes: a job grows by saving at a step boundary and restarting on more "
                "hosts from that checkpoint: it needs --checkpoint-dir DIR and a save signal",
                hint="add --checkpoint-dir DIR (and leave --save-on at its default)",
            )
        if self.launcher != Launcher.SSH:
            raise UsageError(
                f"--max-nodes with --launcher {self.launcher}: a job grows onto hosts it "
                "probes over SSH, which only --launcher ssh starts agents on",
                hint="drop --max-nodes (--min-nodes alone still goes on without lost hosts)",
            )
        object.__setattr__(self, "program", tuple(self.program))
        object.__setattr__(self, "launcher_args", tuple(self.launcher_args))

    @property
    def world_size(self) -> int:
        """Total number of workers: the selected slots of every host."""
        return sum(len(host.slots) for host in self.hosts)
