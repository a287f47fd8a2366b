"""FLOPs of a step, counted as it runs, and `flops_profiler`'s per-module table.

Counts come from torch's own formulas (`torch.utils.flop_counter`): `StepFlops` is a light
dispatch mode summing them (used once per run for MFU), `ModuleProfile` runs torch's
`FlopCounterMode` (FLOPs per module, forward and backward) with forward hooks for each
module's latency. Both cover every micro-batch of the profiled optimizer step, forward and
backward (activation recomputation included: it runs), not the optimizer.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

__all__ = ["StepFlops", "ModuleProfile", "ModuleRow", "format_table"]


class StepFlops(TorchDispatchMode):
    """Sums the FLOPs of every op with a formula in torch's flop registry."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            self.flops += int(count(*args, **kwargs, out_val=out))
        return out


@dataclass
class ModuleRow:
    name: str
    depth: int
    kind: str
    params: int
    flops: int
    forward_s: float


class ModuleProfile:
    """FLOPs (FlopCounterMode) and forward latency (hooks) of every module of `root`."""

    def __init__(self, root: torch.nn.Module, sync_cuda: bool = False):
        self.root = root
        self.sync_cuda = sync_cuda
        self.counter = FlopCounterMode(display=False, depth=None)
        self.latency: dict[int, float] = {}
        self._starts: dict[int, list[float]] = {}
        self._hooks: list = []

    @property
    def flops(self) -> int:
        return int(self.counter.get_total_flops())

    def __enter__(self) -> ModuleProfile:
        for module in self.root.modules():
            self._hooks.append(module.register_forward_pre_hook(self._pre))
            self._hooks.append(module.register_forward_hook(self._post))
        self.counter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.counter.__exit__(*exc)
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def _now(self) -> float:
        if self.sync_cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _pre(self, module, _args) -> None:
        self._starts.setdefault(id(module), []).append(self._now())

    def _post(self, module, _args, _out) -> None:
        starts = self._starts.get(id(module))
        if starts:
            key = id(module)
            self.latency[key] = self.latency.get(key, 0.0) + self._now() - starts.pop()

    def rows(self) -> list[ModuleRow]:
        """One row per module, in registration (tree) order; the root is depth 0."""
        counts = self.counter.get_flop_counts()
        prefix = type(self.root).__name__
        rows = []
        for name, module in self.root.named_modules():
            key = prefix if not name else f"{prefix}.{name}"
            flops = sum(counts.get(key, {}).values())
            params = sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters())
            rows.append(
                ModuleRow(
                    name or "(model)",
                    0 if not name else name.count(".") + 1,
                    type(module).__name__,
                    int(params),
                    int(flops),
                    self.latency.get(id(module), 0.0),
                )
            )
        if rows:
            rows[0].flops = max(rows[0].flops, self.flops)
        return rows


def _num(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def _columns(row: ModuleRow, total_flops: int, step_s: float) -> list[str]:
    share = 100.0 * row.flops / total_flops if total_flops else 0.0
    of_step = 100.0 * row.forward_s / step_s if step_s > 0 else 0.0
    return [
        _num(row.params),
        _num(row.flops),
        f"{share:.1f}%",
        f"{row.forward_s * 1e3:.2f}",
        f"{of_step:.1f}%",
    ]


_HEADERS = ["params", "FLOPs (fwd+bwd)", "% FLOPs", "fwd ms", "% of step"]


def format_table(
    rows: list[ModuleRow],
    *,
    step: int,
    step_s: float,
    module_depth: int = -1,
    top_modules: int = 1,
    detailed: bool = True,
    rich: bool | None = None,
) -> str | object:
    """The profile as plain text, or as a rich renderable when `rich` (default: stdout is a
    terminal and rich is installed)."""
    total = rows[0].flops if rows else 0
    params = rows[0].params if rows else 0
    head = (
        f"flops profiler: step {step} | params {_num(params)} | FLOPs {_num(total)} (fwd+bwd, "
        f"this rank) | step {step_s * 1e3:.1f} ms | {total / step_s / 1e12 if step_s else 0:.3g}"
        " TFLOP/s"
    )
    shown = [r for r in rows if module_depth < 0 or r.depth <= module_depth]
    top: list[tuple[int, list[ModuleRow]]] = []
    for depth in sorted({r.depth for r in shown if r.depth > 0}):
        at = sorted((r for r in shown if r.depth == depth), key=lambda r: -r.flops)
        top.append((depth, at[:top_modules]))
    table = _Table(head, top, top_modules, shown if detailed else None, total, step_s)
    if rich is None:
        rich = sys.stdout.isatty()
    if rich:
        try:
            return table.rich()
        except ImportError:
            pass
    return table.plain()


def _label(row: ModuleRow) -> str:
    """The module's own name, indented by its depth, with its class."""
    name = row.name.rsplit(".", 1)[-1] if row.depth else row.name
    return "  " * row.depth + f"{name} ({row.kind})"


@dataclass
class _Table:
    """What `format_table` shows, ready to be drawn as text or with rich."""

    head: str
    top: list[tuple[int, list[ModuleRow]]]
    top_modules: int
    detail: list[ModuleRow] | None
    """Every module shown, in tree order; None without the per-module table."""
    total_flops: int
    step_s: float

    def plain(self) -> str:
        lines = [self.head, "", f"top {self.top_modules} module(s) by FLOPs per depth:"]
        for depth, picked in self.top:
            names = ", ".join(f"{r.name} {_num(r.flops)}" for r in picked)
            lines.append(f"  depth {depth}: {names}")
        if self.detail is not None:
            labels = [_label(r) for r in self.detail]
            width = max([len(x) for x in labels] + [6])
            lines += ["", f"{'module':<{width}}  " + "  ".join(f"{h:>15}" for h in _HEADERS)]
            for label, r in zip(labels, self.detail, strict=True):
                cols = _columns(r, self.total_flops, self.step_s)
                lines.append(f"{label:<{width}}  " + "  ".join(f"{c:>15}" for c in cols))
        return "\n".join(lines)

    def rich(self) -> object:
        """ImportError without rich."""
        from rich.console import Group
        from rich.table import Table

        summary = Table(title=f"top {self.top_modules} module(s) by FLOPs per depth")
        for col in ["depth", "module", *_HEADERS]:
            summary.add_column(col, justify="left" if col == "module" else "right")
        for depth, picked in self.top:
            for r in picked:
                summary.add_row(str(depth), r.name, *_columns(r, self.total_flops, self.step_s))
        parts: list = [summary]
        if self.detail is not None:
            tree = Table(title="per module")
            for col in ["module", *_HEADERS]:
                tree.add_column(col, justify="left" if col == "module" else "right")
            for r in self.detail:
                tree.add_row(_label(r), *_columns(r, self.total_flops, self.step_s))
            parts.append(tree)
        return Group(self.head, *parts)
