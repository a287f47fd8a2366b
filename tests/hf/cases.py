"""The Hugging Face Trainer runs that the bundled runtime must reproduce, shared by
`make_reference.py` (real DeepSpeed under torchrun) and `test_trainer.py` (the bundled runtime
under zlaunch): the same script, arguments and config; only the launcher and runtime differ."""

from __future__ import annotations

import os
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "trainer_llama.py")
CONFIGS = os.path.join(ROOT, "examples", "configs")
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.json")
MAX_STEPS = 6
SAVE_STEPS = 3


@dataclass(frozen=True)
class Case:
    name: str
    config: str
    ranks: int
    grad_accum: int
    extra: tuple[str, ...] = ()
    save_steps: int | None = None

    def args(self, out: str) -> list[str]:
        """The script's arguments, writing under ``out``."""
        args = [
            "--deepspeed", os.path.join(CONFIGS, self.config),
            "--output_dir", os.path.join(out, "trainer"),
            "--max_steps", str(MAX_STEPS),
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


# ZeRO-2 with the Trainer's own scheduler (the config has none) and gradient accumulation,
# saving a checkpoint at step 3 for the resume at another world size; ZeRO-3 with the config's
# WarmupDecayLR, gradient checkpointing and the 16-bit gather on save.
CASES = {
    "zero2": Case("zero2", "hf_zero2.json", ranks=2, grad_accum=2, save_steps=SAVE_STEPS),
    "zero3": Case("zero3", "hf_zero3.json", ranks=2, grad_accum=2, extra=("--gradient_checkpointing",)),
}


def probe_logits(model_dir: str) -> list[list[float]]:
    """Logits of the saved model (loaded with ``from_pretrained``) on a fixed sequence."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    tokens = torch.arange(16).reshape(1, 16) * 7 % model.config.vocab_size
    with torch.no_grad():
        return model(input_ids=tokens).logits[0].tolist()


def losses(log_file: str) -> dict[int, float]:
    """Step -> loss from the Trainer's log history."""
    import json

    with open(log_file) as f:
        history = json.load(f)
    return {row["step"]: row["loss"] for row in history if "loss" in row}
