"""The device check: one command that proves the CUDA paths on a GPU machine in minutes.

    python benchmarks/gpu_check.py [--out DIR] [--budget 450] [--dry] [--only ID,...]

It installs the project from this working tree against the torch already installed (offline:
``pip install --no-index --no-deps --no-build-isolation``, into a folder of its own that goes
first on the path, with the wheels in ``benchmarks/gpu_check_wheels/`` for what the machine
lacks), then runs every item of `ITEMS` in a process of its own with the installed copy (a
crash or a hang costs one item, not the check), within one time budget, and prints one line
per item with its figure. Everything it writes goes under ``--out`` (default
``gpu_check_out/``): ``gpu_check.json`` (every figure and detail) and ``gpu_check.md`` (the
table). Exit status 0 when no item failed or broke, 1 otherwise.

Without CUDA (or with ``--dry``) every item that needs a GPU is reported as "skipped: no
CUDA": the install step, the item runner and the output are the same, which is what CI runs
(``tests/integration/test_gpu_check.py``). ``--cpu-items ID,...`` runs the named items on the
CPU where they can (a developer's self-test of the item code; not a result).

docs/gpu-check.md says what each item measures and what only a GPU can confirm.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ITEMS", "Item", "main"]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WHEELS = HERE / "gpu_check_wheels"
RUNNER = HERE / "gpu_check_items.py"
PROJECT_FILES = ("zlaunch", "runtime", "setup.cfg", "pyproject.toml", "README.md")


@dataclass(frozen=True)
class Item:
    id: str
    title: str
    cuda: bool
    """Needs a GPU (skipped without one)."""
    cap_s: float
    """Longest this item may run."""


# In the order the check's brief lists them; `gpu_check_items.REGISTRY` implements each id.
ITEMS: tuple[Item, ...] = (
    Item("torch_api", "torch version and the APIs the project uses", False, 90),
    Item("stages", "engine stages 0-3 at world 1, fp32/bf16/fp16, vs torch AdamW", True, 150),
    Item(
        "fp16_scaling", "fp16 dynamic loss scale: skips and growth by DeepSpeed's rules", True, 90
    ),
    Item(
        "seed_stage2",
        "examples zero2_fp16.json: fp16 + pinned CPU optimizer offload, GPT",
        True,
        120,
    ),
    Item(
        "seed_stage3", 'examples zero3_offload.json: both offloads, "auto" values, GPT', True, 120
    ),
    Item("memory", "CUDA memory of model states vs the 16 psi/N ledger", True, 120),
    Item("activation_ckpt", "activation checkpointing (partitioned, CPU): memory saved", True, 90),
    Item("compile", "torch.compile at stages 0-3 (+ CUDA graphs at stage 0)", True, 200),
    Item("step_time", "step time and MFU vs plain torch (the comm-free bound)", True, 120),
    Item("zlaunch_nccl", "zlaunch: 1 rank on NCCL, flight recorder, zlaunch stacks", True, 150),
    Item("two_ranks", "two ranks sharing the one GPU", True, 90),
)
MIN_ITEM_S = 15.0
"""What an item needs at least; a later item keeps this much of the budget."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------- install
def requirement_blocks() -> list[tuple[str, str, str]]:
    """(distribution, version, text) of each requirement in the wheels folder's
    requirements.txt: a ``name==version \\`` line and its ``--hash`` lines."""
    blocks: list[list[str]] = []
    for line in (WHEELS / "requirements.txt").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith(" "):
            blocks[-1].append(line)
        else:
            blocks.append([line])
    out = []
    for block in blocks:
        name, version = block[0].split()[0].split("==", 1)
        out.append((name, version, "\n".join(block) + "\n"))
    return out


def _installed(python: str, names: list[str]) -> dict[str, str | None]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)


def install(site: Path, *, all_wheels: bool) -> dict:
    """Install the project (a copy of this tree's package files) and the carried wheels the
    interpreter lacks (all of them with ``all_wheels``: CI proves they install) into
    ``site``, offline, against the torch already installed."""
    began = time.monotonic()
    python = sys.executable
    wanted = requirement_blocks()
    have = _installed(python, [n for n, _, _ in wanted] + ["torch"])
    missing = [(n, v, text) for n, v, text in wanted if all_wheels or have.get(n) is None]
    build = Path(tempfile.mkdtemp(prefix="gpu-check-build-"))
    try:
        for name in PROJECT_FILES:
            src = REPO / name
            if src.is_dir():
                shutil.copytree(src, build / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, build / name)
        if _has_pip(python):
            method = "pip"
            _pip_install(python, site, build, missing)
        else:  # an image without pip: a wheel is a zip laid out for site-packages
            method = "unpacked (no pip here)"
            _unpack_install(site, build, missing)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return {
        "seconds": round(time.monotonic() - began, 1),
        "torch": have.get("torch"),
        "method": method,
        "wheels_installed": [f"{n}=={v}" for n, v, _ in missing],
        "already_there": {n: have[n] for n, _, _ in wanted if have.get(n) and not all_wheels},
        "site": str(site),
    }


def _has_pip(python: str) -> bool:
    done = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, timeout=60)
    return done.returncode == 0


def _pip_install(python: str, site: Path, build: Path, missing: list) -> None:
    reqs = build / "wheels.txt"
    reqs.write_text("".join(text for _, _, text in missing))
    base = [
        python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
        "--disable-pip-version-check", "--no-warn-script-location", "--target", str(site),
    ]  # fmt: skip
    steps = []
    if missing:
        steps.append(base + ["--find-links", str(WHEELS), "--require-hashes", "-r", str(reqs)])
    steps.append(base + [str(build)])
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-2000:]
            raise RuntimeError(f"pip install {cmd[-1]} failed:\n{tail}")


def _wheel_fits(name: str) -> bool:
    """The wheel's tags fit this interpreter (pure, abi3 from its floor, or this CPython)."""
    py, abi, plat = name[:-4].split("-")[-3:]
    if plat != "any" and "x86_64" not in plat:
        return False
    if abi == "none":
        return py.startswith("py3") or "py3" in py.split(".")
    here = sys.version_info[:2]
    if abi == "abi3":
        return (3, int(py[3:])) <= here
    return py == f"cp{here[0]}{here[1]}"


def _unpack_install(site: Path, build: Path, missing: list) -> None:
    import hashlib
    import zipfile

    site.mkdir(parents=True, exist_ok=True)
    for dist, version, text in missing:
        hashes = {line.split("sha256:")[1].strip(" \\") for line in text.splitlines()[1:]}
        prefix = f"{dist.lower()}-{version}-"
        fits = [w for w in WHEELS.glob("*.whl") if w.name.lower().startswith(prefix)]
        fits = [w for w in fits if _wheel_fits(w.name)]
        if not fits:
            raise RuntimeError(
                f"no wheel of {dist}=={version} fits Python {platform.python_version()}"
            )
        if hashlib.sha256(fits[0].read_bytes()).hexdigest() not in hashes:
            raise RuntimeError(f"{fits[0].name}: sha256 differs from requirements.txt")
        with zipfile.ZipFile(fits[0]) as z:
            z.extractall(site)
    for package in ("zlaunch", "runtime"):
        shutil.copytree(build / package, site / package, dirs_exist_ok=True)


# ---------------------------------------------------------------------------- items
def _item_env(site: Path) -> dict[str, str]:
    """The installed copy first on the path, and nothing of this tree's."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site)
    env["PATH"] = f"{site / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "4")
    env.pop("ZLAUNCH_CONFIG", None)
    return env


def run_item(item: Item, device: str, site: Path, work: Path, timeout: float) -> dict:
    """Run one item in a process of its own; its result, or what it left when it broke."""
    result_file = work / f"{item.id}.json"
    partial = work / f"{item.id}.partial"
    cmd = [
        sys.executable, str(RUNNER), "--item", item.id, "--device", device,
        "--repo", str(REPO), "--out", str(result_file), "--work", str(work / item.id),
    ]  # fmt: skip
    began = time.monotonic()
    with open(work / f"{item.id}.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=str(work), env=_item_env(site), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
    seconds = round(time.monotonic() - began, 1)
    parts = _read_partial(partial)
    if code == 0 and result_file.exists():
        out = json.loads(result_file.read_text())
    else:
        tail = _tail(work / f"{item.id}.log")
        why = f"timed out after {seconds:g} s" if code is None else f"exit status {code}"
        out = {
            "status": "error",
            "figure": f"{why}; {len(parts)} part(s) done" if parts else why,
            "reason": tail,
        }
    out.setdefault("details", {})
    if parts and "parts" not in out["details"]:
        out["details"]["parts"] = parts
    return {"id": item.id, "title": item.title, "seconds": seconds, **out}


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_partial(path: Path) -> list:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------------------- report
UNPROVEN_MULTI_RANK = (
    "NCCL collectives between ranks: reduce_scatter_tensor/all_gather_into_tensor of stages "
    "1-3 at world > 1 and their in-place chunk views",
    "overlap_comm: a bucket's reduction in flight while backward fills the next, on NCCL's stream",
    "stage 3's prefetch and the collective-order check's all-gathers on NCCL at world > 1",
    "ZeRO++ on NCCL: qwZ's packed all-gather, qgZ's all_to_all_single, hpZ's subgroups (new_group)",
    "CUDA_VISIBLE_DEVICES and cuda_index for local ranks 1..n-1 of a node",
    "multi-node NCCL (sockets/InfiniBand), NCCL timeouts and the hang report across hosts",
    "the async-save gloo group beside an NCCL world",
)


def summary_row(rows: list[dict]) -> dict:
    """The last line: what could not run, and why, and which multi-rank paths stay unproven."""
    left = [r for r in rows if r["status"] in ("skipped", "error")]
    reasons: dict[str, list[str]] = {}
    for r in left:
        reason = r["figure"] if r["status"] == "error" else r.get("reason", "")
        reasons.setdefault(reason.splitlines()[0] if reason else r["status"], []).append(r["id"])
    figure = (
        "; ".join(f"{', '.join(ids)}: {why}" for why, ids in reasons.items())
        if left
        else "every item ran"
    )
    return {
        "id": "not_run",
        "title": "what the check could not run, and why",
        "status": "info",
        "figure": figure + f"; multi-rank paths unproven on one GPU: {len(UNPROVEN_MULTI_RANK)}",
        "details": {"unproven_multi_rank": list(UNPROVEN_MULTI_RANK), "left": reasons},
        "seconds": 0.0,
    }


def markdown(report: dict) -> str:
    lines = [
        f"# Device check, {report['started']}",
        "",
        f"{report['device']}; torch {report['torch']}; Python {report['python']}; "
        f"mode {report['mode']}; {report['wall_s']:g} s of a {report['budget_s']:g} s budget.",
        "",
        "| item | status | figure | s |",
        "|---|---|---|---|",
    ]
    for r in report["items"]:
        figure = str(r["figure"]).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['id']} | {r['status']} | {figure} | {r['seconds']:g} |")
    lines += ["", "Multi-rank paths one GPU cannot prove:", ""]
    lines += [f"- {p}" for p in UNPROVEN_MULTI_RANK]
    return "\n".join(lines) + "\n"


def _line(r: dict) -> str:
    return f"{r['id']:<16} {r['status']:<8} {r['figure']}"


# ---------------------------------------------------------------------------- main
def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_check_out", help="output folder (created)")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check")
    ap.add_argument("--dry", action="store_true", help="report every CUDA item as skipped")
    ap.add_argument("--only", default="", help="comma list of item ids to run (others skipped)")
    ap.add_argument("--cpu-items", default="", help="run these items on the CPU (self-test)")
    ap.add_argument(
        "--all-wheels",
        action="store_true",
        help="install every carried wheel, also those the interpreter has (dry mode does)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    began = time.monotonic()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    known = {i.id for i in ITEMS}
    only = {x for x in args.only.split(",") if x}
    on_cpu = {x for x in args.cpu_items.split(",") if x}
    for name in only | on_cpu:
        if name not in known:
            print(f"gpu_check: unknown item {name!r}; items: {', '.join(sorted(known))}")
            return 2
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    rows: list[dict] = []
    report = {
        "started": _now(),
        "python": platform.python_version(),
        "budget_s": args.budget,
        "torch": None,
        "device": "unknown",
        "mode": "dry" if args.dry else "cuda",
        "items": rows,
    }
    try:
        site = work / "site"
        try:
            inst = install(site, all_wheels=args.all_wheels or args.dry)
            report["torch"] = inst["torch"]
            figure = (
                f"torch {inst['torch']} kept; {len(inst['wheels_installed'])} wheel(s) + the "
                f"project installed offline in {inst['seconds']:g} s"
            )
            rows.append(_row("install", "offline install against the preinstalled torch", "ok",
                             figure, inst, inst["seconds"]))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the check reports and stops
            rows.append(_row("install", "offline install", "error", str(e).splitlines()[0],
                             {"error": str(e)}, 0.0))  # fmt: skip
            print(_line(rows[-1]), flush=True)
            return _finish(report, out, began)
        print(_line(rows[-1]), flush=True)
        cuda = None
        for i, item in enumerate(ITEMS):
            later = len(ITEMS) - i - 1
            left = args.budget - (time.monotonic() - began) - later * MIN_ITEM_S
            if only and item.id not in only:
                row = _row(item.id, item.title, "skipped", "", {}, 0.0, "not asked (--only)")
            elif item.cuda and item.id not in on_cpu and (args.dry or cuda is False):
                row = _row(item.id, item.title, "skipped", "", {}, 0.0, "no CUDA")
            elif left < MIN_ITEM_S:
                row = _row(item.id, item.title, "skipped", "", {}, 0.0, "out of time budget")
            else:
                device = "cpu" if (item.id in on_cpu or not item.cuda) else "cuda"
                row = run_item(item, device, site, work, min(item.cap_s, left))
            if row["status"] == "skipped" and not row["figure"]:
                row["figure"] = f"skipped: {row['reason']}"
            if item.id == "torch_api":
                cuda = bool(row.get("details", {}).get("cuda"))
                report["device"] = row.get("details", {}).get("device", "unknown")
                if not cuda:
                    report["mode"] = "dry"
            rows.append(row)
            print(_line(row), flush=True)
        rows.append(summary_row(rows))
        print(_line(rows[-1]), flush=True)
        return _finish(report, out, began)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _row(id_, title, status, figure, details, seconds, reason="") -> dict:
    row = {"id": id_, "title": title, "status": status, "figure": figure, "details": details}
    row["seconds"] = seconds
    if reason:
        row["reason"] = reason
    return row


def _finish(report: dict, out: Path, began: float) -> int:
    report["wall_s"] = round(time.monotonic() - began, 1)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))
    print(f"gpu_check: {report['wall_s']:g} s; wrote {out / 'gpu_check.json'} and gpu_check.md")
    bad = [r["id"] for r in report["items"] if r["status"] in ("fail", "error")]
    if bad:
        print(f"gpu_check: failed or broke: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
