"""The one metrics line (zlaunch.wire.metrics_format): what ranks log and the controller prints."""

from __future__ import annotations

import subprocess
import sys


def test_the_formatter_imports_neither_torch_nor_rich():
    code = (
        "import sys, zlaunch.wire.metrics_format\n"
        "print(' '.join(m for m in ('torch', 'rich') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
