"""Slurm's hostlist grammar: expansion (checked against `scontrol show hostnames` where Slurm is
installed), the first host, compression, and malformed lists."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.unit.wire.test_hostlist import CASES  # shared with the unit half
from zlaunch.wire.hostlist import expand

SCONTROL = shutil.which("scontrol")


@pytest.mark.skipif(
    SCONTROL is None, reason="scontrol not installed (apt-get install slurm-client)"
)
@pytest.mark.parametrize("text", [t for t, _ in CASES if t.strip() and "\n" not in t])
def test_expansion_equals_scontrol(text, tmp_path):
    conf = tmp_path / "slurm.conf"  # scontrol reads a config even for local work
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n"
    )
    out = subprocess.run(
        [SCONTROL, "show", "hostnames", text],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert expand(text) == out.stdout.split()
