"""The Hugging Face Trainer runs that the bundled runtime must reproduce, shared by
`make_reference.py` (real DeepSpeed under torchrun) and `test_trainer.py` (the bundled runtime
under zlaunch): the same script, arguments and config; only the launcher and runtime differ."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONFIGS = os.path.join(ROOT, "examples", "configs")
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.json")
MAX_STEPS = 6
SAVE_STEPS = 3


@dataclass(frozen=True)
class Case:
    """One run: ``kind`` is the script (trainer: examples/trainer_llama.py, sft:
    examples/sft_lora.py, accelerate: examples/accelerate_llama.py)."""

    name: str
    kind: str
    config: str
    ranks: int
    grad_accum: int
    extra: tuple[str, ...] = ()
    save_steps: int | None = None
    max_steps: int = MAX_STEPS

    @property
    def script(self) -> str:
        return SCRIPTS[self.kind]

    def args(self, out: str) -> list[str]:
        """The script's arguments, writing under ``out``."""
        if self.kind == "accelerate":
            return [
                "--ds-config", os.path.join(CONFIGS, self.config),
                "--steps", str(self.max_steps), "--grad-accum", str(self.grad_accum),
                "--log-file", os.path.join(out, "log.json"),
                "--save-dir", os.path.join(out, "model"),
            ]  # fmt: skip
        args = [
            "--deepspeed", os.path.join(CONFIGS, self.config),
            "--output_dir", os.path.join(out, "trainer"),
            "--max_steps", str(self.max_steps),
            "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", str(self.grad_accum),
            "--learning_rate", "1e-2",
            "--warmup_steps", "2",
            "--logging_steps", "1",
            "--seed", "0",
            "--use_cpu", "--ddp_backend", "gloo",
            "--report_to", "none", "--disable_tqdm", "true",
            "--log_file", os.path.join(out, "log.json"),
            "--save_model_dir", os.path.join(out, "model"),
        ]  # fmt: skip
        if self.save_steps:
            args += ["--save_strategy", "steps", "--save_steps", str(self.save_steps)]
        else:
            args += ["--save_strategy", "no"]
        return [*args, *self.extra]


SCRIPTS = {
    "trainer": os.path.join(ROOT, "examples", "trainer_llama.py"),
    "sft": os.path.join(ROOT, "examples", "sft_lora.py"),
    "accelerate": os.path.join(ROOT, "examples", "accelerate_llama.py"),
}

# zero2: the Trainer's own scheduler (the config has none), gradient accumulation and
# evaluation, saving a checkpoint at step 3 for the resume at another world size.
# zero3: the config's WarmupDecayLR, gradient checkpointing and the 16-bit gather on save.
# (Building the model under zero.Init, --from_config, has no reference: DeepSpeed 0.19.8 on CPU
# sizes that Init's config for one rank and then refuses its own batch, "8 != 2 * 2 * 1".)
# sft_lora_zero3: TRL's SFTTrainer with a peft LoRA adapter; it trains in bf16 (SFTConfig's
# default, which reaches the DeepSpeed config even with --bf16 false here).
# accelerate_zero2: accelerate's loop with a DeepSpeedPlugin and the script's own optimizer.
CASES = {
    "zero2": Case(
        "zero2",
        "trainer",
        "hf_zero2.json",
        ranks=2,
        grad_accum=2,
        save_steps=SAVE_STEPS,
        extra=("--eval_strategy", "steps", "--eval_steps", str(SAVE_STEPS)),
    ),
    "zero3": Case(
        "zero3",
        "trainer",
        "hf_zero3.json",
        ranks=2,
        grad_accum=2,
        extra=("--gradient_checkpointing",),
    ),
    "sft_lora_zero3": Case(
        "sft_lora_zero3", "sft", "hf_zero3.json", ranks=2, grad_accum=1, max_steps=4
    ),
    "accelerate_zero2": Case(
        "accelerate_zero2", "accelerate", "accelerate_zero2.json", ranks=2, grad_accum=2
    ),
}


def outcome(case: Case, out: str) -> dict:
    """What a finished run is compared by: per-step losses (and gradient norms where the
    Trainer logs them), and the saved model's logits (the adapter's tensors for LoRA)."""
    with open(os.path.join(out, "log.json")) as f:
        log = json.load(f)
    if case.kind == "accelerate":
        result = {"losses": {str(i + 1): v for i, v in enumerate(log["losses"])}, "grad_norms": {}}
    else:
        rows = [r for r in log if "loss" in r]
        result = {
            "losses": {str(r["step"]): r["loss"] for r in rows},
            "grad_norms": {str(r["step"]): r["grad_norm"] for r in rows},
            "eval_losses": {str(r["step"]): r["eval_loss"] for r in log if "eval_loss" in r},
        }
    model_dir = os.path.join(out, "model")
    if case.kind == "sft":
        result["adapter"] = adapter_tensors(model_dir)
    else:
        result["logits"] = probe_logits(model_dir)
    return result


def adapter_tensors(model_dir: str) -> dict[str, list[float]]:
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(model_dir, "adapter_model.safetensors"))
    return {
        k: [round(v, 6) for v in t.float().reshape(-1).tolist()] for k, t in sorted(tensors.items())
    }


def probe_logits(model_dir: str) -> list[list[float]]:
    """Logits of the saved model (loaded with ``from_pretrained``) on a fixed sequence."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    tokens = torch.arange(16).reshape(1, 16) * 7 % model.config.vocab_size
    with torch.no_grad():
        logits = model(input_ids=tokens).logits[0]
    return [[round(v, 6) for v in row] for row in logits.tolist()]
