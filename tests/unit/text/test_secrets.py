"""What of argv and the environment is shown and recorded (the redaction rules);
the real command's side is in tests/integration/text/test_secrets.py."""

from __future__ import annotations

import pytest

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


SHAPED = {
    "url-password-with-slash": (
        "postgres://app:pa/ss@db:5432/x",
        "postgres://app:<redacted>@db:5432/x",
    ),
    "url-password-with-at": ("https://u:p@ssw0rd@host/x", "https://u:<redacted>@host/x"),
    "azure-account-key": (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9v+/YmFy==;EndpointSuffix=x",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=<redacted>;EndpointSuffix=x",
    ),
    "sas-sig": (
        "https://a.blob.core.windows.net/c/b?sv=2020-08-04&sr=b&sig=AbC%2Fdef%3D",
        "https://a.blob.core.windows.net/c/b?sv=2020-08-04&sr=b&sig=<redacted>",
    ),
    "slack-webhook": (
        "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXX",
        "https://hooks.slack.com/services/<redacted>",
    ),
    "hf-token": ("hf_" + "AbCdEfGhIj" * 3 + "KlMn", "<redacted>"),
    "hex-key": ("3f9a" * 10, "<redacted>"),
    "script-hf": ("hf_trainer.py", "hf_trainer.py"),
    "script-sk": ("sk-learn-baseline", "sk-learn-baseline"),
    "model-id": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf"),
    "run-name": ("gpt2_medium_lr3e-4_bs32_run2", "gpt2_medium_lr3e-4_bs32_run2"),
}


@pytest.mark.parametrize("case", sorted(SHAPED))
def test_values_are_redacted_by_token_shape_not_word_prefix(case):
    from zlaunch.text.redact import redact_text, shown_env_value

    value, shown = SHAPED[case]
    assert redact_text(value) == shown
    assert shown_env_value("SOME_SETTING", value) == shown


def test_argv_secrets_by_flag_and_shape_and_a_script_path_is_never_one():
    from zlaunch.text.redact import REDACTED, redact_argv

    hexkey = "0123456789abcdef" * 3
    argv = ["python", "-u", "/work/hf_trainer.py", "-t", hexkey, "--hf_tok=abc", "--lr", "0.1"]
    assert redact_argv(argv) == [
        "python", "-u", "/work/hf_trainer.py", "-t", REDACTED, f"--hf_tok={REDACTED}", "--lr", "0.1"
    ]  # fmt: skip


def test_run_json_applies_the_dry_run_rules_on_top_of_its_allow_list():
    from zlaunch.text.redact import NOT_RECORDED, recorded_env_value, shown_env_value

    assert recorded_env_value("NCCL_IB_TOKEN", "s3cr3t") == NOT_RECORDED
    assert shown_env_value("NCCL_IB_TOKEN", "s3cr3t") == "<redacted>"
    assert recorded_env_value("PYTHONPATH", "/a:/b") == "/a:/b"
    url = "https://u:pw@host/simple"
    assert recorded_env_value("PYTHONPATH", url) == shown_env_value("PYTHONPATH", url)
