"""The Hugging Face Trainer on the bundled runtime beside real DeepSpeed, side by side.

    python benchmarks/trainer_runtimes.py [--steps 30] [--rounds 2] [--stages 2,3]
        [--hidden 256] [--layers 4] [--markdown out.md]

The same unmodified script (examples/trainer_llama.py, a Llama built from a config, "auto"
configs examples/configs/hf_zero{2,3}.json) under ``zlaunch --num-gpus 2 --runtime bundled``
and ``--runtime deepspeed``, alternating in rounds so load on a shared machine hits both alike.
Reported: the Trainer's own ``train_runtime`` (seconds for all steps, first step included) per
run, the median per runtime and the ratio bundled / DeepSpeed; and the final loss of each run
(they must agree). Needs DeepSpeed installed (the bench extra); CPU: gloo, fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "trainer_llama.py")


def run(runtime: str, stage: int, args, out: str) -> dict:
    command = [
        sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--runtime", runtime, "--no-color",
        "--log-dir", os.path.join(out, "runs"), SCRIPT,
        "--deepspeed", os.path.join(ROOT, "examples", "configs", f"hf_zero{stage}.json"),
        "--output_dir", os.path.join(out, "trainer"), "--max_steps", str(args.steps),
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1",
        "--hidden_size", str(args.hidden), "--num_layers", str(args.layers), "--seq_len", "64",
        "--learning_rate", "1e-3", "--logging_steps", "1", "--save_strategy", "no",
        "--use_cpu", "--ddp_backend", "gloo", "--report_to", "none", "--disable_tqdm", "true",
        "--log_file", os.path.join(out, "log.json"),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=ROOT)
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    with open(os.path.join(out, "log.json")) as f:
        history = json.load(f)
    summary = next(r for r in history if "train_runtime" in r)
    losses = [r["loss"] for r in history if "loss" in r]
    return {"train_runtime": summary["train_runtime"], "final_loss": losses[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args()
    stages = [int(s) for s in args.stages.split(",")]
    results: dict = {s: {"bundled": [], "deepspeed": []} for s in stages}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for stage in stages:
                order = ("bundled", "deepspeed") if r % 2 == 0 else ("deepspeed", "bundled")
                for runtime in order:
                    out = os.path.join(tmp, f"{runtime}-{stage}-{r}")
                    results[stage][runtime].append(run(runtime, stage, args, out))
    lines = [
        f"Trainer, tiny Llama (hidden {args.hidden}, {args.layers} layers, seq 64), 2 ranks, "
        f"gloo, fp32, {args.steps} steps, micro batch 4, {args.rounds} alternating rounds",
        "",
        "| stage | bundled train_runtime (s) | DeepSpeed train_runtime (s) | ratio | final loss "
        "bundled / DeepSpeed |",
        "|---|---|---|---|---|",
    ]
    for stage in stages:
        ours = [x["train_runtime"] for x in results[stage]["bundled"]]
        theirs = [x["train_runtime"] for x in results[stage]["deepspeed"]]
        ratio = statistics.median(ours) / statistics.median(theirs)
        loss_ours = results[stage]["bundled"][-1]["final_loss"]
        loss_theirs = results[stage]["deepspeed"][-1]["final_loss"]
        lines.append(
            f"| {stage} | {', '.join(f'{v:.2f}' for v in ours)} | "
            f"{', '.join(f'{v:.2f}' for v in theirs)} | {ratio:.2f}x | "
            f"{loss_ours:.6f} / {loss_theirs:.6f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(
                f"`python benchmarks/{os.path.basename(__file__)} {' '.join(sys.argv[1:])}`\n\n"
            )
            f.write(text + "\n")


if __name__ == "__main__":
    main()
