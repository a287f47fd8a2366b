"""runtime.config: DeepSpeed keys and defaults, error messages, batch rules, "auto"."""

import subprocess
import sys

STAGE2_EXAMPLE = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 2,
    "fp16": {
        "enabled": True,
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "optimizer": {
        "type": "Adam",
        "params": {"lr": 1.5e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2},
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 200000000,
        "reduce_scatter": True,
        "reduce_bucket_size": 200000000,
        "overlap_comm": True,
        "contiguous_gradients": True,
    },
}


# --- no torch -------------------------------------------------------------------------------


def test_import_pulls_no_torch():
    code = (
        "import sys\n"
        "import runtime.config\n"
        "c = runtime.config.load_config({'train_micro_batch_size_per_gpu': 1}).resolve(2)\n"
        "print('torch' in sys.modules, c.train_batch_size)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "2"]


def test_works_with_torch_blocked():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "from runtime.config import load_config\n"
        f"print(load_config({STAGE2_EXAMPLE!r}).resolve(4).train_batch_size)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "128"


# --- defaults -------------------------------------------------------------------------------


# --- errors name file, key and fix ------------------------------------------------------------


# --- numbers --------------------------------------------------------------------------------


# --- files ----------------------------------------------------------------------------------


# --- unknown keys and features this runtime does not implement --------------------------------


# --- batch triple ----------------------------------------------------------------------------
