"""Noise on the console, through the real `zlaunch` command.

c10d's reverse-DNS warning is hidden on the console with one note (the rank log keeps it); an
SSH port that never answers with an SSH banner is one zlaunch message with a hint, without
paramiko's tracebacks; numpy is a dependency, so torch never prints "Failed to initialize
NumPy" on every rank of a fresh install.
"""

from __future__ import annotations

import configparser
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_numpy_is_a_dependency():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    requires = [
        line.split("#")[0].strip()
        for line in config["options"]["install_requires"].splitlines()
        if line.split("#")[0].strip()
    ]
    assert any(r.startswith("numpy") for r in requires), requires
