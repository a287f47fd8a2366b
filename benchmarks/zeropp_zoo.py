"""ZeRO++ on the zoo's models (tests/cluster/zoo/models.py): loss deviation from plain stage 3.

    python benchmarks/zeropp_zoo.py [--world-size 4] [--hpz 2] [--steps 6] [--models a,b]
        [--json out.json]

For every zoo model (third-party code: torch layers, Hugging Face transformers at tiny random
configs, peft), the ranks train it at plain stage 3 and with each ZeRO++ variant (hpZ, qwZ,
qgZ, all three) on the same batches, everything partitioned and every unit gathered again
for backward. Printed per model and variant: whether the losses equal plain stage 3's bit for
bit on every rank, and the largest relative deviation of a step's mean loss from plain's.
The bound docs/zeropp.md states comes from these numbers and from
tests/integration/zero/test_zeropp.py.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("plain", "hpz", "qwz", "qgz", "zeropp")
MICRO, LR = 2, 2e-3


def zero_of(variant: str, hpz: int) -> dict:
    return {
        "plain": {},
        "hpz": {"zero_hpz_partition_size": hpz},
        "qwz": {"zero_quantized_weights": True},
        "qgz": {"zero_quantized_gradients": True},
        "zeropp": {
            "zero_hpz_partition_size": hpz,
            "zero_quantized_weights": True,
            "zero_quantized_gradients": True,
        },
    }[variant]


def _rank_main(rank: int, args, port: int, out: str, names: list[str]) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(args.world_size),
        LOCAL_WORLD_SIZE=str(args.world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO))
    import runtime
    from tests.cluster.zoo.models import ZOO, make_batches

    results: dict = {}
    for name in names:
        entry = ZOO[name]
        batches = make_batches(entry.kind, args.steps, args.world_size * MICRO)
        results[name] = {}
        for variant in VARIANTS:
            model = entry.build()
            cfg = {
                "train_micro_batch_size_per_gpu": MICRO,
                "gradient_clipping": 1.0,
                "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
                "zero_optimization": {
                    "stage": 3,
                    "stage3_param_persistence_threshold": 0,
                    "stage3_max_reuse_distance": 0,
                    **zero_of(variant, args.hpz),
                },
            }
            engine, *_ = runtime.initialize(
                model=model,
                model_parameters=[p for p in model.parameters() if p.requires_grad],
                config=cfg,
            )
            losses = []
            for batch in batches:
                rows = {k: v[rank * MICRO : (rank + 1) * MICRO] for k, v in batch.items()}
                loss = entry.loss(engine, rows)
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
            results[name][variant] = losses
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--hpz", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--models", help="comma list of zoo names (default: all)")
    p.add_argument("--json")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import tempfile

    import torch.multiprocessing as mp

    from tests.cluster.zoo.models import ZOO

    names = args.models.split(",") if args.models else sorted(ZOO)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank_main, args=(args, port, out, names), nprocs=args.world_size)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(args.world_size)]
    table = {}
    print(f"{'model':32} " + " ".join(f"{v:>16}" for v in VARIANTS[1:]))
    for name in names:
        plain = [sum(s) / len(s) for s in zip(*[r[name]["plain"] for r in ranks], strict=True)]
        row = {}
        for v in VARIANTS[1:]:
            got = [sum(s) / len(s) for s in zip(*[r[name][v] for r in ranks], strict=True)]
            equal = all(r[name][v] == r[name]["plain"] for r in ranks)
            dev = max(abs(a - b) / abs(b) for a, b in zip(got, plain, strict=True))
            row[v] = {"bit_equal": equal, "max_rel_deviation": dev}
        table[name] = row
        cells = " ".join(
            f"{'equal' if c['bit_equal'] else format(c['max_rel_deviation'], '.2e'):>16}"
            for c in row.values()
        )
        print(f"{name:32} {cells}")
    worst = {v: max(table[n][v]["max_rel_deviation"] for n in names) for v in VARIANTS[1:]}
    print("largest deviation: " + ", ".join(f"{v} {d:.2e}" for v, d in worst.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "table": table}, indent=1))


if __name__ == "__main__":
    main()
