"""A rank cannot drive the terminal through the console: its control characters are shown as
visible escapes, its colours stay colours on a colour console, and the rank log keeps every
byte (pure: a Console over a bytes buffer)."""

from __future__ import annotations

import io

import pytest

from zlaunch.commands.logs import _Printer
from zlaunch.console.safe_text import shown, shown_block
from zlaunch.console.terminal import Console, format_failure
from zlaunch.rundir.records import Failure, FailureReport
from zlaunch.wire.frames import line_text

ERASE_AND_FORGE = "\x1b[1A\x1b[2K[node1:0] loss 0.01"


@pytest.mark.parametrize(
    ("raw", "plain", "colour"),
    [
        ("loss 0.5\tok", "loss 0.5\tok", "loss 0.5\tok"),  # a tab is text
        (ERASE_AND_FORGE, "\\x1b[1A\\x1b[2K[node1:0] loss 0.01", "\\x1b[1A\\x1b[2K[node1:0] loss 0.01"),
        ("a\rb", "a\\x0db", "a\\x0db"),
        ("bell\x07 bs\x08 del\x7f nul\x00", "bell\\x07 bs\\x08 del\\x7f nul\\x00", None),
        ("csi\x9b2J nel\x85", "csi\\x9b2J nel\\x85", None),  # C1, as characters
        ("evil\u202etxt.exe \u2066x\u2069", "evil\\u202etxt.exe \\u2066x\\u2069", None),  # bidi
        ("sep\u2028x", "sep\\u2028x", None),
        (line_text(b"bad \xff\x9b byte"), "bad \\xff\\x9b byte", None),  # not UTF-8
        ("\x1b[32mINFO\x1b[0m done", "INFO done", "\x1b[32mINFO\x1b[0m done\x1b[0m"),
        ("\x1b[1;38;5;208mhot\x1b[m", "hot", "\x1b[1;38;5;208mhot\x1b[m\x1b[0m"),
        ("\x1b[38;2;10;20;30mrgb", "rgb", "\x1b[38;2;10;20;30mrgb\x1b[0m"),
        ("\x1b[8mhidden", "\\x1b[8mhidden", None),  # conceal hides text: escaped
        ("\x1b[38;5;999mx", "\\x1b[38;5;999mx", None),
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07", None),  # OSC: sets the window title
        ("über naïve 日本", "über naïve 日本", "über naïve 日本"),  # text stays text
    ],
)  # fmt: skip
def test_control_characters_are_escaped_and_colours_kept_only_in_colour(raw, plain, colour):
    assert shown(raw) == plain
    assert shown(raw, color=True) == (plain if colour is None else colour)


def test_a_rank_cannot_erase_another_ranks_line_or_forge_a_prefix():
    out = io.BytesIO()
    console = Console(color=False, out=out, err=io.StringIO())
    console.lines("node2", 1, "o", ["loss nan"])
    console.lines("node3", 2, "o", [ERASE_AND_FORGE, "fine"])
    lines = out.getvalue().decode().splitlines()
    assert lines == [
        "[node2:1] loss nan",
        "[node3:2] \\x1b[1A\\x1b[2K[node1:0] loss 0.01",
        "[node3:2] fine",
    ]
    assert b"\x1b" not in out.getvalue()


def test_on_a_colour_console_a_ranks_colour_ends_with_its_line():
    out = io.BytesIO()
    Console(color=True, out=out, err=io.StringIO()).lines("n", 0, "o", ["\x1b[31mred", "next"])
    first, second = out.getvalue().split(b"\n")[:2]
    assert first.endswith(b" \x1b[31mred\x1b[0m") and second.endswith(b"\x1b[0m next")


def test_notes_and_the_failure_report_escape_what_a_rank_wrote():
    err = io.StringIO()
    Console(color=False, out=io.BytesIO(), err=err).note("rank 3 sent op \x1b[2Jx\nsecond line")
    assert err.getvalue() == "zlaunch: rank 3 sent op \\x1b[2Jx\nsecond line\n"
    failure = Failure(
        reason="rank failed", host="n", rank=0, exit_code=1, message="boom \x1b[1A",
        last_lines=("Traceback\x1b[2K", "x"),
    )  # fmt: skip
    report = format_failure(FailureReport("r", 1, "1 failed rank(s)", failure, (failure,)))
    assert "\x1b" not in report and "| Traceback\\x1b[2K" in report and "boom \\x1b[1A" in report
    assert shown_block("a\x07\nb") == "a\\x07\nb"


def test_zlaunch_logs_escapes_too_the_log_file_keeps_the_bytes():
    out = io.BytesIO()
    _Printer(out, None).lines("node3", 2, [b"\x1b[1A\x1b[2K[node1:0] ok", b"\xffraw"])
    assert out.getvalue() == b"[node3:2] \\x1b[1A\\x1b[2K[node1:0] ok\n[node3:2] \\xffraw\n"
