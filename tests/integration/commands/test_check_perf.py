"""`zlaunch check --perf` with its real probe on this machine: every figure measured, the
checkpoint directory left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_the_probe_measures_compute_and_the_checkpoint_dir_and_leaves_nothing(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    hostfile = tmp_path / "healthy"
    result = subprocess.run(
        [sys.executable, "-m", "zlaunch", "check", "--num-gpus", "2", "--perf", "--json",
         "--checkpoint-dir", str(ckpt), "--write-hostfile", str(hostfile)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    perf = host["facts"]["perf"]
    assert perf["device"] == "cpu"
    assert all(perf[k] > 0 for k in ("gflops", "write_mbs", "read_mbs")), perf
    assert list(ckpt.iterdir()) == []  # its test file removed
    assert hostfile.read_text() == "localhost slots=2\n"


def test_the_network_of_two_local_hosts_is_measured_both_ways_through_gloo(tmp_path):
    """localhost and 127.0.0.1, one slot each: the ring's one link measured each way with real
    gloo transfers (64 KiB doubled until a quarter second or 64 MiB)."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    result = subprocess.run(
        [sys.executable, "-m", "zlaunch", "check", "-H", str(hostfile), "--perf", "--json",
         "--checkpoint-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    report = json.loads(result.stdout)
    network = report["network"]
    assert network is not None, result.stderr
    assert network["backend"] == "gloo"
    links = sorted((lk["src"], lk["dst"]) for lk in network["links"])
    assert links == [("127.0.0.1", "localhost"), ("localhost", "127.0.0.1")]
    for link in network["links"]:
        assert link["mbs"] > 0 and link["latency_ms"] > 0, link
        assert link["bytes"] >= 1 << 16
    # named outliers (a loaded machine can make one way look slow) are said on both hosts
    for outlier in network["outliers"]:
        assert outlier["text"] in " ".join(p for h in report["hosts"] for p in h["problems"])
    assert not any("network probe" in p for h in report["hosts"] for p in h["problems"])
    assert list(tmp_path.glob(".zlaunch-perf-*")) == []
