"""The launcher reads a save folder's ``latest`` (to say which checkpoint a job saved) only
when it is a small regular file: a FIFO, a link to a device or a huge file planted in a shared
save folder is named, never waited on or read whole."""

from __future__ import annotations

import os

import pytest

from zlaunch.launcher.saved_checkpoint import MAX_LATEST_BYTES, latest_tag


def test_the_tag_a_save_wrote_is_read(tmp_path):
    (tmp_path / "latest").write_text("global_step12\n")
    assert latest_tag(str(tmp_path)) == ("global_step12", "")
    (tmp_path / "latest").unlink()
    assert latest_tag(str(tmp_path)) == (None, "no 'latest' file")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "two-lines", "parent"])
def test_a_planted_latest_is_named_not_read(tmp_path, kind):
    latest = tmp_path / "latest"
    if kind == "fifo":
        os.mkfifo(latest)  # opened non-blocking: no writer needed, nothing waited on
    elif kind == "dev-zero":
        latest.symlink_to("/dev/zero")
    elif kind == "huge":
        with open(latest, "wb") as f:
            f.truncate(1 << 30)  # sparse
    elif kind == "two-lines":
        latest.write_text("a\nb\n")
    else:
        latest.write_text("..")
    why = {
        "fifo": "is not a regular file",
        "dev-zero": "is a symbolic link",
        "huge": f"holds {1 << 30} bytes",
        "two-lines": "names no checkpoint",
        "parent": "names no checkpoint",
    }[kind]
    tag, said = latest_tag(str(tmp_path))
    assert tag is None and said.startswith(str(latest)) and why in said, said
    assert MAX_LATEST_BYTES < 1 << 30
