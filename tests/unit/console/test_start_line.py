"""While agents start: the live panel holds one line saying who has answered, updated in place
and gone once every agent is in; a plain console prints it as a note."""

from __future__ import annotations

import io

from rich.console import Console as RichConsole

from zlaunch.console.live_view import LiveView, PlainView
from zlaunch.console.terminal import Console

STARTING = "agents: 41/64 answered; starting: 127.0.1.2, 127.0.1.9 (+21)"


def _panel(view: LiveView) -> str:
    out = io.StringIO()
    RichConsole(file=out, width=120, color_system=None).print(view._panel())
    return out.getvalue()


def test_the_panel_shows_the_starting_agents_until_all_answered():
    view = LiveView(Console(color=False, out=io.BytesIO(), err=io.StringIO()), io.StringIO())
    try:
        assert "answered" not in _panel(view)
        view.starting("agents: 40/64 answered; starting: 127.0.1.2 (+23)")
        view.starting(STARTING)
        panel = _panel(view)
        assert STARTING in panel and "40/64" not in panel  # one line, updated
        view.starting("")
        assert "answered" not in _panel(view)
    finally:
        view.close()


def test_a_plain_console_says_it_as_a_note():
    err = io.StringIO()
    PlainView(Console(color=False, out=io.BytesIO(), err=err)).starting(STARTING)
    assert err.getvalue() == f"zlaunch: {STARTING}\n"
