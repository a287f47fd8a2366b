"""Issue 13 item 7: what of argv and the environment is shown and recorded (the redaction rules);
the real command's side is in tests/integration/text/test_secrets.py."""

from __future__ import annotations

from zlaunch.text.redact import (
    NOT_RECORDED,
    REDACTED,
    recorded_env_value,
    redact_argv,
    shown_env_value,
)


def test_the_allow_list_and_the_patterns():
    assert recorded_env_value("WORLD_SIZE", "4") == "4"
    assert recorded_env_value("NCCL_DEBUG", "INFO") == "INFO"
    assert recorded_env_value("HF_HOME", "/data") == NOT_RECORDED
    assert shown_env_value("PATH", "/usr/bin") == "/usr/bin"  # PAT only as a word
    assert shown_env_value("GH_PAT", "x") == REDACTED
    assert shown_env_value("X", "hf_" + "abcdefghij" * 3 + "klmn") == REDACTED  # a token's shape
    assert shown_env_value("X", "hf_trainer.py") == "hf_trainer.py"  # not a prefix alone
    assert redact_argv(["t.py", "--patience", "3", "--auth", "a", "https://u:p@h/x"]) == [
        "t.py",
        "--patience",
        "3",
        "--auth",
        REDACTED,
        f"https://u:{REDACTED}@h/x",
    ]
