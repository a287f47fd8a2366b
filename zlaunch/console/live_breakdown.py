"""The wall-clock split and MFU of a metrics event, drawn: a coloured bar for the live panel.

The runtime (runtime.observe.profiling) reports per optimizer step: ``time_forward``,
``time_backward``, ``time_reduce_wait`` (inside backward), ``time_allgather_wait`` (inside
forward and backward), ``time_step``, the same for the slowest rank, the ``straggler``, and
``tflops`` / ``mfu`` / ``peak_source``. The split into parts that add up to the measured step,
and its text, are `zlaunch.wire.metrics_format`'s (re-exported here for the plot and the views);
this module gives each part a colour. rich is imported only by `renderables`.
"""

from __future__ import annotations

from typing import Any

from zlaunch.wire import PARTS as LABELS
from zlaunch.wire import breakdown_text, mfu_text, split

__all__ = ["PARTS", "BreakdownPanel", "split", "breakdown_text", "renderables"]

_COLOURS = {
    "forward": "blue",
    "backward": "dark_orange",
    "reduce_wait": "red",
    "allgather_wait": "magenta",
    "step": "green",
}
PARTS = tuple((key, label, _COLOURS[key]) for key, label in LABELS)
"""(key in split(), label, rich colour) of each part, in the order they are shown."""
BAR_WIDTH = 40


def _bar_cells(parts: dict[str, float], width: int) -> list[tuple[str, int]]:
    """(colour, cells) per part, cells adding up to `width` (largest remainders)."""
    total = sum(parts.values())
    if total <= 0:
        return []
    exact = [(color, parts[key] / total * width) for key, _, color in PARTS]
    cells = [int(x) for _, x in exact]
    order = sorted(range(len(exact)), key=lambda i: exact[i][1] - cells[i], reverse=True)
    for i in order[: width - sum(cells)]:
        cells[i] += 1
    return [(color, n) for (color, _), n in zip(exact, cells, strict=True) if n]


def renderables(event: dict[str, Any]) -> list[Any]:
    """rich lines for the live panel: the split as a coloured bar with its legend, the
    straggler, MFU. Empty when the event has none of them."""
    from rich.text import Text

    out: list[Any] = []
    parts = split(event)
    if parts is not None:
        bar = Text()
        for color, cells in _bar_cells(parts, BAR_WIDTH):
            bar.append("█" * cells, style=color)
        bar.append("  ")
        for key, label, color in PARTS:
            bar.append(f"{label} {parts[key] * 1000:.1f}ms ", style=color)
        out.append(bar)
        if event.get("straggler"):
            slow = split(event, "slowest_")
            total = sum(slow.values()) * 1000 if slow else None
            line = Text("slowest rank: ")
            line.append(str(event["straggler"]), style="bold yellow")
            if total is not None:
                line.append(f"  {total:.1f} ms per step vs rank 0 {sum(parts.values()) * 1000:.1f}")
            out.append(line)
    mfu = mfu_text(event)
    if mfu:
        out.append(Text(mfu))
    if event.get("slow"):  # the controller's straggler scores: "slow: node7 at 1.38x ..."
        out.append(Text(str(event["slow"]), style="bold yellow"))
    return out


class BreakdownPanel:
    """The live panel's rows, kept between report steps: metrics arrive every step but the
    breakdown only with report steps, so the last one stays on screen until the next."""

    def __init__(self) -> None:
        self.last: dict[str, Any] = {}

    def rows(self, event: dict[str, Any] | None) -> list[Any]:
        keep = ("straggler", "tflops", "mfu", "peak_source")
        for key, value in (event or {}).items():
            if value is not None and (key.startswith(("time_", "slowest_")) or key in keep):
                self.last[key] = value
        if event and "slow" in event:  # on every step, None once it recovered
            self.last["slow"] = event["slow"]
        return renderables(self.last) if self.last else []
