"""Each bad input makes the real ``zlaunch`` command exit 2 with
one short message naming the place, never a traceback, a MemoryError or a silent acceptance."""

from __future__ import annotations

import pytest

# (hostfile text or None, .zlaunch_env text or None, extra args, words the message holds)


def test_the_remote_command_never_reads_the_interpreter_as_an_option():
    from zlaunch.transport.ssh import remote_command

    with pytest.raises(ValueError, match="option of exec"):
        remote_command(["-c", "-m", "zlaunch.agent"])
    assert remote_command(["python3", "-m", "zlaunch.agent"]) == (
        "cd / && exec python3 -m zlaunch.agent"
    )
