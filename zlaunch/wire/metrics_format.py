"""A metrics event as text: the one line ranks log and the controller prints, and its pieces.

Ranks log ``step 10/100 | loss 2.304 | lr 0.001 | ...`` when no zlaunch controller listens
(`runtime.observe.metrics`); the controller prints the same fields with its own separator
(``zlaunch: step 10/100  loss 2.304  ...``, `zlaunch status`) and draws its live panel with
the number formats and the wall-clock split below. Standard library only: zlaunch imports
it without torch.

The split: per report step the runtime measures ``time_forward``, ``time_backward``,
``time_step`` and the waits inside them, ``time_reduce_wait`` (inside backward) and
``time_allgather_wait`` (inside forward and backward). `split` takes the waits out of the
phases that hold them, so the parts add up to the measured step.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "META_KEYS",
    "PARTS",
    "breakdown_text",
    "format_line",
    "human_bytes",
    "mfu_text",
    "number",
    "rate",
    "split",
]

META_KEYS = ("kind", "source", "step", "time", "rank", "host")
"""Keys of an event that say where and when it comes from, not what was measured."""

PARTS = (
    ("forward", "fwd"),
    ("backward", "bwd"),
    ("reduce_wait", "reduce wait"),
    ("allgather_wait", "gather wait"),
    ("step", "step"),
)
"""(key of `split`, label) of each part of a step, in the order they are shown."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(value: Any, spec: str = ".4g") -> str:
    """A float in ``spec``, anything else as it prints, None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def human_bytes(value: Any) -> str:
    """``3.0 GiB``, ``5.0 MiB``, ``512 B``; ``-`` when not a number."""
    if not _is_number(value):
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def rate(value: Any) -> str:
    """A per-second count: ``256.0``, ``32.8k``, ``1.20M``; ``-`` when not a number."""
    if not _is_number(value):
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.1f}"


def split(event: dict[str, Any], prefix: str = "") -> dict[str, float] | None:
    """Seconds per part (`PARTS` order), adding up to forward + backward + step; None when the
    event has no breakdown. The all-gather wait is not split between forward and backward by
    the runtime, so it comes out of backward first, then forward."""
    values = {k: event.get(f"{prefix}time_{k}") for k, _ in PARTS}
    if not all(_is_number(v) for v in values.values()):
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


def mfu_text(event: dict[str, Any]) -> str | None:
    """``MFU 39.5%  123 TFLOP/s per device  (peak: ...)``; None without a FLOP count."""
    tflops = event.get("tflops")
    if not _is_number(tflops):
        return None
    text = f"{tflops:.3g} TFLOP/s per device"
    if _is_number(event.get("mfu")):
        text = f"MFU {event['mfu'] * 100:.3g}%  " + text
    if event.get("peak_source"):
        text += f"  (peak: {event['peak_source']})"
    return text


def _breakdown_parts(event: dict[str, Any]) -> list[str]:
    parts = split(event)
    pieces = []
    if parts is not None:
        pieces.append(" ".join(f"{label} {parts[k] * 1000:.1f}ms" for k, label in PARTS))
        if event.get("straggler"):
            pieces.append(f"slowest {event['straggler']}")
    mfu = mfu_text(event)
    if mfu:
        pieces.append(mfu)
    return pieces


def breakdown_text(event: dict[str, Any], sep: str = "  ") -> str | None:
    """The split in ms, the slowest rank, MFU; None when the event has none of them."""
    return sep.join(_breakdown_parts(event)) or None


def _engine_parts(event: dict[str, Any]) -> list[str]:
    step = f"step {event.get('step')}"
    if event.get("total_steps"):
        step += f"/{event['total_steps']}"
    parts = [
        step,
        f"loss {number(event.get('loss'))}",
        f"lr {number(event.get('lr'))}",
        f"grad norm {number(event.get('grad_norm'))}",
        f"loss scale {number(event.get('loss_scale'), 'g')}",
        f"skipped {number(event.get('skipped_steps'))}",
    ]
    if _is_number(event.get("step_time")):
        parts.append(f"step time {event['step_time'] * 1000:.1f} ms")
    parts.append(f"samples/s {rate(event.get('samples_per_s'))}")
    if event.get("tokens_per_s") is not None:
        parts.append(f"tokens/s {rate(event['tokens_per_s'])}")
    parts.append(f"{event.get('memory_kind') or 'mem'} {human_bytes(event.get('memory_bytes'))}")
    parts.append(f"comm {human_bytes(event.get('comm_bytes'))}")
    if event.get("slow"):  # the controller's straggler scores (zlaunch/launcher/stragglers.py)
        parts.append(str(event["slow"]))
    return parts + _breakdown_parts(event)


def format_line(event: dict[str, Any], sep: str = " | ") -> str:
    """One metrics event as one line: the engine's numbers, or the script's own values."""
    if event.get("source") == "user":
        values = sep.join(f"{k} {number(v)}" for k, v in event.items() if k not in META_KEYS)
        return f"step {event.get('step')}{sep}{values}"
    return sep.join(_engine_parts(event))
