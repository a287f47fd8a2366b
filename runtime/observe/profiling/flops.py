"""FLOPs of a step, counted as it runs, and `flops_profiler`'s profile in DeepSpeed's layout.

Counts come from torch's own formulas (`torch.utils.flop_counter`): `StepFlops` is a light
dispatch mode summing them (used once per run for MFU), `ModuleProfile` runs torch's
`FlopCounterMode` (FLOPs per module) with forward hooks for each module's latency and for the
forward's share of the count: forward FLOPs and MACs per module, backward FLOPs (the rest of
the step's count: activation recomputation included, it runs), fwd+bwd. Both cover every
micro-batch of the profiled optimizer step, not the optimizer.

Torch's formulas cover the multiply-accumulate ops (matmul, linear, conv, attention), where
one MAC is two FLOPs, so MACs = FLOPs / 2; unlike DeepSpeed's profiler they do not count
element-wise ops (activations, norms, softmax), which are a small share in transformer
layers and make DeepSpeed's "fwd flops" a little larger than 2 x MACs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

__all__ = ["StepFlops", "ModuleProfile", "ModuleRow", "StepTimes", "format_table"]


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
    """Forward and backward FLOPs of the profiled step."""
    forward_s: float
    fwd_flops: int = 0
    extra: str = ""
    """The module's own ``extra_repr()`` (``in_features=4, ...``), as DeepSpeed prints it."""

    @property
    def fwd_macs(self) -> int:
        return self.fwd_flops // 2

    @property
    def bwd_flops(self) -> int:
        return self.flops - self.fwd_flops


@dataclass
class StepTimes:
    """Seconds of the profiled optimizer step's phases (every micro-batch)."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    step_s: float = 0.0
    samples: int = 0
    """Samples this rank ran in the step (micro-batch x accumulation)."""
    world_size: int = 1


class ModuleProfile:
    """FLOPs (FlopCounterMode), the forward's share of them and forward latency (hooks) of
    every module of `root`."""

    def __init__(self, root: torch.nn.Module, sync_cuda: bool = False):
        self.root = root
        self.sync_cuda = sync_cuda
        self.counter = FlopCounterMode(display=False, depth=None)
        self.latency: dict[int, float] = {}
        self.forward_counts: dict[str, int] = {}
        self._at_forward_start: dict[str, int] = {}
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

    def _totals(self) -> dict[str, int]:
        return {k: int(sum(v.values())) for k, v in self.counter.get_flop_counts().items()}

    def _pre(self, module, _args) -> None:
        if module is self.root:  # what the counter holds before this forward
            self._at_forward_start = self._totals()
        self._starts.setdefault(id(module), []).append(self._now())

    def _post(self, module, _args, _out) -> None:
        starts = self._starts.get(id(module))
        if starts:
            key = id(module)
            self.latency[key] = self.latency.get(key, 0.0) + self._now() - starts.pop()
        if module is self.root:  # the forward's share: what it added to every module
            for name, total in self._totals().items():
                added = total - self._at_forward_start.get(name, 0)
                self.forward_counts[name] = self.forward_counts.get(name, 0) + added

    def rows(self) -> list[ModuleRow]:
        """One row per module, in registration (tree) order; the root is depth 0."""
        totals = self._totals()
        prefix = type(self.root).__name__
        rows = []
        for name, module in self.root.named_modules():
            key = prefix if not name else f"{prefix}.{name}"
            params = sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters())
            try:
                extra = module.extra_repr()
            except Exception:  # a module's repr is not worth failing a profile for
                extra = ""
            rows.append(
                ModuleRow(
                    name or "(model)",
                    0 if not name else name.count(".") + 1,
                    type(module).__name__,
                    int(params),
                    int(totals.get(key, 0)),
                    self.latency.get(id(module), 0.0),
                    int(self.forward_counts.get(key, 0)),
                    extra,
                )
            )
        if rows:  # the root: everything counted (an engine around it may rename it in the count)
            rows[0].flops = max(rows[0].flops, self.flops)
            rows[0].fwd_flops = max(rows[0].fwd_flops, self.forward_counts.get("Global", 0))
        return rows


def _num(n: float, unit: str = "") -> str:
    """DeepSpeed's style: 3 significant decimals and a prefix (``6.28 G``, ``336.23 M``)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _dur(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.2f} us"


def _rate(flops: float, seconds: float) -> str:
    return _num(flops / seconds, "FLOPS") if seconds > 0 else "-"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "0.00%"


_RULE = "-" * 26


def format_table(
    rows: list[ModuleRow],
    *,
    step: int,
    times: StepTimes,
    module_depth: int = -1,
    top_modules: int = 1,
    detailed: bool = True,
    mfu: str | None = None,
) -> str:
    """The profile as DeepSpeed's flops profiler prints it: the summary of the step, the top
    modules per depth, and the model tree with each module's numbers."""
    root = rows[0] if rows else ModuleRow("(model)", 0, "Module", 0, 0, 0.0)
    fwd, total = root.fwd_flops, root.flops
    fwd_s, bwd_s = times.forward_s or root.forward_s, times.backward_s
    iter_s = fwd_s + bwd_s + times.step_s
    line = "{:<70}  {}".format
    out = [
        f"{_RULE} zlaunch flops profiler (DeepSpeed's layout) {_RULE}",
        f"Profile Summary at step {step}:",
        "Notations: params (parameters), MACs (multiply-accumulate operations), flops",
        "(floating-point operations), FLOPS (flops per second), fwd/bwd latency (forward/",
        "backward propagation), step (weights update), iter latency (fwd + bwd + step);",
        "every micro-batch of the step is counted",
        "",
        line("world size: ", times.world_size),
        line("samples per GPU in the step: ", times.samples),
        line("params per GPU: ", _num(root.params)),
        line("fwd MACs per GPU: ", _num(root.fwd_macs, "MACs")),
        line("fwd flops per GPU: ", _num(fwd)),
        line("bwd flops per GPU: ", _num(total - fwd)),
        line("fwd+bwd flops per GPU: ", _num(total)),
        line("fwd latency: ", _dur(fwd_s)),
        line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", _rate(fwd, fwd_s)),
    ]
    if bwd_s > 0:
        out += [
            line("bwd latency: ", _dur(bwd_s)),
            line(
                "bwd FLOPS per GPU = bwd flops per GPU / bwd latency: ", _rate(total - fwd, bwd_s)
            ),
            line(
                "fwd+bwd FLOPS per GPU = fwd+bwd flops per GPU / (fwd+bwd latency): ",
                _rate(total, fwd_s + bwd_s),
            ),
            line("step latency: ", _dur(times.step_s)),
            line("iter latency: ", _dur(iter_s)),
            line("FLOPS per GPU = fwd+bwd flops per GPU / iter latency: ", _rate(total, iter_s)),
            line("samples/second: ", f"{times.samples * times.world_size / iter_s:.2f}"),
        ]
    if mfu:
        out.append(line("MFU: ", mfu))
    shown = [r for r in rows if module_depth < 0 or r.depth <= module_depth]
    out += ["", f"{_RULE} Aggregated Profile per GPU {_RULE}"]
    out.append("Top modules in terms of params, MACs or fwd latency at different model depths:")
    for depth in sorted({r.depth for r in shown}):
        at = [r for r in shown if r.depth == depth]

        def top(key, fmt, at=at):
            picked = sorted(at, key=key, reverse=True)[:top_modules]
            return "{" + ", ".join(f"'{r.name}': '{fmt(r)}'" for r in picked) + "}"

        out += [
            f"depth {depth}:",
            f"    params      - {top(lambda r: r.params, lambda r: _num(r.params))}",
            f"    MACs        - {top(lambda r: r.fwd_macs, lambda r: _num(r.fwd_macs, 'MACs'))}",
            f"    fwd latency - {top(lambda r: r.forward_s, lambda r: _dur(r.forward_s))}",
        ]
    if detailed:
        out += [
            "",
            f"{_RULE} Detailed Profile per GPU {_RULE}",
            "Each module profile is listed after its name in the following order:",
            "params, percentage of total params, MACs, percentage of total MACs, fwd latency,",
            "percentage of total fwd latency, fwd FLOPS, fwd flops, bwd flops",
            "",
        ]
        out += _tree(shown, root)
    out.append("-" * 78)
    return "\n".join(out)


def _tree(rows: list[ModuleRow], root: ModuleRow) -> list[str]:
    """The modules as ``print(model)`` shows them, each with its numbers (DeepSpeed's detailed
    profile)."""

    def numbers(r: ModuleRow) -> str:
        items = [
            f"{_num(r.params)} = {_pct(r.params, root.params)} Params",
            f"{_num(r.fwd_macs, 'MACs')} = {_pct(r.fwd_macs, root.fwd_macs)} MACs",
            f"{_dur(r.forward_s)} = {_pct(r.forward_s, root.forward_s)} latency",
            _rate(r.fwd_flops, r.forward_s),
            f"fwd {_num(r.fwd_flops)}",
            f"bwd {_num(r.bwd_flops)}",
        ]
        return ", ".join(items + ([r.extra] if r.extra else []))

    out: list[str] = []
    open_parents: list[int] = []  # depths of the modules whose ")" is still to come
    for i, r in enumerate(rows):
        while open_parents and open_parents[-1] >= r.depth:
            out.append("  " * open_parents.pop() + ")")
        pad = "  " * r.depth
        label = r.kind if r.depth == 0 else f"({r.name.rsplit('.', 1)[-1]}): {r.kind}"
        if i + 1 < len(rows) and rows[i + 1].depth > r.depth:
            out += [f"{pad}{label}(", f"{pad}  {numbers(r)},"]
            open_parents.append(r.depth)
        else:
            out.append(f"{pad}{label}({numbers(r)})")
    while open_parents:
        out.append("  " * open_parents.pop() + ")")
    return out
