"""A host missing from known_hosts is refused unless the user says to trust it
(the spec sent next carries every secret of the job). On the real test cluster."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.integration.commands.hostile_input import write_script, zlaunch
from tests.integration.launcher import helpers

pytestmark = pytest.mark.cluster

idle_cluster = helpers.idle_cluster  # autouse: no process left on any host


def _config_without_known_hosts(cluster, tmp_path: Path, strict: str | None) -> tuple[str, Path]:
    """The cluster's ssh config with an empty known_hosts and StrictHostKeyChecking as given."""
    known = tmp_path / "ssh" / "known_hosts"
    lines = []
    for line in Path(cluster.ssh_config).read_text().splitlines():
        if "UserKnownHostsFile" in line:
            line = f"    UserKnownHostsFile {known}"
        elif "StrictHostKeyChecking" in line:
            if strict is None:
                continue
            line = f"    StrictHostKeyChecking {strict}"
        lines.append(line)
    config = tmp_path / "ssh_config"
    config.write_text("\n".join(lines) + "\n")
    return str(config), known


@pytest.mark.parametrize("strict", [None, "ask"])
def test_an_unknown_host_key_is_refused_by_default(cluster, tmp_path, strict):
    config, known = _config_without_known_hosts(cluster, tmp_path, strict)
    hostfile = cluster.hostfile(1, hosts=["node1"])
    marker = tmp_path / "ran"
    script = write_script(tmp_path, "w.py", f"open({str(marker)!r}, 'w').close()\n")
    result = zlaunch(tmp_path, "-H", hostfile, "--ssh-config", config, script, timeout=60)
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "not in known_hosts" in err and "--accept-new-hosts" in err and "SHA256:" in err
    assert "Traceback" not in err
    assert not marker.exists() and not known.exists()


def test_accept_new_hosts_records_the_key_and_later_runs_check_it(cluster, tmp_path):
    config, known = _config_without_known_hosts(cluster, tmp_path, None)
    hostfile = cluster.hostfile(1, hosts=["node1"])
    script = write_script(tmp_path, "w.py", "pass\n")
    args = ("-H", hostfile, "--ssh-config", config)
    first = zlaunch(tmp_path, *args, "--accept-new-hosts", script, timeout=60)
    assert first.returncode == 0, first.stderr.decode()
    lines = known.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(cluster.address("node1") + " ssh-ed25519 ")
    assert stat.S_IMODE(os.stat(known).st_mode) == 0o600
    again = zlaunch(tmp_path, *args, script, timeout=60)  # recorded: no flag needed now
    assert again.returncode == 0, again.stderr.decode()
    assert known.read_text().splitlines() == lines


def test_a_recorded_key_that_changed_is_refused_even_with_accept_new_hosts(cluster, tmp_path):
    config, known = _config_without_known_hosts(cluster, tmp_path, None)
    known.parent.mkdir()
    other = Path(cluster.known_hosts).read_text().splitlines()[1].split()  # node2's key
    known.write_text(f"{cluster.address('node1')} {other[1]} {other[2]}\n")
    hostfile = cluster.hostfile(1, hosts=["node1"])
    script = write_script(tmp_path, "w.py", "pass\n")
    result = zlaunch(
        tmp_path, "-H", hostfile, "--ssh-config", config, "--accept-new-hosts", script, timeout=60
    )
    assert result.returncode == 1 and "host key changed" in result.stderr.decode()
