"""`zlaunch run`'s command-line values -> a validated `LaunchOptions` (no host contacted).

The edge of the launcher: every check that can fail without touching a host happens here, in
the order a user would fix things: the program, the launcher and the hosts, the training
config, the worker environment, then the remaining flags.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import click

from zlaunch.commands.familiar import node_range, refuse_config_as_script, resolve_nodes, ssh_of
from zlaunch.errors import ConfigError, UsageError
from zlaunch.job import Launcher
from zlaunch.text import clip, redact_argv

if TYPE_CHECKING:
    from zlaunch.job import Host, LaunchOptions

__all__ = [
    "RunArguments",
    "build_options",
    "find_config_in_args",
    "parse_ranks",
    "validate_config",
]

# Spellings of a config path among the script's own args (DeepSpeed scripts use the last two).
SCRIPT_CONFIG_FLAGS = ("--config", "--deepspeed_config", "--deepspeed-config")
# The Hugging Face Trainer's spelling (TrainingArguments.deepspeed), with a file as its value.
HF_CONFIG_FLAG = "--deepspeed"
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(frozen=True)
class RunArguments:
    """The values of `zlaunch run`'s options as click parsed them, one field per option
    (`zlaunch run --help` says what each does), plus the environment and home directory the
    command sees. Nothing here is validated yet: `build_options` does that."""

    script: str
    script_args: Sequence[str]
    hostfile: str | None = None
    include: str | None = None
    exclude: str | None = None
    num_nodes: int | None = None
    nnodes: str | None = None
    node_rank: str | None = None
    num_gpus: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    ssh_config: str | None = None
    ssh_port: int | None = None
    identity: str | None = None
    ssh_timeout: float = 10.0
    accept_new_hosts: bool = False
    python: str | None = None
    chdir: str | None = None
    env: Sequence[str] = ()
    module: bool = False
    no_python: bool = False
    log_dir: str | None = None
    ranks: str | None = None
    no_color: bool = False
    collapse: bool | None = None
    grace_period: float = 5.0
    dry_run: bool = False
    config: str | None = None
    pass_local_rank: bool = False
    checkpoint_dir: str | None = None
    resume: bool = False
    resume_if_present: bool = False
    max_restarts: int = 0
    save_on: str | None = "SIGUSR1"
    peak_tflops: float | None = None
    mfu: bool = False
    hang_timeout: float | None = None
    collective_timeout: float | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    grow_interval: float | None = None
    preemption_signal: str | None = None
    preemption_deadline: float = 30.0
    preemption_check: str | None = None
    preemption_check_interval: float = 5.0
    slow_node: str = "warn"
    launcher: str = "auto"
    slurm_args: str | None = None
    slurm_mode: str = "auto"
    controller_addr: str | None = None
    controller_port: int | None = None
    token_file: str | None = None
    ray_address: str | None = None
    image: str | None = None
    namespace: str | None = None
    k8s_context: str | None = None
    k8s_cpu: str | None = None
    k8s_memory: str | None = None
    k8s_gpus: int | None = None
    k8s_python: str | None = None
    mpirun_args: str | None = None
    runtime: str = "auto"
    environ: Mapping[str, str] | None = None
    """The environment to read (default: os.environ)."""
    home: str | None = None
    """The home directory for env files (default: the user's)."""

    def __post_init__(self) -> None:
        if self.environ is None:
            object.__setattr__(self, "environ", os.environ)
        if self.home is None:
            object.__setattr__(self, "home", os.path.expanduser("~"))


def build_options(**values) -> LaunchOptions:
    """Turn parsed command-line values (the fields of `RunArguments`) into a validated
    `LaunchOptions`; no host is contacted."""
    args = RunArguments(**values)
    nnodes, min_nodes, max_nodes = node_range(args.nnodes, args.min_nodes, args.max_nodes)
    if args.grow_interval is not None and max_nodes is None:
        raise UsageError(
            "--grow-interval is how often a job may grow: it needs --max-nodes N",
            hint="add --max-nodes N (or --nnodes MIN:MAX), or drop --grow-interval",
        )
    args = replace(args, nnodes=nnodes, min_nodes=min_nodes, max_nodes=max_nodes)
    num_nodes = resolve_nodes(
        num_nodes=args.num_nodes,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        hostfile=args.hostfile,
    )
    args = replace(args, num_nodes=num_nodes)
    cwd = _working_directory(args)
    launch_with = _launcher(
        args.launcher, args.hostfile, args.slurm_args, args.mpirun_args, args.environ
    )
    hosts, spares = _hosts(args, launcher=launch_with[0])
    world_size = sum(len(host.slots) for host in hosts)
    config_path = _config_path(args, cwd)
    if config_path is not None:
        validate_config(config_path, world_size)
    return _launch_options(args, cwd, hosts, spares, launch_with, config_path)


def _working_directory(args: RunArguments) -> str:
    """The workers' directory, once the program options agree and the script is there."""
    if args.module and args.no_python:
        raise UsageError("--module and --no-python cannot be used together")
    if args.no_python and args.python is not None:
        raise UsageError("--python has no effect with --no-python", hint="drop one of them")
    python = args.python
    if python is not None and (not python or python.startswith("-")):
        raise UsageError(
            f"--python {clip(python)}: expected an interpreter, e.g. --python /usr/bin/python3",
            hint="--python takes the interpreter's path; its options cannot be passed there",
        )
    cwd = os.path.abspath(os.path.expanduser(args.chdir)) if args.chdir else os.getcwd()
    if not os.path.isdir(cwd):
        raise UsageError(f"--chdir {cwd}: no such directory")
    if not args.module and not args.no_python:
        script = args.script
        refuse_config_as_script(script)
        script_path = script if os.path.isabs(script) else os.path.join(cwd, script)
        if not os.path.isfile(script_path):
            where = "" if os.path.isabs(script) else f" (looked in {cwd})"
            raise UsageError(
                f"script {script} not found{where}",
                hint="check the path, or use -m for a module and --no-python for a program",
            )
    return cwd


def _hosts(args: RunArguments, launcher: str) -> tuple[list[Host], list[Host]]:
    """The selected hosts, and the spares that may replace lost ones (with --min-nodes)."""
    from zlaunch.job import default_hosts, load_hostfile, select_hosts

    if launcher in (Launcher.DIALIN, Launcher.K8S):
        return _dialin_hosts(args, launcher), []
    if launcher == Launcher.RAY:
        return _ray_hosts(args), []
    if args.hostfile is not None:
        hosts = load_hostfile(os.path.expanduser(args.hostfile))
    elif launcher != Launcher.SSH:
        from zlaunch.transport import allocation_hosts, in_allocation

        if not in_allocation(args.environ):
            raise UsageError(
                f"--launcher {launcher} needs --hostfile, or a Slurm allocation to take the "
                "nodes from (SLURM_JOB_ID is not set)",
                hint="run zlaunch inside salloc or an sbatch script, or give --hostfile",
            )
        hosts = allocation_hosts(args.environ, args.num_gpus)
    else:
        hosts = default_hosts(args.num_gpus, args.environ)
    selected = select_hosts(hosts, args.include, args.exclude, args.num_nodes, args.num_gpus)
    if args.max_nodes is not None and args.num_nodes is None:
        selected = selected[: args.max_nodes]  # a range starts on up to MAX hosts
    spares = _spare_hosts(hosts, selected, args.num_gpus) if args.min_nodes is not None else []
    return selected, spares


def _dialin_hosts(args: RunArguments, launcher: str = "dialin") -> list[Host]:
    """--launcher dialin or k8s: ``--nodes`` nodes of ``--num-gpus`` slots each (1 by default), named
    in the order their agents dial in (the controller does not choose them)."""
    from zlaunch.transport import dialin_hosts

    for flag, value in (
        ("--hostfile", args.hostfile),
        ("--include", args.include),
        ("--exclude", args.exclude),
    ):
        if value is not None:
            raise UsageError(
                f"{flag} has no effect with --launcher {launcher}: the nodes are whichever agents "
                "dial in",
                hint="drop it; --nodes N says how many agents to wait for",
            )
    if args.num_nodes is None:
        raise UsageError(
            f"--launcher {launcher} needs --nodes N: how many agents to wait for",
            hint="e.g. zlaunch run --launcher dialin --nodes 2 --token-file ~/job.token train.py",
        )
    slots = tuple(range(args.num_gpus or 1))
    return dialin_hosts(args.num_nodes, slots)


def _ray_hosts(args: RunArguments) -> list[Host]:
    """--launcher ray: ``--num-nodes`` nodes of ``--num-gpus`` slots each (1 by default); Ray
    chooses them (--include/--exclude name Ray nodes, not hostfile entries)."""
    from zlaunch.transport import dialin_hosts

    if args.hostfile is not None:
        raise UsageError(
            "--hostfile has no effect with --launcher ray: Ray places the agents",
            hint="drop it; --num-nodes N says how many nodes, --include/--exclude which",
        )
    if args.num_nodes is None:
        raise UsageError(
            "--launcher ray needs --num-nodes N: how many Ray nodes the job runs on",
            hint="e.g. zlaunch --launcher ray --num-nodes 3 train.py",
        )
    return dialin_hosts(args.num_nodes, tuple(range(args.num_gpus or 1)))


def _ray_nodes(value: str | None) -> tuple[str, ...]:
    """--include/--exclude with --launcher ray: Ray node ids or IPs, comma- or @-separated."""
    if not value:
        return ()
    return tuple(part.strip() for part in value.replace("@", ",").split(",") if part.strip())


def _config_path(args: RunArguments, cwd: str) -> str | None:
    """The training config: zlaunch's own --config is relative to where zlaunch runs; one
    found in the script's args is relative to the script's working directory, as the script
    will read it. Both given must name the same file."""
    config_path = os.path.abspath(os.path.expanduser(args.config)) if args.config else None
    in_args = find_config_in_args(args.script_args)
    if in_args is None:
        return config_path
    in_args = os.path.normpath(os.path.join(cwd, os.path.expanduser(in_args)))
    if config_path is not None and os.path.realpath(config_path) != os.path.realpath(in_args):
        raise UsageError(
            f"--config {config_path} differs from the script's config {in_args}",
            hint="give the config once",
        )
    return config_path or in_args


def _worker_env(args: RunArguments) -> dict[str, str]:
    """Forwarded variables, env files and --env, merged; --peak-tflops and --mfu for the
    ranks."""
    from zlaunch.job import RESERVED_ENV, collect_env

    worker_env = collect_env(args.environ, cwd=os.getcwd(), home=args.home, env_options=args.env)
    for item in args.env:
        name = item.partition("=")[0]
        if name in RESERVED_ENV:
            raise UsageError(
                f"--env {name}: zlaunch sets {name} for every worker",
                hint="leave it out; see `zlaunch run --help` for how ranks are assigned",
            )
    if args.peak_tflops is not None:
        from zlaunch.wire import PEAK_TFLOPS_ENV

        if not 0 < args.peak_tflops < float("inf"):
            raise UsageError(f"--peak-tflops must be a positive number, got {args.peak_tflops}")
        worker_env[PEAK_TFLOPS_ENV] = repr(float(args.peak_tflops))
    if args.mfu or args.peak_tflops is not None:
        from zlaunch.wire import MFU_ENV

        worker_env[MFU_ENV] = "1"
    return worker_env


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(os.path.expanduser(path)) if path else None


def _launch_options(
    args: RunArguments,
    cwd: str,
    hosts: list[Host],
    spares: list[Host],
    launch_with: tuple[str, tuple[str, ...]],
    config_path: str | None,
) -> LaunchOptions:
    """The checked pieces (`launch_with`: the launcher and its extra arguments), the worker
    environment and the remaining flags, as one LaunchOptions."""
    from zlaunch.job import DEFAULT_GROW_INTERVAL, DEFAULT_HANG_TIMEOUT, LaunchOptions
    from zlaunch.rundir import default_log_dir

    worker_env = _worker_env(args)
    launcher, launcher_args = launch_with
    world_size = sum(len(host.slots) for host in hosts)
    prefix = ("-m",) if args.module else ()
    return LaunchOptions(
        hosts=tuple(hosts),
        program=(*prefix, args.script, *args.script_args),
        python=args.python or sys.executable,
        no_python=args.no_python,
        module=args.module,
        config_path=config_path,
        cwd=cwd,
        env=worker_env,
        master_addr=args.master_addr,
        master_port=args.master_port,
        launcher=launcher,
        launcher_args=launcher_args,
        slurm_mode=_slurm_mode(args.slurm_mode, launcher, len(hosts), args.controller_addr),
        controller_addr=_controller_addr(args.controller_addr),
        controller_port=_controller_port(args.controller_port, launcher),
        token_file=_token_file(args.token_file, launcher),
        ray_address=_ray_address(args.ray_address, launcher),
        ray_include=_ray_nodes(args.include) if launcher == Launcher.RAY else (),
        ray_exclude=_ray_nodes(args.exclude) if launcher == Launcher.RAY else (),
        k8s=_k8s(args, launcher),
        ssh=ssh_of(
            args.ssh_config, args.ssh_port, args.identity, args.ssh_timeout, args.accept_new_hosts
        ),
        log_dir=_absolute(args.log_dir) or default_log_dir(args.environ),
        ranks_filter=parse_ranks(args.ranks, world_size) if args.ranks else None,
        color=False if args.no_color else None,
        collapse=args.collapse,
        grace_period=args.grace_period,
        dry_run=args.dry_run,
        pass_local_rank=args.pass_local_rank,
        checkpoint_dir=_absolute(args.checkpoint_dir),
        resume=_resume(args.resume, args.resume_if_present, args.checkpoint_dir, hosts),
        max_restarts=args.max_restarts,
        save_on=_save_on_signal(args.save_on),
        hang_timeout=DEFAULT_HANG_TIMEOUT if args.hang_timeout is None else args.hang_timeout,
        min_nodes=args.min_nodes,
        spare_hosts=tuple(spares),
        max_nodes=args.max_nodes,
        grow_interval=DEFAULT_GROW_INTERVAL if args.grow_interval is None else args.grow_interval,
        hostfile=_absolute(args.hostfile) if args.hostfile else None,
        slots_per_host=args.num_gpus,
        preemption_signal=_preemption_signal(args.preemption_signal, args.checkpoint_dir),
        preemption_deadline=args.preemption_deadline,
        preemption_check=args.preemption_check,
        preemption_check_interval=args.preemption_check_interval,
        slow_node=args.slow_node,
        collective_timeout=args.collective_timeout,
        deepspeed_api=_deepspeed_api(args, worker_env),
    )


def _deepspeed_api(args: RunArguments, worker_env: Mapping[str, str]):
    """Which runtime serves ``import deepspeed`` in the workers (--runtime; see
    zlaunch.job.deepspeed_api). None for a program that is not run by Python (--no-python)."""
    from zlaunch.job import bundled_path, choose, find_installed

    if args.no_python:
        if args.runtime == "bundled":
            raise UsageError(
                "--runtime bundled needs the script to run under Python",
                hint="drop --no-python, or run your program with PYTHONPATH set yourself",
            )
        return None
    environ = dict(args.environ)
    if "PYTHONPATH" in worker_env:
        environ["PYTHONPATH"] = worker_env["PYTHONPATH"]
    # Looked up for --runtime bundled too: the start line says when it shadows a real one.
    installed = find_installed(args.python or sys.executable, environ)
    return choose(args.runtime, installed, bundled_path())


def find_config_in_args(args: Sequence[str]) -> str | None:
    """The config path the script's args name, if any: `--config` / `--deepspeed_config`, or
    the Hugging Face Trainer's `--deepspeed ds.json`.

    Accepts `--config P` and `--config=P`; the last occurrence wins (as with argparse); a bare
    `--` ends the options, as it does for the script. `--deepspeed` is also DeepSpeed's own
    flag (no value, `deepspeed.add_config_arguments`), so it counts only with a value that
    names a config file: ending in .json, .yaml or .yml.
    """
    found = None
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            break
        flag, eq, value = arg.partition("=")
        if flag == HF_CONFIG_FLAG:
            value = value if eq else (args[index + 1] if index + 1 < len(args) else "")
            if value.lower().endswith(CONFIG_SUFFIXES):
                found = value
                index += 0 if eq else 1
        elif flag in SCRIPT_CONFIG_FLAGS:
            if eq:
                found = value
            elif index + 1 < len(args):
                found = args[index + 1]
                index += 1
            else:
                raise UsageError(
                    f"the script's {flag} has no value",
                    hint=f"give the config file: {flag} ds.json",
                )
            if not found:
                raise UsageError(f"the script's {flag} is empty", hint=f"{flag}=ds.json")
        index += 1
    return found


def validate_config(path: str, world_size: int) -> None:
    """Load the training config and resolve its batch sizes for `world_size`.

    Raises zlaunch ConfigError (exit 2) naming the file, the key and the fix (unknown keys,
    features turned on that the runtime does not implement); notes from the loader (settings
    with no effect, such as an unresolvable "auto") are shown once, as one `warning:` line each.
    """
    if not os.path.exists(path):
        raise ConfigError(f"config file {path} not found", hint="check the --config path")
    if not os.path.isfile(path):
        raise ConfigError(f"config {path} is not a file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"config file {path} is not readable", hint="check its permissions")
    try:
        from runtime.config import BATCH_KEYS, load_leaving_autos
        from runtime.config import ConfigError as RuntimeConfigError
    except ImportError as err:
        raise ConfigError(
            f"cannot validate {path}: runtime.config is unavailable ({err})"
        ) from None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            config, autos, unchecked = load_leaving_autos(path)
            if not any(key in autos for key in BATCH_KEYS):
                config.resolve(world_size)
        except RuntimeConfigError as err:
            message = str(err)
            name = os.path.basename(path)
            if path not in message and name not in message:
                message = f"{path}: {message}"
            raise ConfigError(message) from None
        except OSError as err:
            raise ConfigError(f"cannot read config {path}: {err.strerror or err}") from None
    for warning in caught:
        if autos and '"auto"' in str(warning.message):
            continue  # said once below, for the script that fills them in
        click.echo(f"warning: {warning.message}", err=True)
    if autos:
        blocks = f", with the {' and '.join(unchecked)} block that needs them," if unchecked else ""
        click.echo(
            f'note: {path}: the values marked "auto" ({", ".join(autos)}){blocks} are left to '
            "the script: the Hugging Face Trainer and accelerate fill them in from their own "
            "arguments; everything else was checked",
            err=True,
        )


def parse_ranks(text: str, world_size: int) -> frozenset[int]:
    """--ranks "0,3-5" -> {0, 3, 4, 5}; every rank must exist in the job."""
    ranks: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        low, dash, high = item.partition("-")
        if not _number(low) or (dash and not _number(high)):
            raise UsageError(f"--ranks: bad rank {clip(item)}", hint="e.g. --ranks 0,3-5")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise UsageError(f"--ranks: empty range {item!r}", hint=f"write {last}-{first}")
        if last >= world_size:
            raise UsageError(
                f"--ranks: rank {last} does not exist",
                hint=f"the job has ranks 0-{world_size - 1}",
            )
        ranks.update(range(first, last + 1))
    return frozenset(ranks)


def _number(text: str) -> bool:
    """ASCII digits, few enough for int() (str.isdigit() also takes '²', which int() refuses)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _resume(resume: bool, if_present: bool, checkpoint_dir: str | None, hosts) -> bool:
    """--resume insists on a checkpoint; --resume-if-present takes one when there is one.

    The check needs to see the directory: it is made when the directory exists here or every
    host is this machine; a directory only the nodes see is left to the ranks.
    """
    if resume and if_present:
        raise UsageError("--resume and --resume-if-present cannot be used together")
    if not (resume or if_present):
        return False
    if not checkpoint_dir:
        flag = "--resume" if resume else "--resume-if-present"
        raise UsageError(f"{flag} needs --checkpoint-dir DIR (where to resume from)")
    if if_present:
        return True
    directory = os.path.abspath(os.path.expanduser(checkpoint_dir))
    local = all(host.is_local for host in hosts)
    if (os.path.isdir(directory) or local) and not os.path.isfile(
        os.path.join(directory, "latest")
    ):
        raise UsageError(
            f"--resume: no checkpoint to resume from in {directory} (no 'latest' file)",
            hint="start without --resume, or use --resume-if-present to resume only when "
            "a checkpoint is there",
        )
    return True


def _spare_hosts(listed, selected, num_gpus: int | None) -> list:
    """Hosts of the hostfile after the selected ones (beyond --num-nodes), in file order, with
    the slots a replacement needs: those that cannot give --num-gpus slots are left out."""
    from dataclasses import replace

    chosen = {h.name for h in selected}
    out = []
    for host in listed:
        if host.name in chosen or not host.slots:
            continue
        if num_gpus is not None:
            if len(host.slots) < num_gpus:
                continue
            host = replace(host, slots=host.slots[:num_gpus])
        out.append(host)
    return out


def _launcher(
    name: str,
    hostfile: str | None,
    slurm_args: str | None,
    mpirun_args: str | None,
    environ: Mapping[str, str],
) -> tuple[str, tuple[str, ...]]:
    """--launcher auto|ssh|slurm|mpi -> the transport and its extra arguments.

    auto is Slurm inside an allocation (SLURM_JOB_ID set) when no hostfile is given, and SSH
    (local subprocesses for local hosts) otherwise.
    """
    import shlex

    from zlaunch.job import LAUNCHERS
    from zlaunch.transport import in_allocation

    name = (name or "auto").strip().lower()
    if name == "auto":
        name = "slurm" if hostfile is None and in_allocation(environ) else "ssh"
    if name not in LAUNCHERS:
        raise UsageError(
            f"--launcher {clip(name)}: expected auto, {', '.join(LAUNCHERS)}",
            hint="auto picks slurm inside an allocation without --hostfile, else ssh",
        )
    if name == "slurm" and not in_allocation(environ):
        raise UsageError(
            "--launcher slurm needs a Slurm allocation: SLURM_JOB_ID is not set",
            hint="run zlaunch inside salloc or an sbatch script (salloc -N 3 zlaunch ...)",
        )
    given = {"slurm": slurm_args, "mpi": mpirun_args}
    for other, text in given.items():
        if text and other != name:
            flag = "--slurm-args" if other == "slurm" else "--mpirun-args"
            raise UsageError(f"{flag} has no effect with --launcher {name}", hint="drop it")
    text = given.get(name) or ""
    flag = "--slurm-args" if name == "slurm" else "--mpirun-args"
    try:
        extra = tuple(shlex.split(text))
    except ValueError as err:
        raise UsageError(f"{flag} {clip(text)}: {err}", hint="quote as in a shell") from None
    shown = redact_argv(extra)
    if shown != list(extra):
        program = "srun" if name == "slurm" else "mpirun"
        raise UsageError(
            f"{flag} holds what looks like a secret ({clip(shlex.join(shown))}): it would be on "
            f"{program}'s command line, which every user of this machine can read",
            hint="give it to the workers with --env NAME=VALUE instead (it reaches the nodes on "
            "the agent's stdin, never on a command line; for a value that is not secret it "
            "works the same)",
        )
    return name, extra


def _slurm_mode(name: str, launcher: str, nodes: int, controller_addr: str | None) -> str:
    """--slurm-mode auto|step-per-node|one-step -> how --launcher slurm starts the agents.

    auto: one srun for all nodes above ONE_STEP_ABOVE_NODES nodes (or with --controller-addr,
    which only one-step uses), one srun step per node up to it."""
    from zlaunch.job import SLURM_MODES
    from zlaunch.transport import ONE_STEP_ABOVE_NODES

    name = (name or "auto").strip().lower()
    if name not in ("auto", *SLURM_MODES):
        raise UsageError(
            f"--slurm-mode {clip(name)}: expected auto, {', '.join(SLURM_MODES)}",
            hint=f"auto: one-step above {ONE_STEP_ABOVE_NODES} nodes, step-per-node up to it",
        )
    if launcher in (Launcher.DIALIN, Launcher.RAY, Launcher.K8S) and name == "auto":
        return "step-per-node"  # --controller-addr is dial-in's too
    if launcher != Launcher.SLURM:
        if name != "auto" or controller_addr:
            flag = "--slurm-mode" if name != "auto" else "--controller-addr"
            raise UsageError(f"{flag} has no effect with --launcher {launcher}", hint="drop it")
        return "step-per-node"
    if name == "auto":
        one_step = nodes > ONE_STEP_ABOVE_NODES or bool(controller_addr)
        return "one-step" if one_step else "step-per-node"
    if name == "step-per-node" and controller_addr:
        raise UsageError(
            "--controller-addr has no effect with --slurm-mode step-per-node",
            hint="agents connect back only with --slurm-mode one-step",
        )
    return name


def _controller_addr(value: str | None) -> str | None:
    """--controller-addr: a host name or address, without a port (the port is chosen free)."""
    if value is None:
        return None
    text = value.strip().strip("[]")
    if not text or any(c.isspace() for c in text) or (text.count(":") == 1):
        raise UsageError(
            f"--controller-addr {clip(value)}: expected a host name or an address of this "
            "machine, without a port",
            hint="e.g. --controller-addr 10.0.0.5 (the port is chosen free per attempt)",
        )
    return text


def _controller_port(value: int | None, launcher: str) -> int:
    """--controller-port: dial-in's alone (one srun step's agents are told a free port)."""
    if value is None:
        return 0
    if launcher not in (Launcher.DIALIN, Launcher.K8S):
        raise UsageError(
            f"--controller-port has no effect with --launcher {launcher}",
            hint="drop it (it is the port dial-in agents connect to)",
        )
    return value


def _ray_address(value: str | None, launcher: str) -> str | None:
    """--ray-address: --launcher ray's alone."""
    if value is not None and launcher != Launcher.RAY:
        raise UsageError(f"--ray-address has no effect with --launcher {launcher}", hint="drop it")
    return value or None


def _token_file(value: str | None, launcher: str) -> str | None:
    """--token-file: dial-in's alone; an absolute path."""
    if value is None:
        return None
    if launcher != Launcher.DIALIN:
        raise UsageError(
            f"--token-file has no effect with --launcher {launcher}",
            hint="drop it (zlaunch hands the token to the agents it starts itself)",
        )
    return os.path.abspath(os.path.expanduser(value))


def _preemption_signal(value: str | None, checkpoint_dir: str | None) -> str | None:
    """--preemption-signal -> the canonical signal name, or None. Unset: SIGTERM when there
    is a checkpoint to save to (a notice then costs no step), else none (SIGTERM to an agent
    stops its ranks, as it always did)."""
    import signal

    if value is None:
        return "SIGTERM" if checkpoint_dir else None
    if value.strip().lower() in ("", "none", "off"):
        return None
    name = value.strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    if name not in signal.Signals.__members__ or name in ("SIGKILL", "SIGSTOP", "SIGCHLD"):
        raise UsageError(
            f"--preemption-signal {clip(value)}: not a signal that can be caught",
            hint="e.g. SIGTERM (what Slurm's --signal and most schedulers send first)",
        )
    return name


def _k8s(args: RunArguments, launcher: str):
    """--image, --namespace, --k8s-*: --launcher k8s's alone, checked as the API server would
    (transport/k8s_manifest.py) before anything is created."""
    from zlaunch.job import K8sOptions
    from zlaunch.transport import k8s_manifest

    given = {
        "--image": args.image, "--namespace": args.namespace, "--k8s-context": args.k8s_context,
        "--k8s-cpu": args.k8s_cpu, "--k8s-memory": args.k8s_memory, "--k8s-gpus": args.k8s_gpus,
        "--k8s-python": args.k8s_python,
    }  # fmt: skip
    if launcher != Launcher.K8S:
        for flag, value in given.items():
            if value is not None:
                raise UsageError(f"{flag} has no effect with --launcher {launcher}", hint="drop it")
        return None
    if not args.image:
        raise UsageError(
            "--launcher k8s needs --image IMAGE: the pods' image, with zlaunch installed",
            hint="e.g. --image registry.example.com/team/train:1.4",
        )
    options = K8sOptions(
        image=args.image,
        namespace=args.namespace or "default",
        context=args.k8s_context,
        cpu=args.k8s_cpu,
        memory=args.k8s_memory,
        gpus=args.k8s_gpus or 0,
        python=args.k8s_python or "python",
    )
    resources = k8s_manifest.PodResources(options.cpu, options.memory, options.gpus)
    k8s_manifest.K8sJob(
        name="zlaunch-00000000", namespace=options.namespace, image=options.image,
        nodes=args.num_nodes or 1, address="controller:1", resources=resources,
        python=options.python,
    ).check()  # fmt: skip
    return options


def _save_on_signal(value: str | None) -> str | None:
    """--save-on SIGUSR1|USR1|none -> the canonical signal name, or None."""
    import signal

    if value is None or value.strip().lower() in ("", "none", "off"):
        return None
    name = value.strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    if name not in signal.Signals.__members__ or name in ("SIGKILL", "SIGSTOP"):
        raise UsageError(
            f"--save-on {clip(value)}: not a signal that can be caught", hint="e.g. SIGUSR1"
        )
    if name in ("SIGINT", "SIGTERM"):
        raise UsageError(
            f"--save-on {value}: zlaunch uses {name} to stop the job", hint="use SIGUSR1 or SIGUSR2"
        )
    return name
