"""The job before anything starts, pure: the hostfile (`hostfile`), include/exclude
selectors (`selectors`) and env files (`envfile`) → `LaunchOptions` (`options`) → every node's
ranks and worker environment (`plan`, with the ranks' thread default: `threads`, and the
runtime that serves ``import deepspeed``: `deepspeed_api`) → the spec each agent is sent
(`spec`)."""

from __future__ import annotations

from zlaunch.job.deepspeed_api import bundled_path, choose, find_installed
from zlaunch.job.envfile import collect_env
from zlaunch.job.hostfile import MAX_SLOTS, Host, default_hosts, load_hostfile
from zlaunch.job.options import (
    DEFAULT_GROW_INTERVAL,
    DEFAULT_HANG_TIMEOUT,
    DEFAULT_LOG_DIR,
    LAUNCHERS,
    SLURM_MODES,
    K8sOptions,
    Launcher,
    LaunchOptions,
    SlurmMode,
    SshOptions,
)
from zlaunch.job.plan import (
    AUTO_PORT,
    RESERVED_ENV,
    Plan,
    build_plan,
    dropped_pythonpath_entries,
    new_run_id,
    render_plan,
)
from zlaunch.job.selectors import select_hosts
from zlaunch.job.spec import encode_spec, node_spec
from zlaunch.job.threads import THREADS_ENV, threads_words

__all__ = [
    "AUTO_PORT",
    "DEFAULT_GROW_INTERVAL",
    "DEFAULT_HANG_TIMEOUT",
    "DEFAULT_LOG_DIR",
    "Host",
    "LAUNCHERS",
    "Launcher",
    "LaunchOptions",
    "MAX_SLOTS",
    "Plan",
    "RESERVED_ENV",
    "SLURM_MODES",
    "SlurmMode",
    "SshOptions",
    "K8sOptions",
    "THREADS_ENV",
    "build_plan",
    "bundled_path",
    "choose",
    "collect_env",
    "default_hosts",
    "dropped_pythonpath_entries",
    "encode_spec",
    "find_installed",
    "load_hostfile",
    "new_run_id",
    "node_spec",
    "render_plan",
    "select_hosts",
    "threads_words",
]
