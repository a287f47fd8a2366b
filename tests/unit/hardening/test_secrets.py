"""Issue 13 item 7: secrets never reach the run directory or the dry-run plan, and the run
directory is private. Through the real ``zlaunch`` command."""

from __future__ import annotations

from zlaunch.redact import (
    NOT_RECORDED,
    REDACTED,
    recorded_env_value,
    redact_argv,
    shown_env_value,
)

# Names that the old TOKEN|SECRET|PASSWORD|KEY pattern missed, and a value-borne secret.


def test_the_allow_list_and_the_patterns():
    assert recorded_env_value("WORLD_SIZE", "4") == "4"
    assert recorded_env_value("NCCL_DEBUG", "INFO") == "INFO"
    assert recorded_env_value("HF_HOME", "/data") == NOT_RECORDED
    assert shown_env_value("PATH", "/usr/bin") == "/usr/bin"  # PAT only as a word
    assert shown_env_value("GH_PAT", "x") == REDACTED
    assert shown_env_value("X", "hf_abcdef") == REDACTED
    assert redact_argv(["t.py", "--patience", "3", "--auth", "a", "https://u:p@h/x"]) == [
        "t.py",
        "--patience",
        "3",
        "--auth",
        REDACTED,
        f"https://u:{REDACTED}@h/x",
    ]
