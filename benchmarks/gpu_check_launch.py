"""The device check's launch items: a zlaunch job of one rank on NCCL answering `zlaunch stacks`
with its flight-recorder records, and two ranks on the one GPU where a backend allows it (see
gpu_check.py). The job is `gpu_check_job.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpu_check_items import Ctx, item

__all__: list[str] = []

JOB = Path(__file__).with_name("gpu_check_job.py")


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def _tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@item("zlaunch_nccl")
def zlaunch_nccl(ctx: Ctx) -> dict:
    runs, ready, stop = ctx.work / "runs", ctx.work / "ready.json", ctx.work / "stop"
    console = ctx.work / "console.txt"
    cmd = [sys.executable, "-m", "zlaunch", "--num-gpus", "1", "--log-dir", str(runs),
           str(JOB), "--ready", str(ready), "--stop", str(stop)]  # fmt: skip
    began = time.monotonic()
    with open(console, "wb") as out:
        job = subprocess.Popen(cmd, cwd=str(ctx.work), stdout=out, stderr=subprocess.STDOUT)
    try:
        if not _wait_for(ready, job, 90):
            return {"status": "fail", "figure": "the rank never got ready",
                    "reason": _tail(console)}  # fmt: skip
        info = json.loads(ready.read_text())
        started = time.monotonic() - began
        asked = time.monotonic()
        stacks = subprocess.run(
            [sys.executable, "-m", "zlaunch", "stacks", "--log-dir", str(runs), "--json"],
            capture_output=True, text=True, timeout=60, cwd=str(ctx.work),
        )  # fmt: skip
        answered = time.monotonic() - asked
        ctx.progress.add(stacks_rc=stacks.returncode, stacks_s=answered, info=info)
        hang = {}
        try:
            hang = json.loads(stacks.stdout)["root_cause"].get("hang") or {}
        except (ValueError, KeyError, TypeError):
            pass
        groups = hang.get("stack_groups") or []
        records = [r for g in hang.get("collective_groups") or [] for r in g["records"]]
        stack_ok = stacks.returncode == 0 and any(0 in g["ranks"] for g in groups)
        frames = [f for g in groups for t in g["threads"] for f in t["frames"]]
        in_job = any("gpu_check_job.py" in f for f in frames)
    finally:
        stop.touch()
        try:
            code = job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            code = job.wait()
    want_backend = "nccl" if ctx.cuda else "gloo"
    ops = sorted({str(r.get("op")) for r in records})
    ok = stack_ok and in_job and records and code == 0 and info.get("backend") == want_backend
    figure = (
        f"1 rank, {info.get('backend')} on {info.get('device')} (CUDA_VISIBLE_DEVICES="
        f"{info.get('CUDA_VISIBLE_DEVICES')}, LOCAL_RANK {info.get('LOCAL_RANK')}); ready in "
        f"{started:.0f} s; zlaunch stacks answered in {answered:.1f} s with rank 0's stack"
        f"{' in the job' if in_job else ' (NOT in the job)'} and {len(records)} flight-recorder "
        f"record(s) ({', '.join(ops) or 'none'}); the job exited {code}"
    )
    details = {"info": info, "stacks_stderr": stacks.stderr[-2000:], "records": records[-8:]}
    if not ok:
        details["console"] = _tail(console, 30)
    return {"status": "ok" if ok else "fail", "figure": figure, "details": details}


TWO_RANKS = r"""
import datetime, os, sys, torch, torch.distributed as dist
backend = sys.argv[1]
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
kw = {"device_id": torch.device("cuda", 0)} if backend == "nccl" else {}
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=30), **kw)
out = {}
for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
    try:
        x = torch.full((8,), float(rank + 1), device="cuda")
        if name == "all_reduce":
            dist.all_reduce(x); ok = x[0].item() == 3.0
        elif name == "all_gather_into_tensor":
            y = torch.empty(16, device="cuda"); dist.all_gather_into_tensor(y, x)
            ok = y[0].item() == 1.0 and y[8].item() == 2.0
        elif name == "reduce_scatter_tensor":
            y = torch.empty(4, device="cuda"); dist.reduce_scatter_tensor(y, x); ok = y[0].item() == 3.0
        else:
            y = torch.empty(8, device="cuda"); dist.all_to_all_single(y, x)
            ok = y[0].item() == 1.0 and y[4].item() == 2.0
        out[name] = "ok" if ok else "wrong values"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
print("RESULT", __import__("json").dumps(out), flush=True)
dist.destroy_process_group()
"""


def _two_ranks(ctx: Ctx, backend: str) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", TWO_RANKS, backend], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))  # fmt: skip
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=40)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outputs.append(p.communicate()[0] + "\n(timed out)")
    for text in outputs:
        for line in text.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
    last = [ln for ln in outputs[0].splitlines() if ln.strip()]
    return {"init": (last[-1] if last else "no output")[:240]}


@item("two_ranks")
def two_ranks(ctx: Ctx) -> dict:
    if not ctx.cuda:
        return {"status": "skipped", "figure": "skipped: no CUDA", "reason": "no CUDA"}
    results = {backend: _two_ranks(ctx, backend) for backend in ("nccl", "gloo")}
    ctx.progress.add(**results)
    parts = []
    for backend, ops in results.items():
        fine = [k for k, v in ops.items() if v == "ok"]
        if fine and len(fine) == len(ops):
            parts.append(f"{backend}: all 4 collectives ok on one GPU")
        else:
            parts.append(f"{backend}: " + "; ".join(f"{k} {v}" for k, v in ops.items()))
    nccl_ok = all(v == "ok" for v in results["nccl"].values())
    figure = " | ".join(parts) + (
        ""
        if nccl_ok
        else " | the runtime uses NCCL whenever CUDA is there: its multi-rank "
        "paths stay unproven here"
    )
    return {"status": "ok" if nccl_ok else "skipped", "figure": figure,
            "reason": "" if nccl_ok else "NCCL does not run two ranks on one GPU",
            "details": results}  # fmt: skip
