"""`zlaunch check`: preflight every host of a hostfile, in parallel, before a real launch.

For each host: ssh reaches it, the interpreter exists, zlaunch and torch import (and their
versions), the selected slots fit the visible GPUs, the working directory exists, and (on the
master, the first host) the master port is free. One row per host; exit 1 if any host fails.
The probe is a small stdlib script sent through the same transport the launcher uses. With
``--perf`` it also measures each host (check_perf.py) and names the hosts well below the
fleet's median; ``--write-hostfile`` writes the hosts that passed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import click

from zlaunch.commands.check_perf import (
    NET_PROBE,
    PERF_PROBE,
    kept_hosts,
    link_outliers,
    outliers,
    ring_phases,
)
from zlaunch.commands.familiar import host_selection_options, resolve_nodes, ssh_of, ssh_options
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
"""
PROBE_END = r"""
print("ZLAUNCH-PROBE " + json.dumps(r))
"""
PROBE_TIMEOUT = 120.0
PERF_SECONDS = 1.0  # of matrix products per slot
PERF_SIZE = 1024  # n of the n x n float32 matrices
PERF_IO_BYTES = 64 << 20  # written, synced and read back in the checkpoint directory


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


def _probe(
    host, ssh, python: str, cwd: str, port: int | None, perf: dict | None = None
) -> HostReport:
    from zlaunch.transport import open_link

    report = HostReport(host.display, host.slots)
    code = PROBE + (PERF_PROBE if perf is not None else "") + PROBE_END
    try:
        link = open_link(host, [python, "-c", probe_code(code)], ssh)
    except ZlaunchError as err:
        report.problems.append(err.message)
        if err.hint:
            report.hints.append(err.hint)
        return report
    report.reached = True
    try:
        asked = {"cwd": cwd, "port": port}
        if perf is not None:
            asked["perf"] = {**perf, "slots": list(host.slots)}
        link.write(json.dumps(asked).encode())
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
    if "perf_error" in facts:
        report.problems.append(f"performance probe failed: {facts['perf_error']}")
    return report


def check_hosts(
    hosts: Sequence,
    ssh,
    *,
    python: str,
    cwd: str,
    master_port: int | None,
    perf: dict | None = None,
) -> list[HostReport]:
    """Probe every host in parallel; the master port is checked on the first host only;
    ``perf`` (the measurement's parameters, check_perf.PERF_PROBE) measures each host too."""
    from zlaunch.transport import MAX_PARALLEL_CONNECTS

    def one(index: int) -> HostReport:
        port = master_port if index == 0 else None
        return _probe(hosts[index], ssh, python, cwd, port, perf)

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL_CONNECTS, len(hosts)))) as pool:
        return list(pool.map(one, range(len(hosts))))


NET_SECONDS = 0.25  # a link's largest transfer takes at least this long (or is 64 MiB)
NET_PORT_WAIT = 60.0  # for the first host's probe to import torch and serve the rendezvous


class _Reader:
    """One probe's stdout read on a thread, so that a probe that hangs is given up on in time."""

    def __init__(self, link) -> None:
        self.link, self.out, self.port = link, b"", None
        self.port_seen = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            while chunk := self.link.read():
                self.out += chunk
                for line in self.out.decode(errors="replace").splitlines():
                    if line.startswith("ZLAUNCH-NETPORT ") and self.port is None:
                        self.port = int(line.split()[1])
                        self.port_seen.set()
        except OSError:
            pass
        finally:
            self.port_seen.set()
            self.done.set()

    def result(self) -> dict | None:
        for line in self.out.decode(errors="replace").splitlines():
            if line.startswith("ZLAUNCH-NET "):
                return json.loads(line.split(" ", 1)[1])
        return None


def measure_network(hosts: Sequence, ssh, python: str) -> tuple[dict | None, dict[str, str]]:
    """Every link of the ring of ``hosts`` measured both ways (check_perf.NET_PROBE): (the
    backend and the links, by host name; None when it could not be measured), and a problem
    per host whose probe failed. Bounded: PROBE_TIMEOUT in all."""
    from zlaunch.transport import MAX_PARALLEL_CONNECTS, open_link

    names = [h.display for h in hosts]
    addr = "127.0.0.1" if all(h.is_local for h in hosts) else hosts[0].name
    base = {"world": len(hosts), "phases": ring_phases(len(hosts)), "seconds": NET_SECONDS,
            "timeout": PROBE_TIMEOUT / 2, "addr": addr}  # fmt: skip
    argv = [python, "-c", probe_code(NET_PROBE)]
    problems: dict[str, str] = {}
    readers: list[_Reader | None] = [None] * len(hosts)
    deadline = time.monotonic() + PROBE_TIMEOUT

    def start(index: int, port: int | None) -> None:
        try:
            link = open_link(hosts[index], argv, ssh)
        except ZlaunchError as err:
            problems[names[index]] = f"network probe not started: {err.message}"
            return
        slot = hosts[index].slots[0] if hosts[index].slots else 0
        link.write(
            (json.dumps({**base, "rank": index, "port": port, "slot": slot}) + "\n").encode()
        )
        link.close_stdin()
        readers[index] = _Reader(link)

    try:
        start(0, None)
        first = readers[0]
        if first is None or not first.port_seen.wait(NET_PORT_WAIT) or first.port is None:
            if first is not None:
                tail = " | ".join(first.link.stderr_tail()[-3:])
                problems[names[0]] = f"network probe did not start its rendezvous: {tail}"
            return None, problems
        workers = max(1, min(MAX_PARALLEL_CONNECTS, len(hosts) - 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda i: start(i, first.port), range(1, len(hosts))))
        results: dict[int, dict] = {}
        for index, reader in enumerate(readers):
            if reader is None:
                continue
            reader.done.wait(max(0.0, deadline - time.monotonic()))
            found = reader.result()
            if found is None:
                status = reader.link.wait(1.0)
                tail = " | ".join(reader.link.stderr_tail()[-3:])
                problems[names[index]] = (
                    f"network probe failed (exit status {status}): {tail or 'no output'}"
                )
            else:
                results[index] = found
    finally:
        for reader in readers:
            if reader is not None:
                reader.link.terminate(wait=1.0)
    if problems or not results:
        return None, problems
    links = [
        {**link, "src": names[link["src"]], "dst": names[link["dst"]]}
        for found in results.values()
        for link in found.get("links", [])
    ]
    backend = next(iter(results.values())).get("backend")
    return {"backend": backend, "links": links}, problems


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


def _network_words(network: dict) -> str:
    import statistics

    links = network["links"]
    bandwidth = statistics.median(lk["mbs"] for lk in links)
    latency = statistics.median(lk["latency_ms"] for lk in links)
    return (
        f"network ({network['backend']}, a ring of {len(links)} directions): median "
        f"{bandwidth:.4g} MB/s, {latency:.3g} ms"
    )


@click.command(name="check", context_settings={"help_option_names": ["-h", "--help"]})
@host_selection_options("Check")
@click.option(
    "--master-port", type=click.IntRange(1, 65535), help="Check this port is free on the master."
)
@ssh_options
@click.option("--python", help="Interpreter on the nodes. Default: this one.")
@click.option("--chdir", help="Working directory the workers will use. Default: the current one.")
@click.option(
    "--perf",
    is_flag=True,
    help="Also measure every host (a slot's matrix-product rate, the checkpoint directory's "
    "write and read rate, and both ways of every link of a ring of the hosts through gloo, "
    "NCCL on GPUs: bandwidth and latency) and name the hosts and links 1.25x or more below "
    "the median.",
)
@click.option(
    "--checkpoint-dir",
    help="Directory whose filesystem --perf measures (on every host). Default: the working one.",
)
@click.option(
    "--write-hostfile",
    type=click.Path(dir_okay=False),
    help="Write the hosts that passed (no failure, no --perf outlier) to this hostfile.",
)
@click.option("--json", "as_json", is_flag=True, help="Print every host's facts as JSON.")
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
    perf,
    checkpoint_dir,
    write_hostfile,
    as_json,
    no_color,
) -> None:
    """Check that every host is ready to run a job: ssh, python, zlaunch, torch, GPUs, cwd, port."""
    from zlaunch.console import print_table
    from zlaunch.job import default_hosts, load_hostfile, select_hosts

    num_nodes = resolve_nodes(
        num_nodes=num_nodes, nnodes=nnodes, node_rank=node_rank, hostfile=hostfile
    )
    if hostfile is not None:
        listed = load_hostfile(os.path.expanduser(hostfile))
    else:
        listed = default_hosts(num_gpus)
    hosts = select_hosts(listed, include, exclude, num_nodes, num_gpus)
    ssh = ssh_of(ssh_config, ssh_port, identity, ssh_timeout, accept_new_hosts)
    cwd = os.path.abspath(os.path.expanduser(chdir)) if chdir else os.getcwd()
    measure = None
    if perf:
        where = os.path.abspath(os.path.expanduser(checkpoint_dir)) if checkpoint_dir else cwd
        measure = {
            "seconds": PERF_SECONDS,
            "size": PERF_SIZE,
            "io_bytes": PERF_IO_BYTES,
            "dir": where,
        }
    elif checkpoint_dir:
        raise UsageError("--checkpoint-dir is what --perf measures: add --perf")
    reports = check_hosts(
        hosts, ssh, python=python or sys.executable, cwd=cwd, master_port=master_port, perf=measure
    )
    slow = outliers({r.host: r.facts["perf"] for r in reports if "perf" in r.facts})
    for outlier in slow:
        report = next(r for r in reports if r.host == outlier.host)
        report.problems.append(outlier.text)
    network, slow_links = None, []
    ring = [  # the hosts that can take part: reached, and torch imports there
        h
        for h, r in zip(hosts, reports, strict=True)
        if r.reached and r.facts and "torch_error" not in r.facts
    ]
    if perf and len(ring) >= 2:
        network, failed_net = measure_network(ring, ssh, python or sys.executable)
        by_host = {r.host: r for r in reports}
        for host, problem in failed_net.items():
            by_host[host].problems.append(problem)
        if network is not None:
            slow_links = link_outliers(network["links"])
            for outlier in slow_links:
                for host in (outlier.host, outlier.dst):
                    if host is not None:  # a slow link: either end may be the cause
                        by_host[host].problems.append(outlier.text)
    kept = kept_hosts(listed, hosts, {r.host for r in reports if r.ok})
    if write_hostfile:
        with open(write_hostfile, "w") as handle:
            handle.writelines(line + "\n" for line in kept.lines)
    if as_json:
        click.echo(json.dumps({
            "exclude": kept.exclude,
            **({"write_hostfile": {"path": write_hostfile, "include": kept.include}}
               if write_hostfile else {}),
            "hosts": [{"host": r.host, "slots": list(r.slots), "ok": r.ok, "facts": r.facts,
                       "problems": r.problems} for r in reports],
            "outliers": [{"host": o.host, "figure": o.figure, "value": o.value,
                          "median": o.median, "unit": o.unit, "factor": o.factor} for o in slow],
            "network": None if network is None else {
                **network,
                "outliers": [{"host": o.host, "dst": o.dst, "inbound": o.inbound,
                              "figure": o.figure, "values": list(o.values), "median": o.median,
                              "factor": o.factor, "text": o.text} for o in slow_links]},
        }, indent=2))  # fmt: skip
        if any(not r.ok for r in reports):
            raise click.exceptions.Exit(1)
        return
    columns = ["host", "ssh", "python", "zlaunch", "torch", "slots / gpus", "cwd", "port", "status"]
    rows = [_row(r, i == 0, master_port) for i, r in enumerate(reports)]
    if perf:
        columns.insert(-1, "GFLOP/s per slot, write, read MB/s")
        for row, report in zip(rows, reports, strict=True):
            f = report.facts.get("perf") or {}
            figures = [f.get(key) for key in ("gflops", "write_mbs", "read_mbs")]
            shown = " / ".join("-" if v is None else f"{v:.4g}" for v in figures)
            row.insert(-1, shown)
    failed = [r for r in reports if not r.ok]
    print_table(
        f"zlaunch check: {len(reports) - len(failed)} of {len(reports)} hosts ready",
        columns,
        rows,
        color=False if no_color else None,
    )
    if network is not None:
        click.echo(_network_words(network), err=True)
    if failed and kept.exclude:
        click.echo(f"left out: --exclude '{kept.exclude}' runs on the others", err=True)
    if write_hostfile:
        click.echo(f"wrote {write_hostfile}: {len(kept.lines)} host(s)", err=True)
        if kept.include:
            click.echo(
                f"{write_hostfile} lists whole hosts: add --include '{kept.include}' to run "
                "on the slots checked here",
                err=True,
            )
    if failed:
        for hint in dict.fromkeys(h for r in failed for h in r.hints):
            click.echo(f"hint: {hint}", err=True)
        raise click.exceptions.Exit(1)
