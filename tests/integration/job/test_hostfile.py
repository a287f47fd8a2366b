"""Hostfile grammar, its errors (file:line, exit 2) and the default localhost job."""

from __future__ import annotations

from zlaunch.job.hostfile import Host, default_hosts, visible_gpu_slots

# ---- grammar ------------------------------------------------------------------------------


# ---- errors: each names file:line and says how to fix it ------------------------------------


# ---- default hosts --------------------------------------------------------------------------


def test_visible_gpus_from_nvidia_smi(monkeypatch, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'echo "GPU 0: NVIDIA H100 (UUID: GPU-1)"\n'
        'echo "GPU 1: NVIDIA H100 (UUID: GPU-2)"\n'
        'echo "GPU 2: NVIDIA H100 (UUID: GPU-3)"\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    assert visible_gpu_slots({}) == (0, 1, 2)
    assert default_hosts(None, {}) == [Host("localhost", (0, 1, 2))]
    assert default_hosts(2, {}) == [Host("localhost", (0, 1))]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert visible_gpu_slots({}) is None
