"""Checkpoint save, load and export time of two source trees, side by side.

For each tree, alternately (A, B, A, B, ...: load on the host hits both alike), one process
with ``PYTHONPATH`` set to that tree:

- **save**: `storage.write_checkpoint` of one rank holding ``--params`` parameters of
  ``--elements`` fp32 elements each, with the three kinds Adam saves (``param``, ``exp_avg``,
  ``exp_avg_sq``): serialisation, the writes, every fsync and the commit;
- **load**: a `CheckpointReader` of that checkpoint reading every parameter of every kind
  whole (header checks and the crc32 of the shard included);
- **export**: ``convert(..., to="hf")`` of it (streamed safetensors shards, index, config).

    python benchmarks/checkpoint_io.py --base /tmp/base --new . --repeats 5

Prints each phase's median per tree and the ratio new/base; ``--json`` writes every sample.
Judge the ratios: the absolute seconds move with the page cache and the disk of the moment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = ("param", "exp_avg", "exp_avg_sq")


def _worker(work: Path, params: int, elements: int) -> dict[str, float]:
    """One round in this process's tree: the seconds of save, load and export."""
    import torch

    from runtime.checkpoint.export import convert
    from runtime.checkpoint.reader import CheckpointReader
    from runtime.checkpoint.storage import Piece, write_checkpoint

    g = torch.Generator().manual_seed(0)
    names = [f"layer{i}.weight" for i in range(params)]
    pieces = [
        (Piece(n, 0, elements), {k: torch.randn(elements, generator=g) for k in KINDS})
        for n in names
    ]
    config = {"model_type": "llama"}
    fields = {"params": {n: {"shape": [elements]} for n in names}, "hf_config": config}
    save_dir = work / "save"
    start = time.perf_counter()
    path = write_checkpoint(
        str(save_dir), "t", rank=0, world_size=1, agree=lambda ok: ok, pieces=pieces,
        manifest_fields=lambda: fields,
    )  # fmt: skip
    save_s = time.perf_counter() - start
    start = time.perf_counter()
    with CheckpointReader(path) as reader:
        total = sum(reader.read(n, k).numel() for n in names for k in KINDS)
    load_s = time.perf_counter() - start
    assert total == params * elements * len(KINDS)
    start = time.perf_counter()
    convert(str(save_dir), str(work / "hf"), "hf", max_shard_bytes=64 * 2**20)
    export_s = time.perf_counter() - start
    return {"save": save_s, "load": load_s, "export": export_s}


def _round(tree: Path, work: Path, args) -> dict[str, float]:
    out = work / "result.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", str(work),
            "--params", str(args.params), "--elements", str(args.elements)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the worker exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, help="the tree to compare against")
    parser.add_argument("--new", type=Path, default=Path("."), help="the tree measured")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--params", type=int, default=64)
    parser.add_argument("--elements", type=int, default=1 << 18, help="per parameter")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = _worker(args.worker, args.params, args.elements)
        (args.worker / "result.json").write_text(json.dumps(result))
        return
    trees = {"base": args.base.resolve(), "new": args.new.resolve()} if args.base else {}
    trees = trees or {"new": args.new.resolve()}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    size = args.params * args.elements * 4 * len(KINDS)
    print(f"{args.params} parameters x {args.elements} elements x {len(KINDS)} kinds = "
          f"{size / 2**20:.0f} MiB per save")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="zl-ckpt-io-") as tmp:
        for repeat in range(args.repeats):
            for name, tree in trees.items():
                work = Path(tmp) / f"{name}-{repeat}"
                work.mkdir()
                samples[name].append(_round(tree, work, args))
                shutil.rmtree(work)  # the disk stays small
    for phase in ("save", "load", "export"):
        medians = {n: statistics.median(s[phase] for s in samples[n]) for n in trees}
        line = "  ".join(f"{n} {v:.3f} s" for n, v in medians.items())
        if "base" in medians:
            line += f"  new/base {medians['new'] / medians['base']:.3f}"
        print(f"{phase:>7}: {line}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "samples": samples}, default=str, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
