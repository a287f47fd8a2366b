"""What the suite does about missing system programs before it starts (tests/system_packages.py):
install them as root with apt-get, else say once which tiers skip and the command that fixes it."""

from __future__ import annotations

from tests.system_packages import NEEDED, NO_INSTALL_ENV, Install, Nothing, Tell, plan

NEED = (
    ("sshd", "openssh-server", "the SSH test cluster"),
    ("ip", "iproute2", "the SSH test cluster"),
    ("slurmctld", "slurm-wlm", "the Slurm test cluster"),
    ("srun", "slurm-wlm", "the Slurm test cluster"),
)


def _missing(*tools):
    return lambda tool: tool not in tools


def test_nothing_to_do_when_every_program_is_there():
    assert plan(_missing(), 0, True, {}, NEED) == Nothing()


def test_root_with_apt_installs_each_missing_package_once():
    assert plan(_missing("sshd", "slurmctld", "srun"), 0, True, {}, NEED) == Install(
        ("openssh-server", "slurm-wlm"), ("sshd", "slurmctld", "srun")
    )


def test_another_user_is_told_what_skips_and_the_command():
    action = plan(_missing("sshd", "srun"), 1000, True, {}, NEED)
    assert action == Tell(
        "tests: sshd, srun not found (not root), so these skip: the SSH test cluster; the Slurm "
        "test cluster. To run them: sudo apt-get install openssh-server slurm-wlm, then run "
        "the tests again."
    )


def test_no_apt_or_asked_not_to_install_names_the_reason():
    no_apt = plan(_missing("ip"), 0, False, {}, NEED)
    assert isinstance(no_apt, Tell) and "(no apt-get here)" in no_apt.message
    assert "install iproute2 with this system's package manager" in no_apt.message
    asked = plan(_missing("ip"), 0, True, {NO_INSTALL_ENV: "1"}, NEED)
    assert isinstance(asked, Tell) and f"({NO_INSTALL_ENV} is set)" in asked.message


def test_the_packages_are_the_ones_ci_installs():
    from pathlib import Path

    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    for _, package, _ in NEEDED:
        assert package in ci, package


def test_the_readme_test_command_is_the_one_ci_runs():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    command = re.search(r"^(pip install torch.*-e '\.\[test\]'.*)$", readme, re.M).group(1)
    ci = (root / ".ci" / "run").read_text()
    assert command.replace("pip install ", "pip install -q ") in ci
    # CI installs nothing itself: the suite does, for CI and for anyone running the command
    assert "apt-get install" not in "\n".join(
        line for line in ci.splitlines() if not line.lstrip().startswith("#")
    )
