"""Real jobs of many ranks over real SSH on this one machine: what the controller does at 64,
256 and 1,024 ranks.

Hosts are loopback addresses (127.0.1.1 ... 127.0.1.H) that all reach one sshd of the harness's
own on a private port (tests/cluster/scale/farm.py: its own host key, known_hosts and
ssh_config, passed with --ssh-config). Each rank runs tests/cluster/scale/worker.py: no torch,
``--lines`` lines of ``--line-bytes`` bytes, flushed one by one. For every size:

- **floor**: the same number of bare worker processes started locally by ``xargs -P N``;
- **zlaunch, ok**: every rank prints its lines and exits 0. Command -> every rank started (the
  worker writes the time just before its first line), command -> exit, the controller's CPU
  seconds and peak RSS (wait4), the agents' peak RSS (VmHWM, sampled), lines/s and MB/s taken
  (all ranks' output over command -> exit), whether every rank log is byte-exact; then
  ``zlaunch status`` and ``zlaunch logs`` (every line of every rank) on that run;
- **zlaunch, failure**: every rank prints its lines and waits; ``zlaunch stacks`` and ``zlaunch
  status`` are timed on the live job; then one rank exits 3: its exit -> every process of the
  job gone (listed in /proc, not taken from zlaunch's word), whether the report names that rank;
- **deepspeed** (``--deepspeed``): DeepSpeed's launcher (pdsh runner over the same ssh config),
  ok job: command -> every rank started, command -> exit, launcher-side CPU (runner, pdsh, ssh
  clients), every rank's lines counted in its output.

Run as root from the repository root, one size at a time on a shared machine::

    python benchmarks/scale_ssh.py --sizes 4x16,16x16 [--sizes 64x16] [--lines 100]
        [--line-bytes 100] [--deepspeed] [--json out.json] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from tests.cluster.scale import farm as farm_mod  # noqa: E402
from tests.cluster.scale import worker as worker_mod  # noqa: E402

WORKER = os.path.abspath(worker_mod.__file__)
RUN_LIMIT = 900.0
KEEP = False  # --keep: leave the run directories for a look


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _read_times(records: str, prefix: str) -> dict[int, float]:
    out = {}
    for name in os.listdir(records):
        if name.startswith(prefix) and not name.endswith(".tmp"):
            with open(os.path.join(records, name)) as f:
                out[int(name[len(prefix) :])] = float(f.read())
    return out


def _count(records: str, prefix: str) -> int:
    return sum(1 for n in os.listdir(records) if n.startswith(prefix) and not n.endswith(".tmp"))


class AgentMemory:
    """Peak RSS of the farm's agents (VmHWM), sampled every second while a job runs."""

    def __init__(self, farm):
        self.farm = farm
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(1.0):
            for pid in self.farm.processes():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"zlaunch.agent" not in f.read():
                            continue
                    with open(f"/proc/{pid}/status") as f:
                        for row in f:
                            if row.startswith("VmHWM:"):
                                self.peak_kib = max(self.peak_kib, int(row.split()[1]))
                except OSError:
                    continue


class Reaped:
    """A child's end as wait4 gives it: exit code, CPU seconds and peak RSS (KiB) of it and
    its reaped descendants. ``poll()`` instead of Popen's (which would reap it first)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.code: int | None = None
        self.cpu = 0.0
        self.rss_kib = 0

    def poll(self) -> int | None:
        if self.code is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.code = self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.cpu, self.rss_kib = usage.ru_utime + usage.ru_stime, usage.ru_maxrss
        return self.code


def _wait4(proc: subprocess.Popen | Reaped, limit: float) -> tuple[int, float, int]:
    """Exit code, CPU seconds and peak RSS (KiB); killed after ``limit`` seconds."""
    reaped = proc if isinstance(proc, Reaped) else Reaped(proc)
    deadline = time.monotonic() + limit
    while reaped.poll() is None:
        if time.monotonic() > deadline:
            reaped.proc.kill()
        time.sleep(0.02)
    return reaped.code, reaped.cpu, reaped.rss_kib


def _timed(argv: list[str], cwd: str, limit: float = 300.0) -> tuple[float, int, int]:
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, timeout=limit)
    took = time.monotonic() - t0
    if done.returncode != 0:
        print(f"{' '.join(argv[2:4])} exited {done.returncode}: {done.stderr.decode()[-600:]}",
              file=sys.stderr)  # fmt: skip
    return took, done.returncode, len(done.stdout)


def floor(work: str, world: int, lines: int, size: int) -> dict:
    records = tempfile.mkdtemp(dir=work, prefix="floor-")
    cmd = (
        f"seq 0 {world - 1} | xargs -P {world} -I{{}} {sys.executable} {WORKER} "
        f"--records {records} --lines {lines} --line-bytes {size} --rank {{}} > /dev/null"
    )
    t0 = time.time()
    subprocess.run(["bash", "-c", cmd], check=True, timeout=RUN_LIMIT)
    took = time.time() - t0
    starts = _read_times(records, "start-")
    assert len(starts) == world, f"floor: {len(starts)} of {world} ranks started"
    return {"all_started_s": max(starts.values()) - t0, "exit_s": took}


def zlaunch_argv(farm, hostfile: str, runs: str, worker_args: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "zlaunch", "--hostfile", hostfile, "--ssh-config",
        farm.ssh_config, "--log-dir", runs, "--grace-period", "3", WORKER, *worker_args,
    ]  # fmt: skip


def _run_dir(runs: str) -> str:
    (name,) = [
        n
        for n in os.listdir(runs)
        if not os.path.islink(os.path.join(runs, n))
        and os.path.exists(os.path.join(runs, n, "run.json"))
    ]
    return os.path.join(runs, name)


def check_logs(run_dir: str, world: int, lines: int, size: int) -> dict:
    """Every rank log against the bytes its worker printed."""
    found = {}
    attempt = os.path.join(run_dir, "attempt-0")
    for host in os.listdir(attempt) if os.path.isdir(attempt) else ():
        for name in os.listdir(os.path.join(attempt, host)):
            match = re.fullmatch(r"rank-(\d+)\.log", name)
            if match:
                found[int(match.group(1))] = os.path.join(attempt, host, name)
    exact, wrong, lost_lines = 0, [], 0
    for rank in range(world):
        want = worker_mod.expected_log(rank, lines, size)
        path = found.get(rank)
        got = open(path, "rb").read() if path else b""
        if got == want:
            exact += 1
        else:
            wrong.append(rank)
            lost_lines += lines - sum(
                1 for x in got.splitlines(True) if x in set(want.splitlines(True))
            )
    return {"logs_exact": exact, "logs_wrong": wrong[:20], "lines_lost_or_changed": lost_lines}


def zlaunch_ok(farm, hosts: int, slots: int, work: str, lines: int, size: int) -> dict:
    world = hosts * slots
    hostfile = farm.hostfile(slots, f"hosts-{hosts}x{slots}", hosts)
    records = tempfile.mkdtemp(dir=work, prefix="ok-")
    runs = os.path.join(work, f"runs-ok-{hosts}x{slots}")
    argv = zlaunch_argv(
        farm, hostfile, runs, ["--records", records, "--lines", str(lines),
                               "--line-bytes", str(size), "--tag", uuid.uuid4().hex]
    )  # fmt: skip
    out_path = os.path.join(work, f"ok-{hosts}x{slots}.console")
    with (
        open(out_path, "wb") as out,
        open(out_path + ".err", "wb") as err,
        AgentMemory(farm) as mem,
    ):
        t0 = time.time()
        proc = subprocess.Popen(argv, cwd=work, env=_env(), stdout=out, stderr=err)
        code, cpu, rss = _wait4(proc, RUN_LIMIT)
        took = time.time() - t0
    starts = _read_times(records, "start-")
    run_dir = _run_dir(runs)
    result = {
        "exit_code": code,
        "ranks_started": len(starts),
        "all_started_s": max(starts.values()) - t0 if starts else None,
        "exit_s": took,
        "controller_cpu_s": cpu,
        "controller_peak_rss_mib": rss / 1024,
        "agent_peak_rss_mib": mem.peak_kib / 1024,
        "lines_per_s": world * lines / took,
        "mb_per_s": world * lines * size / took / 1e6,
        "console_lines": sum(1 for _ in open(out_path, "rb")),
        **check_logs(run_dir, world, lines, size),
    }
    with open(out_path + ".err", errors="replace") as f:
        result["stderr_tail"] = f.read()[-3000:]
    run_id = os.path.basename(run_dir)
    result["status_s"], _, _ = _timed([sys.executable, "-m", "zlaunch", "status", run_id,
                                       "--log-dir", runs], work)  # fmt: skip
    result["logs_s"], _, result["logs_bytes"] = _timed(
        [sys.executable, "-m", "zlaunch", "logs", run_id, "--log-dir", runs], work
    )
    if not KEEP:
        shutil.rmtree(runs, ignore_errors=True)
    return result


def _all_armed(run_dir: str, world: int) -> bool:
    try:
        with open(os.path.join(run_dir, "ranks.json")) as f:
            rows = json.load(f)["ranks"]
    except (OSError, ValueError, KeyError):
        return False
    return sum(1 for r in rows if r.get("state") == "running" and r.get("stacks")) == world


def zlaunch_failure(farm, hosts: int, slots: int, work: str, lines: int, size: int) -> dict:
    world = hosts * slots
    fail_rank = world - slots // 2 - 1  # mid-host on the last host: neither 0 nor slots
    hostfile = farm.hostfile(slots, f"hosts-{hosts}x{slots}", hosts)
    records = tempfile.mkdtemp(dir=work, prefix="fail-")
    runs = os.path.join(work, f"runs-fail-{hosts}x{slots}")
    argv = zlaunch_argv(
        farm, hostfile, runs, ["--records", records, "--lines", str(lines), "--line-bytes",
                               str(size), "--hold", "--fail-rank", str(fail_rank)]
    )  # fmt: skip
    out_path = os.path.join(work, f"fail-{hosts}x{slots}.console")
    result: dict = {"fail_rank": fail_rank}
    with open(out_path, "wb") as out, open(out_path + ".err", "wb") as err:
        t0 = time.time()
        proc = Reaped(subprocess.Popen(argv, cwd=work, env=_env(), stdout=out, stderr=err))
        deadline = time.monotonic() + RUN_LIMIT
        while _count(records, "ready-") < world:
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        result["all_ready_s"] = time.time() - t0
        result["ranks_ready"] = _count(records, "ready-")
        if proc.poll() is None:
            run_dir = _run_dir(runs)
            run_id = os.path.basename(run_dir)
            # The workers are ready before the controller has taken all their output: stacks
            # are asked of a job in its steady state, once ranks.json shows every rank armed.
            while proc.poll() is None and not _all_armed(run_dir, world):
                time.sleep(0.2)
            result["controller_caught_up_s"] = time.time() - t0
            result["stacks_s"], result["stacks_rc"], result["stacks_bytes"] = _timed(
                [sys.executable, "-m", "zlaunch", "stacks", run_id, "--log-dir", runs], work
            )
            result["status_live_s"], _, _ = _timed(
                [sys.executable, "-m", "zlaunch", "status", run_id, "--log-dir", runs], work
            )
            open(os.path.join(records, "go"), "w").close()
            while not os.path.exists(os.path.join(records, f"fail-{fail_rank}")):
                time.sleep(0.01)
            failed_at = _read_times(records, "fail-")[fail_rank]
            left = farm.processes()
            while left and time.time() - failed_at < 120:
                time.sleep(0.05)
                left = farm.processes()
            result["failure_to_all_gone_s"] = time.time() - failed_at
            result["left_after_120s"] = len(left)
        code, cpu, rss = _wait4(proc, 120)
        result["failure_to_controller_exit_s"] = (
            time.time() - failed_at if "failure_to_all_gone_s" in result else None
        )
    with open(out_path + ".err", errors="replace") as f:
        err_text = f.read()
    result.update(exit_code=code, controller_cpu_s=cpu, controller_peak_rss_mib=rss / 1024)
    named = re.findall(r"rank (\d+)", err_text)
    result["report_names_fail_rank"] = f"rank {fail_rank}" in err_text
    result["first_rank_named"] = int(named[0]) if named else None
    result["report_lines"] = err_text.count("\n")
    failure_json = os.path.join(_run_dir(runs), "failure.json")
    if os.path.exists(failure_json):
        with open(failure_json) as f:
            result["failure_json_rank"] = json.load(f).get("root_cause", {}).get("rank")
    result["stderr_tail"] = err_text[-1500:]
    farm.kill_sessions()
    if not KEEP:
        shutil.rmtree(runs, ignore_errors=True)
    return result


def deepspeed_ok(farm, hosts: int, slots: int, work: str, lines: int, size: int) -> dict:
    world = hosts * slots
    hostfile = farm.hostfile(slots, f"hosts-{hosts}x{slots}", hosts)
    bindir = os.path.join(work, "bin")
    os.makedirs(bindir, exist_ok=True)
    wrapper = os.path.join(bindir, "ssh")  # pdsh calls plain ssh: this one reads the farm's config
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {farm.ssh_config} "$@"\n')
    os.chmod(wrapper, 0o755)
    with open(os.path.join(work, ".deepspeed_env"), "w") as f:
        f.write("DS_ACCELERATOR=cpu\n")
    records = tempfile.mkdtemp(dir=work, prefix="ds-")
    argv = [
        sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", hostfile,
        "--launcher", "pdsh", "--master_addr", farm.hosts[0], "--master_port", "29555",
        WORKER, "--records", records, "--lines", str(lines), "--line-bytes", str(size),
    ]  # fmt: skip
    env = dict(_env(), DS_ACCELERATOR="cpu", PATH=f"{bindir}:{os.environ['PATH']}")
    out_path = os.path.join(work, f"ds-{hosts}x{slots}.out")
    with open(out_path, "wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        code, cpu, rss = _wait4(proc, RUN_LIMIT)
        took = time.time() - t0
    starts = _read_times(records, "start-")
    counts: dict[int, int] = {}
    with open(out_path, "rb") as f:
        for row in f:
            match = re.search(rb"rank (\d+) line \d{6} ", row)
            if match:
                counts[int(match.group(1))] = counts.get(int(match.group(1)), 0) + 1
    farm.kill_sessions()
    return {
        "exit_code": code,
        "ranks_started": len(starts),
        "all_started_s": max(starts.values()) - t0 if starts else None,
        "exit_s": took,
        "launcher_cpu_s": cpu,
        "launcher_peak_rss_mib": rss / 1024,
        "ranks_with_every_line": sum(1 for r in range(world) if counts.get(r) == lines),
    }


def _fmt(value, digits=2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(results: dict) -> str:
    rows = []
    for size, r in results["sizes"].items():
        ok, fail, fl, ds = (
            r.get("zlaunch_ok", {}),
            r.get("zlaunch_failure", {}),
            r.get("floor", {}),
            r.get("deepspeed"),
        )
        rows.append(
            f"| {size} ({r['world']}) | {_fmt(fl.get('all_started_s'))} / {_fmt(fl.get('exit_s'))}"
            f" | {_fmt(ok.get('all_started_s'))} / {_fmt(ok.get('exit_s'))}"
            f" | {_fmt(ds.get('all_started_s')) if ds else '-'} / {_fmt(ds.get('exit_s')) if ds else '-'}"
            f" | {_fmt(ok.get('controller_cpu_s'), 1)} s, {_fmt(ok.get('controller_peak_rss_mib'), 0)} MiB"
            f" | {_fmt(ok.get('agent_peak_rss_mib'), 0)} MiB"
            f" | {_fmt(ok.get('lines_per_s'), 0)} / {_fmt(ok.get('mb_per_s'), 2)}"
            f" | {ok.get('logs_exact')}/{r['world']}"
            f" | {_fmt(fail.get('failure_to_all_gone_s'))} ({fail.get('left_after_120s')} left)"
            f" | {'yes' if fail.get('report_names_fail_rank') else 'no'}"
            f" | {_fmt(fail.get('stacks_s'))} | {_fmt(ok.get('status_s'))} / {_fmt(ok.get('logs_s'))} |"
        )
    head = (
        "| hosts x slots (ranks) | floor: started / exit (s) | zlaunch: started / exit (s) "
        "| DeepSpeed: started / exit (s) | controller CPU, peak RSS | agent peak RSS "
        "| lines/s / MB/s | logs byte-exact | failure -> all gone (s) | report names the rank "
        "| stacks (s) | status / logs (s) |\n|" + "---|" * 12
    )
    return head + "\n" + "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4x16,16x16", help="HOSTSxSLOTS,... (64x16 = 1,024)")
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument("--line-bytes", type=int, default=100)
    parser.add_argument("--deepspeed", action="store_true", help="also DeepSpeed's pdsh launcher")
    parser.add_argument("--skip", default="", help="comma list of floor,ok,failure to skip")
    parser.add_argument("--keep", help="keep the consoles, records and run dirs in this folder")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    reason = farm_mod.unavailable_reason()
    if reason:
        sys.exit(reason)
    # A SIGTERM unwinds like an exception: the farm's sshd and its sessions are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.deepspeed and not shutil.which("pdsh"):
        sys.exit("pdsh is missing: apt-get install -y pdsh (or leave out --deepspeed)")
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    skip = set(args.skip.split(","))
    results = {
        "lines": args.lines, "line_bytes": args.line_bytes, "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M"), "sizes": {},
    }  # fmt: skip
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        global KEEP
        KEEP = True
    scratch = (
        contextlib.nullcontext(tempfile.mkdtemp(prefix="zl-scale-", dir=args.keep))
        if args.keep
        else tempfile.TemporaryDirectory(prefix="zl-scale-")
    )
    with scratch as work, farm_mod.LoopbackFarm.start(max(h for h, _ in sizes)) as farm:
        for hosts, slots in sizes:
            key, world = f"{hosts}x{slots}", hosts * slots
            row = results["sizes"][key] = {"world": world, "load_before": os.getloadavg()[0]}
            size = (args.lines, args.line_bytes)
            steps = {
                "floor": functools.partial(floor, work, world, *size),
                "zlaunch_ok": functools.partial(zlaunch_ok, farm, hosts, slots, work, *size),
                "zlaunch_failure": functools.partial(
                    zlaunch_failure, farm, hosts, slots, work, *size
                ),
            }
            if args.deepspeed:
                steps["deepspeed"] = functools.partial(
                    deepspeed_ok, farm, hosts, slots, work, *size
                )
            for name, step in steps.items():
                if name.split("_")[-1] in skip or name in skip:
                    continue
                print(f"[{key}] {name} ...", file=sys.stderr, flush=True)
                row[name] = step()
                print(f"[{key}] {name}: {json.dumps({k: v for k, v in row[name].items() if k != 'stderr_tail'})}",
                      file=sys.stderr, flush=True)  # fmt: skip
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(results, f, indent=2)
                time.sleep(2)  # let the machine settle between runs
    table = markdown(results)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
