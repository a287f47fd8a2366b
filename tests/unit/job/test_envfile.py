"""Worker env sources: forwarded names, .zlaunch_env / .deepspeed_env files, --env."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlaunch.errors import UsageError
from zlaunch.job.envfile import (
    collect_env,
    env_file_paths,
    forwarded_env,
    load_env_file,
    parse_env_options,
    parse_env_text,
)

HOSTILE = [
    "$(touch /tmp/zlaunch-pwned)",
    "`touch /tmp/zlaunch-pwned`",
    "a; rm -rf /; b",
    "it's \"quoted\" and 'single'",
    "line1\nline2\n",
    "tab\tand\rcarriage",
    "ünïcödé ✓ 日本語 \u2028 \x0c",
    "back\\slash \\n not a newline",
    "  leading and trailing  ",
    "#not a comment",
    "$HOME ${PATH}",
    "",
]


def test_forwarded_names_exactly():
    environ = {
        "PATH": "/bin",
        "LD_LIBRARY_PATH": "/lib",
        "PYTHONPATH": "/py",
        "VIRTUAL_ENV": "/venv",
        "NCCL_DEBUG": "INFO",
        "GLOO_SOCKET_IFNAME": "eth0",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "CUDA_LAUNCH_BLOCKING": "1",
        "OMP_NUM_THREADS": "4",
        "PYTHONHASHSEED": "0",
        "HF_HOME": "/hf",
        # not forwarded:
        "HOME": "/root",
        "USER": "root",
        "MY_NCCL_THING": "x",
        "nccl_lower": "x",
        "LD_PRELOAD": "/evil.so",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "TERM": "xterm",
    }
    assert forwarded_env(environ) == {
        k: environ[k]
        for k in (
            "PATH",
            "LD_LIBRARY_PATH",
            "PYTHONPATH",
            "VIRTUAL_ENV",
            "NCCL_DEBUG",
            "GLOO_SOCKET_IFNAME",
            "TORCH_DISTRIBUTED_DEBUG",
            "CUDA_LAUNCH_BLOCKING",
            "OMP_NUM_THREADS",
            "PYTHONHASHSEED",
            "HF_HOME",
        )
    }


def test_grammar():
    text = (
        "# a comment\n"
        "\n"
        "PLAIN=value\n"
        "export EXPORTED=1\n"
        "export\tTABBED=2\n"
        "  SPACED = spaced value  \n"
        "TRAILING=abc # a comment\n"
        "HASH=a#b\n"
        "EMPTY=\n"
        "EQUALS=a=b=c\n"
        'DQ="a \\"b\\" \\\\ \\n \\t \\$x \\` \\q"\n'
        "SQ='no $expansion \\n here, but \\' and \\\\'\n"
        'QUOTED_THEN_COMMENT="x y"   # comment\n'
        'MULTI="first\n'
        'second"\n'
        "SQMULTI='a\n"
        "\n"
        "b'\n"
        "PLAIN=later wins\n"
    )
    assert parse_env_text(text) == {
        "PLAIN": "later wins",
        "EXPORTED": "1",
        "TABBED": "2",
        "SPACED": "spaced value",
        "TRAILING": "abc",
        "HASH": "a#b",
        "EMPTY": "",
        "EQUALS": "a=b=c",
        "DQ": 'a "b" \\ \n \t $x ` \\q',
        "SQ": "no $expansion \\n here, but ' and \\",
        "QUOTED_THEN_COMMENT": "x y",
        "MULTI": "first\nsecond",
        "SQMULTI": "a\n\nb",
    }


def test_crlf_file(tmp_path):
    path = tmp_path / ".zlaunch_env"
    path.write_bytes(b"A=1\r\nB='x'\r\n")
    assert load_env_file(path) == {"A": "1", "B": "x"}


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("A=1\nJUSTAWORD\n", 2, "expected KEY=VALUE, got 'JUSTAWORD'"),
        ("1A=x\n", 1, "bad variable name '1A'"),
        ("\n\nA-B=x\n", 3, "bad variable name 'A-B'"),
        ("=x\n", 1, "bad variable name ''"),
        ("export =x\n", 1, "bad variable name ''"),
        ('A=1\nB="open\nstill open\n', 2, 'the " quote opened here is never closed'),
        ("A='x\n", 1, "the ' quote opened here is never closed"),
        ('A="x" y\n', 1, "unexpected text after the closing quote of A: 'y'"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, text, line, words):
    path = tmp_path / ".zlaunch_env"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        load_env_file(path)
    assert info.value.exit_code == 2
    assert info.value.message.startswith(f"{path}:{line}: "), info.value.message
    assert words in info.value.message
    assert info.value.hint


def test_unreadable_env_file(tmp_path):
    path = tmp_path / ".zlaunch_env"
    path.write_bytes(b"A=\xff\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        load_env_file(path)


def _double_quoted(value: str) -> str:
    escaped = (
        value.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("$", "\\$")
        .replace("`", "\\`")
        .replace("\r", "\\r")
    )
    return f'"{escaped}"'


def _single_quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_survive_byte_for_byte(tmp_path, value):
    # Double quotes with escapes, literal newlines inside quotes, and single quotes.
    text = f"DQ={_double_quoted(value)}\nexport SQ={_single_quoted(value)}\nAFTER=ok\n"
    parsed = parse_env_text(text)
    assert parsed["DQ"] == value
    assert parsed["SQ"] == value
    assert parsed["AFTER"] == "ok"


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40
    )
)
def test_any_text_round_trips_through_double_quotes(value):
    # Every text but NUL, which no environment can hold (refused: tests/integration/hardening).
    assert parse_env_text(f"export K={_double_quoted(value)}  # c\n") == {"K": value}


def test_nothing_is_executed(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    (tmp_path / ".zlaunch_env").write_text(
        f'A=$(touch {marker})\nB=`touch {marker}`\nC="$(touch {marker})"\n'
    )
    env = collect_env({}, cwd=str(tmp_path), home=None, env_options=[f"D=$(touch {marker})"])
    assert env == {
        "A": f"$(touch {marker})",
        "B": f"`touch {marker}`",
        "C": f"$(touch {marker})",
        "D": f"$(touch {marker})",
    }
    assert not marker.exists()


def test_env_options():
    environ = {"FROM_ENV": "x y\nz", "EMPTY": ""}
    assert parse_env_options(["A=1", "B=", "C=a=b", "FROM_ENV", "EMPTY", "A=2"], environ) == {
        "A": "2",
        "B": "",
        "C": "a=b",
        "FROM_ENV": "x y\nz",
        "EMPTY": "",
    }
    with pytest.raises(UsageError) as info:
        parse_env_options(["MISSING"], environ)
    assert info.value.message == "--env MISSING: MISSING is not set in this environment"
    assert info.value.hint == "set it first, or give the value: --env MISSING=VALUE"
    with pytest.raises(UsageError, match="bad variable name '1X'"):
        parse_env_options(["1X=2"], environ)
    with pytest.raises(UsageError, match="bad variable name ''"):
        parse_env_options(["=2"], environ)


def test_precedence(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    cwd.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_X=home-ds\nA=home-ds\nB=home-ds\nC=home-ds\n")
    (home / ".zlaunch_env").write_text("A=home-z\nB=home-z\nC=home-z\n")
    (cwd / ".deepspeed_env").write_text("B=cwd-ds\nC=cwd-ds\nD=cwd-ds\n")
    (cwd / ".zlaunch_env").write_text("C=cwd-z\nD=cwd-z\n")
    environ = {"NCCL_X": "controller", "NCCL_Y": "controller", "E": "controller-unforwarded"}
    env = collect_env(environ, cwd=str(cwd), home=str(home), env_options=["D=option", "E"])
    assert env == {
        "NCCL_X": "home-ds",  # any file beats the forwarded environment
        "NCCL_Y": "controller",
        "A": "home-z",  # .zlaunch_env beats .deepspeed_env in the same directory
        "B": "cwd-ds",  # the project's files beat the home directory's
        "C": "cwd-z",
        "D": "option",  # --env beats every file
        "E": "controller-unforwarded",  # --env KEY copies from the controller
    }
    assert env_file_paths(str(cwd), str(home)) == [
        str(home / ".deepspeed_env"),
        str(home / ".zlaunch_env"),
        str(cwd / ".deepspeed_env"),
        str(cwd / ".zlaunch_env"),
    ]


def test_home_is_cwd_read_once_and_missing_files_skipped(tmp_path):
    (tmp_path / ".zlaunch_env").write_text("A=1\n")
    assert env_file_paths(str(tmp_path), str(tmp_path)) == [str(tmp_path / ".zlaunch_env")]
    assert env_file_paths(str(tmp_path / "nowhere"), None) == []
    assert collect_env({"HOME": "/root"}, cwd=str(tmp_path), home=str(tmp_path)) == {"A": "1"}
