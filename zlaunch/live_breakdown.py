"""The wall-clock split and MFU of a metrics event, for the live view, the plain view and plot.

The runtime (runtime.profiling) reports per optimizer step: ``time_forward``,
``time_backward``, ``time_reduce_wait`` (inside backward), ``time_allgather_wait`` (inside
forward and backward), ``time_step``, the same for the slowest rank, the ``straggler``, and
``tflops`` / ``mfu`` / ``peak_source``. `split` turns the five times into parts that add up
to the measured total, waits taken out of the phase that holds them. rich is imported only
by `renderables`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PARTS", "BreakdownPanel", "split", "breakdown_text", "renderables"]

# (key in split(), label, rich colour)
PARTS = (
    ("forward", "fwd", "blue"),
    ("backward", "bwd", "dark_orange"),
    ("reduce_wait", "reduce wait", "red"),
    ("allgather_wait", "gather wait", "magenta"),
    ("step", "step", "green"),
)
BAR_WIDTH = 40


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def split(event: dict[str, Any], prefix: str = "") -> dict[str, float] | None:
    """Seconds per part (PARTS order), adding up to forward + backward + step; None when the
    event has no breakdown. The all-gather wait is not split between forward and backward by
    the runtime, so it comes out of backward first, then forward."""
    keys = ("forward", "backward", "reduce_wait", "allgather_wait", "step")
    values = {k: event.get(f"{prefix}time_{k}") for k in keys}
    if not all(_number(v) for v in values.values()):
        return None
    backward = max(values["backward"] - values["reduce_wait"], 0.0)
    gather = values["allgather_wait"]
    from_backward = min(gather, backward)
    forward = max(values["forward"] - (gather - from_backward), 0.0)
    return {
        "forward": forward,
        "backward": backward - from_backward,
        "reduce_wait": max(values["reduce_wait"], 0.0),
        "allgather_wait": max(gather, 0.0),
        "step": max(values["step"], 0.0),
    }


def _mfu_text(event: dict[str, Any]) -> str | None:
    tflops = event.get("tflops")
    if not _number(tflops):
        return None
    text = f"{tflops:.3g} TFLOP/s per device"
    if _number(event.get("mfu")):
        text = f"MFU {event['mfu'] * 100:.3g}%  " + text
    if event.get("peak_source"):
        text += f"  (peak: {event['peak_source']})"
    return text


def breakdown_text(event: dict[str, Any]) -> str | None:
    """One plain line: the split in ms, the straggler, MFU; None when there is nothing."""
    parts = split(event)
    pieces = []
    if parts is not None:
        pieces.append(" ".join(f"{label} {parts[k] * 1000:.1f}ms" for k, label, _ in PARTS))
        if event.get("straggler"):
            pieces.append(f"slowest {event['straggler']}")
    mfu = _mfu_text(event)
    if mfu:
        pieces.append(mfu)
    return "  ".join(pieces) or None


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
    mfu = _mfu_text(event)
    if mfu:
        out.append(Text(mfu))
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
        return renderables(self.last) if self.last else []
