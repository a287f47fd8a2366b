"""The live panel's slow line: drawn while the controller says a host is slow, gone after."""

from __future__ import annotations

import io

from rich.console import Console as RichConsole

from zlaunch.console.live_view import LiveView
from zlaunch.console.terminal import Console

SLOW = "slow: node7 at 1.38x the median step, ranks 56-63"


def _panel(view: LiveView) -> str:
    out = io.StringIO()
    RichConsole(file=out, width=120, color_system=None).print(view._panel())
    return out.getvalue()


def test_the_panel_shows_the_slow_hosts_until_they_recover():
    view = LiveView(Console(color=False, out=io.BytesIO(), err=io.StringIO()), io.StringIO())
    try:
        view.start("run-x", {"node7": 8})
        row = {"kind": "metrics", "source": "engine", "step": 30, "report": False}
        view.metrics(0, "node0", row)
        assert "slow:" not in _panel(view)
        # once said, the controller puts the field on every row: the text, None once recovered
        view.metrics(0, "node0", {**row, "step": 31, "slow": SLOW})
        view.metrics(0, "node0", {**row, "step": 32, "slow": SLOW})
        assert SLOW in _panel(view)
        view.metrics(0, "node0", {**row, "step": 90, "slow": None})
        assert "slow:" not in _panel(view)
    finally:
        view.close()
