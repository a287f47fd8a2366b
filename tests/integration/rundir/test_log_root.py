"""A log root another user can write is refused, and every file of a run
directory is opened relative to the directory's descriptor, never through a planted link."""

from __future__ import annotations

import os

import pytest

from tests.integration.commands.hostile_input import assert_usage_error, write_script, zlaunch


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_log_root_others_can_write_is_refused_before_anything_runs(tmp_path, mode):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(mode)
    marker = tmp_path / "ran"
    script = write_script(tmp_path, "w.py", f"open({str(marker)!r}, 'w').close()\n")
    result = zlaunch(tmp_path, "--log-dir", str(root), script, timeout=60)
    assert_usage_error(result, f"log directory {root} can be written by others")
    assert not marker.exists() and os.listdir(root) == []
