"""--launcher and --slurm-mode are enums in the options: a caller's plain string becomes the
member it names, an unknown one is a usage error naming the choices, and the command line's
choices are exactly the members."""

from __future__ import annotations

import pytest

from zlaunch.errors import UsageError
from zlaunch.job import LAUNCHERS, SLURM_MODES, Launcher, LaunchOptions, SlurmMode
from zlaunch.job.hostfile import Host


def _options(**values):
    return LaunchOptions(
        hosts=[Host("localhost", 1)], program=("train.py",), python="python3", **values
    )


def test_a_plain_string_becomes_the_member_it_names():
    opts = _options(launcher="mpi", slurm_mode="one-step")
    assert opts.launcher is Launcher.MPI and opts.slurm_mode is SlurmMode.ONE_STEP
    assert _options().launcher is Launcher.SSH and _options().slurm_mode is SlurmMode.STEP_PER_NODE
    assert f"--launcher {opts.launcher}" == "--launcher mpi"  # as the command line spells it


def test_the_choices_are_the_members():
    assert LAUNCHERS == ("ssh", "slurm", "mpi", "dialin", "ray", "k8s")
    assert [Launcher(name) for name in LAUNCHERS] == list(Launcher)
    assert [SlurmMode(name) for name in SLURM_MODES] == list(SlurmMode)


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"launcher": "pbs"}, "--launcher must be one of ssh, slurm, mpi, dialin, ray, k8s"),
        ({"slurm_mode": "many"}, "--slurm-mode must be one of step-per-node, one-step"),
    ],
)
def test_an_unknown_name_is_refused_with_the_choices(values, said):
    with pytest.raises(UsageError, match=said):
        _options(**values)
