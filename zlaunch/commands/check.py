"""`zlaunch check`: preflight every host of a hostfile, in parallel, before a real launch.

For each host: ssh reaches it, the interpreter exists, zlaunch and torch import (and their
versions), the selected slots fit the visible GPUs, the working directory exists, and (on the
master, the first host) the master port is free. One row per host; exit 1 if any host fails.
The probe is a small stdlib script sent through the same transport the launcher uses.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import click

from zlaunch.commands.familiar import host_selection_options, resolve_nodes
from zlaunch.errors import UsageError, ZlaunchError
from zlaunch.worker import probe_code

__all__ = ["command", "HostReport", "check_hosts"]

# Runs on the node with the interpreter under test; reads its parameters as JSON on stdin.
PROBE = r"""
import json, os, shutil, socket, subprocess, sys
p = json.loads(sys.stdin.read() or "{}")
r = {"python": sys.executable, "python_version": sys.version.split()[0]}
try:
    import zlaunch
    r["zlaunch"] = zlaunch.__version__
except Exception as e:
    r["zlaunch_error"] = f"{type(e).__name__}: {e}"
try:
    import torch
    r["torch"] = torch.__version__
    r["gpus"] = torch.cuda.device_count()
except Exception as e:
    r["torch_error"] = f"{type(e).__name__}: {e}"
if r.get("gpus") is None and shutil.which("nvidia-smi"):
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        r["gpus"] = sum(1 for l in out.stdout.splitlines() if l.startswith("GPU "))
    except Exception:
        pass
r["cwd_exists"] = os.path.isdir(p.get("cwd") or "/")
if p.get("port"):
    s = socket.socket()
    try:
        s.bind(("", p["port"]))
        r["port_free"] = True
    except OSError as e:
        r["port_free"] = False
        r["port_error"] = e.strerror
    finally:
        s.close()
print("ZLAUNCH-PROBE " + json.dumps(r))
"""
PROBE_TIMEOUT = 120.0


@dataclass
class HostReport:
    """What the probe found on one host; ``problems`` empty means the host is ready."""

    host: str
    slots: tuple[int, ...]
    reached: bool = False
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    """How to fix the problems, where the error said (printed once each, under the table)."""

    @property
    def ok(self) -> bool:
        return self.reached and not self.problems


def _probe(host, ssh, python: str, cwd: str, port: int | None) -> HostReport:
    from zlaunch.transport import open_link

    report = HostReport(host.display, host.slots)
    try:
        link = open_link(host, [python, "-c", probe_code(PROBE)], ssh)
    except ZlaunchError as err:
        report.problems.append(err.message)
        if err.hint:
            report.hints.append(err.hint)
        return report
    report.reached = True
    try:
        link.write(json.dumps({"cwd": cwd, "port": port}).encode())
        link.close_stdin()
        out = b""
        while chunk := link.read():
            out += chunk
        status = link.wait(PROBE_TIMEOUT)
    finally:
        link.terminate(wait=1.0)
    found = [
        line
        for line in out.decode(errors="replace").splitlines()
        if line.startswith("ZLAUNCH-PROBE ")
    ]
    if not found:
        tail = " | ".join(link.stderr_tail()[-3:])
        if status == 127:
            report.problems.append(f"interpreter {python} not found")
        else:
            report.problems.append(f"probe failed (exit status {status}): {tail}")
        return report
    facts = json.loads(found[-1].split(" ", 1)[1])
    report.facts = facts
    if "zlaunch_error" in facts:
        report.problems.append(f"zlaunch not importable: {facts['zlaunch_error']}")
    if "torch_error" in facts:
        report.problems.append(f"torch not importable: {facts['torch_error']}")
    gpus = facts.get("gpus")
    if gpus and max(host.slots) >= gpus:
        report.problems.append(
            f"slots {','.join(map(str, host.slots))} but only {gpus} GPUs visible"
        )
    if not facts.get("cwd_exists"):
        report.problems.append(f"working directory {cwd} does not exist")
    if facts.get("port_free") is False:
        report.problems.append(f"master port {port} is in use ({facts.get('port_error')})")
    return report


def check_hosts(
    hosts: Sequence, ssh, *, python: str, cwd: str, master_port: int | None
) -> list[HostReport]:
    """Probe every host in parallel; the master port is checked on the first host only."""
    from zlaunch.transport import MAX_PARALLEL_CONNECTS

    def one(index: int) -> HostReport:
        return _probe(hosts[index], ssh, python, cwd, master_port if index == 0 else None)

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL_CONNECTS, len(hosts)))) as pool:
        return list(pool.map(one, range(len(hosts))))


def _row(report: HostReport, master: bool, port: int | None) -> list[str]:
    facts = report.facts
    gpus = facts.get("gpus")
    return [
        report.host + (" (master)" if master else ""),
        "ok" if report.reached else "FAILED",
        f"{facts['python_version']}" if facts else "-",
        facts.get("zlaunch", "missing" if facts else "-"),
        facts.get("torch", "missing" if facts else "-"),
        f"{len(report.slots)} / {gpus if gpus is not None else '?'}",
        ("ok" if facts.get("cwd_exists") else "missing") if facts else "-",
        ("free" if facts.get("port_free") else "in use")
        if master and port and "port_free" in facts
        else "-",
        "ok" if report.ok else "; ".join(report.problems),
    ]


@click.command(name="check", context_settings={"help_option_names": ["-h", "--help"]})
@host_selection_options("Check")
@click.option(
    "--master-port", type=click.IntRange(1, 65535), help="Check this port is free on the master."
)
@click.option("--ssh-config", help="ssh config file (ssh -F).")
@click.option(
    "--ssh-port",
    type=click.IntRange(1, 65535),
    help="ssh port of hosts whose hostfile line has no port=. Default: the ssh config's, else 22.",
)
@click.option("-I", "--identity", help="ssh private key file.")
@click.option(
    "--ssh-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds to wait for each host's ssh connection.",
)
@click.option(
    "--accept-new-hosts",
    is_flag=True,
    help="Trust hosts missing from known_hosts and record their keys (ssh's accept-new).",
)
@click.option("--python", help="Interpreter on the nodes. Default: this one.")
@click.option("--chdir", help="Working directory the workers will use. Default: the current one.")
@click.option("--no-color", is_flag=True, help="Plain table.")
def command(
    hostfile,
    include,
    exclude,
    num_nodes,
    nnodes,
    node_rank,
    num_gpus,
    master_port,
    ssh_config,
    ssh_port,
    identity,
    ssh_timeout,
    accept_new_hosts,
    python,
    chdir,
    no_color,
) -> None:
    """Check that every host is ready to run a job: ssh, python, zlaunch, torch, GPUs, cwd, port."""
    from zlaunch.console import print_table
    from zlaunch.job import SshOptions, default_hosts, load_hostfile, select_hosts

    num_nodes = resolve_nodes(
        num_nodes=num_nodes, nnodes=nnodes, node_rank=node_rank, hostfile=hostfile
    )
    if hostfile is not None:
        hosts = load_hostfile(os.path.expanduser(hostfile))
    else:
        hosts = default_hosts(num_gpus)
    hosts = select_hosts(hosts, include, exclude, num_nodes, num_gpus)
    for path, flag in ((ssh_config, "--ssh-config"), (identity, "--identity")):
        if path is not None and not os.path.isfile(os.path.expanduser(path)):
            raise UsageError(f"{flag} {path}: no such file")
    ssh = SshOptions(
        config_file=os.path.expanduser(ssh_config) if ssh_config else None,
        port=ssh_port,
        identity=os.path.expanduser(identity) if identity else None,
        timeout=ssh_timeout,
        accept_new_hosts=accept_new_hosts,
    )
    cwd = os.path.abspath(os.path.expanduser(chdir)) if chdir else os.getcwd()
    reports = check_hosts(
        hosts, ssh, python=python or sys.executable, cwd=cwd, master_port=master_port
    )
    columns = ["host", "ssh", "python", "zlaunch", "torch", "slots / gpus", "cwd", "port", "status"]
    rows = [_row(r, i == 0, master_port) for i, r in enumerate(reports)]
    failed = [r for r in reports if not r.ok]
    print_table(
        f"zlaunch check: {len(reports) - len(failed)} of {len(reports)} hosts ready",
        columns,
        rows,
        color=False if no_color else None,
    )
    if failed:
        for hint in dict.fromkeys(h for r in failed for h in r.hints):
            click.echo(f"hint: {hint}", err=True)
        raise click.exceptions.Exit(1)
