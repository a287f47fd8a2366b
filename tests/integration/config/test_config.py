"""runtime.config: DeepSpeed keys and defaults, error messages, batch rules, "auto"."""

import subprocess
import sys

from tests.unit.config.test_config import STAGE2_EXAMPLE  # shared with the unit half

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
