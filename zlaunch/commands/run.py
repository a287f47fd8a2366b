"""`zlaunch [OPTIONS] SCRIPT [SCRIPT_ARGS]...`: launch SCRIPT on every selected slot.

The edge of the launcher: argv is parsed here into a `LaunchOptions`, and every check that can
fail without touching a host happens here, before any ssh (hostfile, selectors, env files,
the training config, the script path). `--dry-run` prints the plan and stops; otherwise the
options go to `zlaunch.launcher.launch`, imported only then.
"""

from __future__ import annotations

import difflib
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import click

from zlaunch import protocol
from zlaunch.clip import brief, clip
from zlaunch.commands.familiar import (
    host_selection_options,
    refuse_config_as_script,
    resolve_nodes,
)
from zlaunch.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from zlaunch.options import LaunchOptions

__all__ = ["command", "build_options", "find_config_in_args", "validate_config", "parse_ranks"]

# Spellings of a config path among the script's own args (DeepSpeed scripts use the last two).
SCRIPT_CONFIG_FLAGS = ("--config", "--deepspeed_config", "--deepspeed-config")


def find_config_in_args(args: Sequence[str]) -> str | None:
    """The config path the script's args name with --config / --deepspeed_config, if any.

    Accepts `--config P` and `--config=P`; the last occurrence wins (as with argparse); a bare
    `--` ends the options, as it does for the script.
    """
    found = None
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            break
        flag, eq, value = arg.partition("=")
        if flag in SCRIPT_CONFIG_FLAGS:
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
        from runtime.config import ConfigError as RuntimeConfigError
        from runtime.config import load_config
    except ImportError as err:
        raise ConfigError(
            f"cannot validate {path}: runtime.config is unavailable ({err})"
        ) from None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            load_config(path).resolve(world_size)
        except RuntimeConfigError as err:
            message = str(err)
            name = os.path.basename(path)
            if path not in message and name not in message:
                message = f"{path}: {message}"
            raise ConfigError(message) from None
        except OSError as err:
            raise ConfigError(f"cannot read config {path}: {err.strerror or err}") from None
    for warning in caught:
        click.echo(f"warning: {warning.message}", err=True)


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


def _existing_file(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path}: no such file")
    return path


def _reject_option_as_script(script: str) -> None:
    """With unknown options passed through, a misspelled option arrives as SCRIPT."""
    if not script.startswith("-") or script == "-":
        return
    flag = script.partition("=")[0]
    known = [name for param in command.params for name in getattr(param, "opts", [])]
    near = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    raise UsageError(
        f"no such option: {brief(flag)}",
        hint=f"did you mean {near[0]}?" if near else "see zlaunch run --help",
    )


def build_options(
    *,
    script: str,
    script_args: Sequence[str],
    hostfile: str | None = None,
    include: str | None = None,
    exclude: str | None = None,
    num_nodes: int | None = None,
    nnodes: str | None = None,
    node_rank: str | None = None,
    num_gpus: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    ssh_config: str | None = None,
    ssh_port: int | None = None,
    identity: str | None = None,
    ssh_timeout: float = 10.0,
    accept_new_hosts: bool = False,
    python: str | None = None,
    chdir: str | None = None,
    env: Sequence[str] = (),
    module: bool = False,
    no_python: bool = False,
    log_dir: str | None = None,
    ranks: str | None = None,
    no_color: bool = False,
    grace_period: float = 5.0,
    dry_run: bool = False,
    config: str | None = None,
    pass_local_rank: bool = False,
    checkpoint_dir: str | None = None,
    resume: bool = False,
    resume_if_present: bool = False,
    max_restarts: int = 0,
    save_on: str | None = "SIGUSR1",
    peak_tflops: float | None = None,
    hang_timeout: float | None = None,
    collective_timeout: float | None = None,
    min_nodes: int | None = None,
    launcher: str = "auto",
    slurm_args: str | None = None,
    mpirun_args: str | None = None,
    environ: Mapping[str, str] | None = None,
    home: str | None = None,
) -> LaunchOptions:
    """Turn parsed command-line values into a validated `LaunchOptions` (no host contacted)."""
    from zlaunch.envfile import collect_env
    from zlaunch.hostfile import default_hosts, load_hostfile
    from zlaunch.options import DEFAULT_HANG_TIMEOUT, LaunchOptions, SshOptions
    from zlaunch.plan import RESERVED_ENV
    from zlaunch.run_index import default_log_dir
    from zlaunch.selectors import select_hosts

    environ = os.environ if environ is None else environ
    if home is None:
        home = os.path.expanduser("~")
    _reject_option_as_script(script)
    num_nodes = resolve_nodes(
        num_nodes=num_nodes, nnodes=nnodes, node_rank=node_rank, hostfile=hostfile
    )
    if module and no_python:
        raise UsageError("--module and --no-python cannot be used together")
    if no_python and python is not None:
        raise UsageError("--python has no effect with --no-python", hint="drop one of them")
    if python is not None and (not python or python.startswith("-")):
        raise UsageError(
            f"--python {clip(python)}: expected an interpreter, e.g. --python /usr/bin/python3",
            hint="--python takes the interpreter's path; its options cannot be passed there",
        )

    cwd = os.path.abspath(os.path.expanduser(chdir)) if chdir else os.getcwd()
    if not os.path.isdir(cwd):
        raise UsageError(f"--chdir {cwd}: no such directory")
    if not module and not no_python:
        refuse_config_as_script(script)
        script_path = script if os.path.isabs(script) else os.path.join(cwd, script)
        if not os.path.isfile(script_path):
            where = "" if os.path.isabs(script) else f" (looked in {cwd})"
            raise UsageError(
                f"script {script} not found{where}",
                hint="check the path, or use -m for a module and --no-python for a program",
            )

    launcher, launcher_args = _launcher(launcher, hostfile, slurm_args, mpirun_args, environ)
    if hostfile is not None:
        hosts = load_hostfile(os.path.expanduser(hostfile))
    elif launcher != "ssh":
        from zlaunch.transport.slurm import allocation_hosts, in_allocation

        if not in_allocation(environ):
            raise UsageError(
                f"--launcher {launcher} needs --hostfile, or a Slurm allocation to take the "
                "nodes from (SLURM_JOB_ID is not set)",
                hint="run zlaunch inside salloc or an sbatch script, or give --hostfile",
            )
        hosts = allocation_hosts(environ, num_gpus)
    else:
        hosts = default_hosts(num_gpus, environ)
    listed = hosts
    hosts = select_hosts(hosts, include, exclude, num_nodes, num_gpus)
    spares = _spare_hosts(listed, hosts, num_gpus) if min_nodes is not None else []
    world_size = sum(len(host.slots) for host in hosts)

    # The config: zlaunch's own --config is relative to where zlaunch runs; one found in the
    # script's args is relative to the script's working directory, as the script will read it.
    config_path = os.path.abspath(os.path.expanduser(config)) if config else None
    in_args = find_config_in_args(script_args)
    if in_args is not None:
        in_args = os.path.normpath(os.path.join(cwd, os.path.expanduser(in_args)))
        if config_path is not None and os.path.realpath(config_path) != os.path.realpath(in_args):
            raise UsageError(
                f"--config {config_path} differs from the script's config {in_args}",
                hint="give the config once",
            )
        config_path = config_path or in_args
    if config_path is not None:
        validate_config(config_path, world_size)

    worker_env = collect_env(environ, cwd=os.getcwd(), home=home, env_options=env)
    for item in env:
        name = item.partition("=")[0]
        if name in RESERVED_ENV:
            raise UsageError(
                f"--env {name}: zlaunch sets {name} for every worker",
                hint="leave it out; see `zlaunch run --help` for how ranks are assigned",
            )
    if peak_tflops is not None:
        from zlaunch.protocol import PEAK_TFLOPS_ENV

        if not 0 < peak_tflops < float("inf"):
            raise UsageError(f"--peak-tflops must be a positive number, got {peak_tflops}")
        worker_env[PEAK_TFLOPS_ENV] = repr(float(peak_tflops))

    if module:
        program = ("-m", script, *script_args)
    else:
        program = (script, *script_args)
    return LaunchOptions(
        hosts=tuple(hosts),
        program=program,
        python=python or sys.executable,
        no_python=no_python,
        module=module,
        config_path=config_path,
        cwd=cwd,
        env=worker_env,
        master_addr=master_addr,
        master_port=master_port,
        launcher=launcher,
        launcher_args=launcher_args,
        ssh=SshOptions(
            config_file=_existing_file(ssh_config, "--ssh-config"),
            port=ssh_port,
            identity=_existing_file(identity, "--identity"),
            timeout=ssh_timeout,
            accept_new_hosts=accept_new_hosts,
        ),
        log_dir=os.path.abspath(os.path.expanduser(log_dir))
        if log_dir
        else default_log_dir(environ),
        ranks_filter=parse_ranks(ranks, world_size) if ranks else None,
        color=False if no_color else None,
        grace_period=grace_period,
        dry_run=dry_run,
        pass_local_rank=pass_local_rank,
        checkpoint_dir=os.path.abspath(os.path.expanduser(checkpoint_dir))
        if checkpoint_dir
        else None,
        resume=_resume(resume, resume_if_present, checkpoint_dir, hosts),
        max_restarts=max_restarts,
        save_on=_save_on_signal(save_on),
        hang_timeout=DEFAULT_HANG_TIMEOUT if hang_timeout is None else hang_timeout,
        min_nodes=min_nodes,
        spare_hosts=tuple(spares),
        collective_timeout=collective_timeout,
    )


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

    from zlaunch.options import LAUNCHERS
    from zlaunch.transport.slurm import in_allocation

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
    try:
        extra = tuple(shlex.split(text))
    except ValueError as err:
        flag = "--slurm-args" if name == "slurm" else "--mpirun-args"
        raise UsageError(f"{flag} {clip(text)}: {err}", hint="quote as in a shell") from None
    return name, extra


ALLOCATED_ENV = protocol.SALLOC_ENV
"""Set in the job's environment when zlaunch itself asked salloc for the allocation."""


def _allocation_request(values: dict, environ: Mapping[str, str]) -> list[str] | None:
    """--nodes/--partition/--time/--account: the salloc command to re-run zlaunch in, or None.

    Removes those four from ``values``. Inside the allocation zlaunch asked for they are
    ignored; inside one the user made they are an error (the allocation exists already).
    """
    from zlaunch.transport.slurm import in_allocation

    asked = {
        "--nodes": values.pop("nodes", None),
        "--partition": values.pop("partition", None),
        "--time": values.pop("time_limit", None),
        "--account": values.pop("account", None),
    }
    given = [flag for flag, value in asked.items() if value is not None]
    if not given:
        return None
    if in_allocation(environ):
        if environ.get(ALLOCATED_ENV):
            return None
        raise UsageError(
            f"{given[0]} asks Slurm for an allocation, but zlaunch runs inside one already "
            f"(job {environ.get('SLURM_JOB_ID') or environ.get('SLURM_JOBID')})",
            hint=f"leave out {', '.join(given)}: the job runs on this allocation's nodes",
        )
    if asked["--nodes"] is None:
        raise UsageError(
            f"{given[0]} needs --nodes N (how many nodes to ask Slurm for)",
            hint="e.g. zlaunch --nodes 2 --partition gpu train.py",
        )
    launcher = (values.get("launcher") or "auto").strip().lower()
    if launcher not in ("auto", "slurm", "mpi"):
        raise UsageError(
            f"--nodes asks Slurm for the nodes; --launcher {clip(launcher)} cannot use them",
            hint="leave --launcher out (or use slurm or mpi)",
        )
    if values.get("hostfile"):
        raise UsageError("--nodes and --hostfile both name the hosts", hint="give one of them")
    argv = ["salloc", f"--nodes={asked['--nodes']}"]
    for flag in ("--partition", "--time", "--account"):
        if asked[flag] is not None:
            argv.append(f"{flag}={asked[flag]}")
    if values.get("num_gpus"):
        argv.append(f"--ntasks-per-node={values['num_gpus']}")
    return [*argv, sys.executable, "-m", "zlaunch", *sys.argv[1:]]


def _agent_commands(options: LaunchOptions, limit: int = 4) -> str:
    """--dry-run: the srun or mpirun command line that starts each node's agent."""
    import shlex

    from zlaunch.transport import agent_argv

    if options.launcher == "ssh":
        return ""
    argv = agent_argv(options.python)
    lines = [f"agents start with ({options.launcher}, one per node):"]
    for host in options.hosts[:limit]:
        if options.launcher == "slurm":
            from zlaunch.transport.slurm import job_id, srun_argv

            command = srun_argv(host.name, job_id(os.environ), argv, options.launcher_args)
        else:
            from zlaunch.transport.mpi import mpirun_argv

            command = mpirun_argv(host.name, argv, options.launcher_args)
        lines.append("  " + shlex.join(command))
    if len(options.hosts) > limit:
        lines.append(f"  ... and {len(options.hosts) - limit} more nodes")
    return "\n".join(lines) + "\n"


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


@click.command(
    name="run",
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
    },
)
@host_selection_options("Use")
@click.option("--master-addr", "--master_addr", "master_addr", help="Rendezvous address.")
@click.option(
    "--master-port",
    "--master_port",
    "master_port",
    type=click.IntRange(1, 65535),
    help="Rendezvous port. Default: a free port on the master host.",
)
@click.option(
    "--launcher",
    default="auto",
    show_default=True,
    metavar="auto|ssh|slurm|mpi",
    help="How agents start: auto = slurm inside an allocation without --hostfile, else ssh.",
)
@click.option("--slurm-args", help="Extra srun arguments for each agent's step (one string).")
@click.option(
    "--nodes",
    type=click.IntRange(1),
    help="From a login node: ask Slurm (salloc) for N nodes and run the job in them.",
)
@click.option("--partition", help="With --nodes: the Slurm partition.")
@click.option("--time", "time_limit", help="With --nodes: the allocation's time limit.")
@click.option("--account", help="With --nodes: the Slurm account to charge.")
@click.option("--mpirun-args", help="Extra mpirun arguments for each agent (one string).")
@click.option("--ssh-config", help="ssh config file (ssh -F).")
@click.option("--ssh-port", "--ssh_port", "ssh_port", type=click.IntRange(1, 65535))
@click.option("-I", "--identity", help="ssh private key file.")
@click.option("--ssh-timeout", type=float, default=10.0, show_default=True, help="Seconds.")
@click.option(
    "--accept-new-hosts",
    is_flag=True,
    help="Trust hosts missing from known_hosts and record their keys (ssh's accept-new).",
)
@click.option("--python", help="Interpreter on the nodes. Default: this one.")
@click.option("--chdir", help="Working directory of the workers. Default: the current one.")
@click.option("--env", multiple=True, metavar="KEY[=VALUE]", help="Set a worker variable.")
@click.option("-m", "--module", is_flag=True, help="SCRIPT is a module, run as python -m.")
@click.option("--no-python", "--no_python", "no_python", is_flag=True, help="Run SCRIPT as is.")
@click.option(
    "--log-dir",
    help="Root of run directories. Default: $ZLAUNCH_LOG_DIR, else ./zlaunch_runs. Every run "
    "is also indexed per user, so `zlaunch ls/logs/status/stop` find it from any directory.",
)
@click.option("--ranks", help="Show only these ranks on the console, e.g. 0,3-5.")
@click.option("--no-color", is_flag=True, help="Plain console output.")
@click.option("--grace-period", type=float, default=5.0, show_default=True, help="SIGTERM->KILL.")
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--config", help="Training config (JSON/YAML), validated before launch.")
@click.option(
    "--pass-local-rank",
    is_flag=True,
    help="Append --local_rank=N to each worker's args (as DeepSpeed does).",
)
@click.option(
    "--checkpoint-dir",
    help="Checkpoint directory for the workers (ZLAUNCH_CHECKPOINT_DIR); also resumes restarts.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Load the latest checkpoint in --checkpoint-dir; none there is an error (exit 2).",
)
@click.option(
    "--resume-if-present",
    is_flag=True,
    help="Load the latest checkpoint in --checkpoint-dir if there is one, else start fresh.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Restart every rank after a failure, up to N times for the whole job.",
)
@click.option(
    "--save-on",
    default="SIGUSR1",
    show_default=True,
    metavar="SIGNAL|none",
    help="This signal to zlaunch makes every rank save a checkpoint and exit 0.",
)
@click.option(
    "--peak-tflops",
    type=float,
    default=None,
    metavar="TFLOPS",
    help="Peak TFLOP/s of one device, for MFU. Default: known GPUs' table; CPU: a probe.",
)
@click.option(
    "--hang-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Declare the job hung when no rank reaches a step boundary for this long: every "
    "rank's stacks go to failure.json, the job stops (and restarts if --max-restarts allows). "
    "0 disables. Default: 900.",
)
@click.option(
    "--min-nodes",
    type=click.IntRange(1),
    default=None,
    metavar="M",
    help="With --max-restarts: drop a host whose agent is lost and restart on the others "
    "(plus hosts listed beyond --num-nodes) while M remain; the global batch is kept.",
)
@click.option(
    "--collective-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="torch.distributed collective timeout of the workers. Default: DEEPSPEED_TIMEOUT "
    "(minutes) if set, else 1800.",
)
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def command(**values) -> None:
    """Launch SCRIPT with SCRIPT_ARGS on every selected slot of every host.

    \b
    zlaunch --hostfile hosts train.py --config ds.json
    zlaunch --num-gpus 4 train.py                 (4 workers on localhost)
    zlaunch -H hosts --include node1:0-3 train.py
    zlaunch --nodes 3 --partition gpu train.py    (salloc, then one srun step per node)
    """
    salloc = _allocation_request(values, os.environ)
    if salloc is not None:
        import shlex

        if values["dry_run"]:
            shown = shlex.join(a for a in salloc if a != "--dry-run")
            click.echo(f"would ask Slurm for the allocation, then run inside it:\n  {shown}")
            return
        # salloc holds the allocation for as long as zlaunch runs in it, in this terminal.
        env = {**os.environ, ALLOCATED_ENV: "1"}
        try:
            os.execvpe(salloc[0], salloc, env)
        except OSError as err:
            raise UsageError(
                f"cannot run salloc: {err.strerror or err}",
                hint="load Slurm's client tools (module load slurm), or give --hostfile",
            ) from None
    options = build_options(**values)
    if options.dry_run:
        from zlaunch.plan import AUTO_PORT, build_plan, new_run_id, render_plan

        plan = build_plan(
            options,
            options.hosts,
            master_addr=options.master_addr or options.hosts[0].name,
            master_port=options.master_port or AUTO_PORT,
            run_id=new_run_id(),
            attempt=0,
        )
        click.echo(render_plan(plan), nl=False)
        click.echo(_agent_commands(options), nl=False)
        return
    from zlaunch.launcher import launch

    code = launch(options)
    if code:
        # Not click's Exit: with standalone_mode=False click turns that into a return value,
        # which cli.main does not pass on. SystemExit carries the code straight out.
        sys.exit(code)
