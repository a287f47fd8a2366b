"""The live view in a real terminal: a 2-rank runtime job inside tmux (120x40), pane captured
while it runs and after it ended. Rank lines must scroll whole above one pinned panel.
"""

from __future__ import annotations

import shutil

import pytest

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]

TOP, BOTTOM = "╭─ zlaunch ", "╰"


def tmux(session: str) -> list[str]:
    """tmux on a server of this test's own (-L), untouched by any other tmux user."""
    return ["tmux", "-L", session]


def test_panel_tells_lost_ranks_from_failed_ones():
    """Ranks of a host whose agent connection broke are "lost" (how they ended is unknown),
    not failed with some exit code; the host counts them as not alive."""
    import io

    from rich.console import Console as RichConsole

    from zlaunch.console.live_view import LiveView
    from zlaunch.console.terminal import Console

    view = LiveView(Console(color=False, out=io.BytesIO(), err=io.StringIO()), io.StringIO())
    try:
        view.start("run-x", {"node1": 2, "node2": 2})
        for rank in range(4):
            view.rank_started(rank, "node1" if rank < 2 else "node2")
        view.rank_exited(1, "node1", 137)
        view.rank_lost(2, "node2")
        view.rank_lost(3, "node2")
        out = io.StringIO()
        RichConsole(file=out, width=120, color_system=None).print(view._panel())
        text = out.getvalue()
    finally:
        view.close()
    assert "failed ranks: 1 " in text and "lost ranks: 2-3" in text, text
    assert "node1 1/2" in text and "node2 0/2" in text, text
