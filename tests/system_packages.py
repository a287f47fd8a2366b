"""The system programs the suite's test clusters need, installed before anything looks for them.

The SSH test cluster needs sshd, ssh and ip; the Slurm one slurmctld, slurmd, srun and munged;
the MPI launcher's tests mpirun; the fault tests iptables; the live-view tests tmux. Without
them those tiers skip, and a newcomer running the README's test command would run less than
CI does. So the suite's first act (tests/conftest.py) is :func:`ensure`: as root on a machine
with apt-get, the missing packages are installed (as .ci/run always did); otherwise it says once
what is missing, what it costs and the command that installs it. An install that fails stops
the run with apt-get's words. ``ZLAUNCH_TEST_NO_INSTALL=1`` keeps it from installing anything.

:func:`plan` is the decision, pure, table-tested in tests/unit/test_system_packages.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["NEEDED", "Install", "Nothing", "Tell", "ensure", "plan"]

NEEDED: tuple[tuple[str, str, str], ...] = (
    # (program, Debian package, what skips without it)
    ("sshd", "openssh-server", "the SSH test cluster (tests/cluster)"),
    ("ssh", "openssh-client", "the SSH test cluster (tests/cluster)"),
    ("ssh-keygen", "openssh-client", "the SSH test cluster (tests/cluster)"),
    ("ip", "iproute2", "the SSH test cluster (tests/cluster)"),
    ("ps", "procps", "the SSH test cluster (tests/cluster)"),
    ("slurmctld", "slurm-wlm", "the Slurm test cluster (tests/cluster/slurm)"),
    ("slurmd", "slurm-wlm", "the Slurm test cluster (tests/cluster/slurm)"),
    ("srun", "slurm-wlm", "the Slurm test cluster (tests/cluster/slurm)"),
    ("scontrol", "slurm-wlm", "the Slurm hostlist tests"),
    ("munged", "munge", "the Slurm test cluster (tests/cluster/slurm)"),
    ("mpirun", "openmpi-bin", "the mpirun launcher's tests"),
    ("iptables", "iptables", "the network fault tests (tests/cluster/faults)"),
    ("tmux", "tmux", "the live view's terminal tests"),
)
NO_INSTALL_ENV = "ZLAUNCH_TEST_NO_INSTALL"
_SEARCH = ":/usr/sbin:/sbin"  # sshd and friends live there, often off a user's PATH


@dataclass(frozen=True)
class Nothing:
    """Everything is there."""


@dataclass(frozen=True)
class Install:
    """Install these packages with apt-get (as root)."""

    packages: tuple[str, ...]
    missing: tuple[str, ...]


@dataclass(frozen=True)
class Tell:
    """Install nothing; say this once."""

    message: str


def plan(
    found: Callable[[str], bool],
    euid: int,
    has_apt: bool,
    environ: Mapping[str, str],
    needed: Sequence[tuple[str, str, str]] = NEEDED,
) -> Nothing | Install | Tell:
    """What to do about the programs of ``needed`` that ``found`` does not find."""
    missing = [(tool, package, what) for tool, package, what in needed if not found(tool)]
    if not missing:
        return Nothing()
    tools = tuple(tool for tool, _, _ in missing)
    packages = tuple(dict.fromkeys(package for _, package, _ in missing))
    skipped = "; ".join(dict.fromkeys(what for _, _, what in missing))
    command = f"apt-get install {' '.join(packages)}"
    if environ.get(NO_INSTALL_ENV):
        why = f"{NO_INSTALL_ENV} is set"
    elif euid != 0:
        why = "not root"
        command = f"sudo {command}"
    elif not has_apt:
        why = "no apt-get here"
        command = f"install {' '.join(packages)} with this system's package manager"
    else:
        return Install(packages, tools)
    return Tell(
        f"tests: {', '.join(tools)} not found ({why}), so these skip: {skipped}. "
        f"To run them: {command}, then run the tests again."
    )


def _found(tool: str) -> bool:
    return shutil.which(tool, path=os.environ.get("PATH", "") + _SEARCH) is not None


def ensure(say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)) -> str | None:
    """Install what :func:`plan` says, or say why not. Returns why an install failed (the suite
    then stops with it: as root a run that quietly skipped whole tiers would pass for CI's),
    else None."""
    action = plan(_found, os.geteuid(), shutil.which("apt-get") is not None, os.environ)
    if isinstance(action, Nothing):
        return None
    if isinstance(action, Tell):
        say(action.message)
        return None
    say(
        f"tests: installing {' '.join(action.packages)} for the test clusters "
        f"({', '.join(action.missing)} not found; {NO_INSTALL_ENV}=1 skips this)..."
    )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=300"]  # another run may be installing at this moment
    for command in (
        ["apt-get", *lock, "update", "-qq"],
        ["apt-get", *lock, "install", "-y", "-qq", *action.packages],
    ):
        done = subprocess.run(
            command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return (
                f"installing the test clusters' packages failed: `{' '.join(command)}` exited "
                f"{done.returncode}: {' | '.join(tail)}. Fix that, or run with "
                f"{NO_INSTALL_ENV}=1 to skip the tiers that need {', '.join(action.packages)}"
            )
    still = [tool for tool in action.missing if not _found(tool)]
    if still:
        return f"installed {' '.join(action.packages)}, but still not found: {', '.join(still)}"
    return None
