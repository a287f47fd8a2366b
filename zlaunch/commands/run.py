"""`zlaunch [OPTIONS] SCRIPT [SCRIPT_ARGS]...`: launch SCRIPT on every selected slot.

The click command: its options, the salloc request of --nodes from a login node, and
`--dry-run`. The values become a validated `LaunchOptions` in zlaunch.commands.run_options
before any host is contacted; the launch itself is `zlaunch.launcher.launch`, imported only
then.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from zlaunch.commands.allocation_args import hand_over, shown
from zlaunch.commands.familiar import host_selection_options, ssh_options
from zlaunch.commands.run_options import (
    build_options,
    find_config_in_args,
    parse_ranks,
    validate_config,
)
from zlaunch.errors import UsageError
from zlaunch.job import Launcher, SlurmMode
from zlaunch.text import brief, clip
from zlaunch.wire import protocol
from zlaunch.worker import module_argv

if TYPE_CHECKING:
    from zlaunch.job import LaunchOptions

__all__ = ["command", "build_options", "find_config_in_args", "validate_config", "parse_ranks"]


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


ALLOCATED_ENV = protocol.SALLOC_ENV
"""Set in the job's environment when zlaunch itself asked salloc for the allocation."""


def _allocation_request(values: dict, environ: Mapping[str, str]) -> list[str] | None:
    """--nodes/--partition/--time/--account: the salloc command to re-run zlaunch in, or None.

    Removes those four from ``values``. Inside the allocation zlaunch asked for they are
    ignored; inside one the user made they are an error (the allocation exists already).
    """
    from zlaunch.transport import in_allocation

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
    # zlaunch again inside the allocation, in this directory: not from a zlaunch/ found in it.
    # salloc's command line shows its arguments redacted (every user sees it, and Slurm's job
    # record), its environment carries them whole.
    return [*argv, *module_argv(sys.executable, "zlaunch", *shown(sys.argv[1:]), flags=())]


def _warn_of_visible_secrets(options: LaunchOptions) -> None:
    """A program started as is (``--no-python``) reads its arguments from its command line, so
    those that look secret cannot be kept off it (a Python worker's are: zlaunch/worker/argv.py):
    said once, with the way out."""
    if not options.no_python:
        return
    import shlex

    from zlaunch.text import redact_argv

    shown = redact_argv(options.program)
    if shown != list(options.program):
        click.echo(
            f"warning: the workers' command line ({clip(shlex.join(shown))}) holds what looks "
            "secret, and --no-python starts the program as is, so it stays there, where every "
            "user of the nodes can read it; pass it in the environment instead (--env "
            "NAME=VALUE reaches the nodes on the agent's stdin)",
            err=True,
        )


def _node_count(value: str | None) -> int | None:
    """--nodes N: a count of nodes (for salloc, or the agents to wait for). A range MIN:MAX is
    refused: from a login node it would read as an allocation of a range of nodes, while the
    job's range of hosts is spelled --nnodes MIN:MAX."""
    if value is None:
        return None
    text = value.strip()
    if ":" in text:
        simple = re.fullmatch(r"\d{1,6}:\d{1,6}", text) is not None
        low, _, high = text.partition(":") if simple else ("MIN", "", "MAX")
        text = text if simple else "MIN:MAX"
        raise UsageError(
            f"--nodes {clip(value)}: --nodes is a count of nodes (asked of Slurm with salloc "
            "from a login node, or the agents to wait for), not a range",
            hint=f"a job that may run on {low} to {high} hosts is --nnodes {text} (or "
            f"--min-nodes {low} --max-nodes {high}) with --hostfile",
        )
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or int(text) < 1:
        raise UsageError(f"--nodes must be a number of nodes (1 or more), got {clip(value)}")
    return int(text)


def _dialin_nodes(values: dict) -> None:
    """--launcher dialin --nodes N: the agents to wait for (--num-nodes), not an allocation."""
    if (values.get("launcher") or "").strip().lower() not in ("dialin", "ray", "k8s"):
        return
    nodes = values.pop("nodes", None)
    if nodes is None:
        return
    if values.get("num_nodes") not in (None, nodes):
        raise UsageError(
            f"--nodes {nodes} and --num-nodes {values['num_nodes']} disagree",
            hint="give one of them: how many agents dial in",
        )
    values["num_nodes"] = nodes


def _agent_commands(options: LaunchOptions, limit: int = 4) -> str:
    """--dry-run: the srun or mpirun command line that starts each node's agent."""
    import shlex

    from zlaunch.transport import agent_argv

    if options.launcher == Launcher.SSH:
        return ""
    if options.launcher == Launcher.RAY:
        return (
            f"agents start as Ray actors, one per node of a STRICT_SPREAD placement group of "
            f"{len(options.hosts)} bundles on {options.ray_address or 'RAY_ADDRESS or a local Ray'}"
            ", each dialing in to this machine\n"
        )
    if options.launcher == Launcher.K8S and options.k8s is not None:
        return (
            f"agents start as the {len(options.hosts)} pods of an Indexed Job in namespace "
            f"{options.k8s.namespace} (image {options.k8s.image}), each dialing in with the "
            "token of a Secret mounted as a file (zlaunch k8s manifest prints such objects)\n"
        )
    if options.launcher == Launcher.DIALIN:
        where = options.controller_addr or "ADDR"
        port = options.controller_port or "PORT"
        return (
            f"agents dial in (started by you or your scheduler, one per node, "
            f"{len(options.hosts)} awaited), each with a private copy of {options.token_file}:\n"
            f"  zlaunch agent --connect {where}:{port} --token-file FILE\n"
        )
    argv = agent_argv(options.python)
    if options.launcher == Launcher.SLURM and options.slurm_mode == SlurmMode.ONE_STEP:
        from zlaunch.transport import job_id, one_step_argv

        address = f"{options.controller_addr or 'ADDR'}:PORT"
        command = one_step_argv(
            [h.name for h in options.hosts], job_id(os.environ), argv, address,
            "zlaunch-agents-XXXXXXXX", options.launcher_args,
        )  # fmt: skip
        return (
            f"agents start with (slurm, one step for all {len(options.hosts)} nodes, each agent "
            f"connecting back to this machine with the job's token from its environment):\n  "
            f"{shlex.join(command)}\n"
        )
    lines = [f"agents start with ({options.launcher}, one per node):"]
    for host in options.hosts[:limit]:
        if options.launcher == Launcher.SLURM:
            from zlaunch.transport import job_id, srun_argv

            command = srun_argv(host.name, job_id(os.environ), argv, options.launcher_args)
        else:
            from zlaunch.transport import mpirun_argv

            command = mpirun_argv(host.name, argv, options.launcher_args)
        lines.append("  " + shlex.join(command))
    if len(options.hosts) > limit:
        lines.append(f"  ... and {len(options.hosts) - limit} more nodes")
    return "\n".join(lines) + "\n"


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
    metavar="auto|ssh|slurm|mpi|dialin|ray|k8s",
    help="How agents start: auto = slurm inside an allocation without --hostfile, else ssh; "
    "dialin = started by someone else, they dial in (--nodes, --token-file); ray = as actors "
    "on a Ray cluster (--ray-address, --num-nodes); k8s = as the pods of a Kubernetes Indexed "
    "Job, dialing in (--nodes, --image).",
)
@click.option(
    "--ray-address",
    help="--launcher ray: the Ray cluster (HOST:PORT of its head, or auto). Default: "
    "RAY_ADDRESS, else a local Ray.",
)
@click.option("--slurm-args", help="Extra srun arguments for each agent's step (one string).")
@click.option(
    "--slurm-mode",
    default="auto",
    show_default=True,
    metavar="auto|step-per-node|one-step",
    help="--launcher slurm: one srun step per node, or one srun for all nodes whose agents "
    "connect back over TCP; auto = one-step above 8 nodes.",
)
@click.option(
    "--controller-addr",
    help="--slurm-mode one-step, --launcher dialin: this machine's address the agents connect "
    "to (default: the one that routes to the nodes).",
)
@click.option(
    "--controller-port",
    type=click.IntRange(0, 65535),
    help="--launcher dialin: the port the agents dial in to. Default: a free one, said at start.",
)
@click.option(
    "--token-file",
    help="--launcher dialin: the job's token, in a private file the agents get a copy of "
    "(written if it does not exist).",
)
@click.option("--image", help="--launcher k8s: the pods' image (zlaunch installed in it).")
@click.option(
    "--namespace", help="--launcher k8s: the namespace of the job's objects. Default: default."
)
@click.option(
    "--k8s-context", help="--launcher k8s: the kubeconfig context. Default: its current one."
)
@click.option("--k8s-cpu", help="--launcher k8s: CPUs per pod, as Kubernetes writes it (8, 500m).")
@click.option(
    "--k8s-memory", help="--launcher k8s: memory per pod, as Kubernetes writes it (64Gi)."
)
@click.option(
    "--k8s-gpus", type=click.IntRange(0), help="--launcher k8s: GPUs (nvidia.com/gpu) per pod."
)
@click.option(
    "--k8s-python", help="--launcher k8s: the image's interpreter that runs the agent (python)."
)
@click.option(
    "--nodes",
    metavar="N",
    help="From a login node: ask Slurm (salloc) for N nodes and run the job in them. "
    "--launcher dialin: how many agents to wait for; --launcher k8s: how many pods.",
)
@click.option("--partition", help="With --nodes: the Slurm partition.")
@click.option("--time", "time_limit", help="With --nodes: the allocation's time limit.")
@click.option("--account", help="With --nodes: the Slurm account to charge.")
@click.option("--mpirun-args", help="Extra mpirun arguments for each agent (one string).")
@ssh_options
@click.option("--python", help="Interpreter on the nodes. Default: this one.")
@click.option("--chdir", help="Working directory of the workers. Default: the current one.")
@click.option(
    "--env",
    multiple=True,
    metavar="KEY[=VALUE]",
    help="Set a worker variable; KEY alone passes this environment's value (kept off the "
    "command line, which every user can see). Repeatable.",
)
@click.option("-m", "--module", is_flag=True, help="SCRIPT is a module, run as python -m.")
@click.option("--no-python", "--no_python", "no_python", is_flag=True, help="Run SCRIPT as is.")
@click.option(
    "--log-dir",
    help="Root of run directories. Default: $ZLAUNCH_LOG_DIR, else ./zlaunch_runs. Every run "
    "is also indexed per user, so `zlaunch ls/logs/status/stop` find it from any directory.",
)
@click.option("--ranks", help="Show only these ranks on the console, e.g. 0,3-5.")
@click.option("--no-color", is_flag=True, help="Plain console output.")
@click.option(
    "--collapse/--no-collapse",
    default=None,
    help="Show a line that many ranks print alike once: rank 0's at once, the others' as one "
    "[ranks 1-15] TEXT line (the rank logs keep every line). Default: on when the console "
    "shows more than 8 ranks.",
)
@click.option(
    "--grace-period",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when ranks are stopped.",
)
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
    help="Peak TFLOP/s of one device, for MFU (implies --mfu). Default: known GPUs' table; "
    "CPU: a probe.",
)
@click.option(
    "--mfu",
    is_flag=True,
    default=False,
    help="Count one step's FLOPs (step 1, torch's formulas) and report TFLOP/s and MFU in the "
    "step metrics. The counted step runs every op through a counter (a few percent slower, "
    "eager under compile); the flops_profiler config block counts too.",
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
    "--max-nodes",
    type=click.IntRange(1),
    default=None,
    metavar="N",
    help="With --min-nodes: the job grows back up to N hosts. Hosts lost earlier, hosts listed "
    "beyond those it started on, and hosts added to --hostfile while it runs are probed over "
    "SSH (backing off); when one answers, every rank saves at its next step and the job "
    "restarts on the larger set from that checkpoint, global batch kept. --nnodes MIN:MAX "
    "says both. Needs --checkpoint-dir. See docs/fleet-changes.md.",
)
@click.option(
    "--grow-interval",
    type=float,
    default=None,
    metavar="SECONDS",
    help="With --max-nodes: an attempt runs at least this long before the job grows (each "
    "grow costs a save and a restart). Default: 60.",
)
@click.option(
    "--preemption-signal",
    default=None,
    metavar="SIGNAL|none",
    help="This signal to a host's agent (Slurm's --signal sends it there) is that host's "
    "preemption notice: every rank saves at its next step, then the job goes on without the "
    "host (with --min-nodes) or ends. Default: SIGTERM with --checkpoint-dir, else none (the "
    "signal stops that host's ranks).",
)
@click.option(
    "--preemption-deadline",
    type=float,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="From a preemption notice to the host's going: the save must be complete by then, "
    "or it is discarded (the previous checkpoint stays the latest) and every rank stopped.",
)
@click.option(
    "--preemption-check",
    default=None,
    metavar="CMD",
    help="A shell command every agent runs on its host every --preemption-check-interval "
    "seconds; exit status 0 is that host's preemption notice (poll a cloud's metadata here).",
)
@click.option(
    "--preemption-check-interval",
    type=float,
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How often --preemption-check runs (a run that takes longer is killed: no notice).",
)
@click.option(
    "--slow-node",
    type=click.Choice(["warn", "exclude"]),
    default="warn",
    show_default=True,
    help="A host whose ranks' own step time stays at 1.25x the fleet's median or more for 3 "
    "windows of 10 steps is named (warn); with exclude (needs --checkpoint-dir and "
    "--min-nodes) every rank also saves at its next step and the job goes on without it, "
    "global batch kept, never below --min-nodes. See docs/slow-nodes.md.",
)
@click.option(
    "--collective-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="torch.distributed collective timeout of the workers. Default: DEEPSPEED_TIMEOUT "
    "(minutes) if set, else 1800.",
)
@click.option(
    "--runtime",
    type=click.Choice(["auto", "bundled", "deepspeed"]),
    default="auto",
    show_default=True,
    help="Which runtime serves `import deepspeed` in the workers (Hugging Face Trainer, "
    "accelerate, TRL): 'deepspeed' the installed DeepSpeed, 'bundled' this project's runtime, "
    "'auto' the installed DeepSpeed if the job's Python has one, else the bundled runtime.",
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
    values["nodes"] = _node_count(values.get("nodes"))
    _dialin_nodes(values)
    salloc = _allocation_request(values, os.environ)
    if salloc is not None:
        import shlex

        if values["dry_run"]:
            shown = shlex.join(a for a in salloc if a != "--dry-run")
            click.echo(f"would ask Slurm for the allocation, then run inside it:\n  {shown}")
            return
        # salloc holds the allocation for as long as zlaunch runs in it, in this terminal.
        env = {**os.environ, ALLOCATED_ENV: "1"}
        hand_over(sys.argv[1:], env)
        try:
            os.execvpe(salloc[0], salloc, env)
        except OSError as err:
            raise UsageError(
                f"cannot run salloc: {err.strerror or err}",
                hint="load Slurm's client tools (module load slurm), or give --hostfile",
            ) from None
    _reject_option_as_script(values["script"])
    options = build_options(**values)
    _warn_of_visible_secrets(options)
    if options.dry_run:
        from zlaunch.job import AUTO_PORT, build_plan, new_run_id, render_plan

        plan = build_plan(
            options,
            options.hosts,
            master_addr=options.master_addr or options.hosts[0].name,
            master_port=options.master_port or AUTO_PORT,
            run_id=new_run_id(),
            attempt=0,
            # the thread default as a local launch would set it (other hosts say theirs at start)
            usable_cpus=[
                len(os.sched_getaffinity(0)) if h.is_local else None for h in options.hosts
            ],
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
