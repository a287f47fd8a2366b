"""torch.compile of the engine's model: the `compile` config block and `engine.compile()`.

Where it compiles (`compile_regions`):

* stages 0-2: the whole model's forward, as DeepSpeed does;
* stage 3: parameters are gathered and released by forward hooks, Python that must run between
  compiled regions (traced, a hook would break the graph at every collective). Each repeated
  block (the children of a ``ModuleList``/``Sequential`` that share a class: a transformer's
  layers) is compiled on its own, and stage 3 fetches each block's parameters whole in the
  block's own hooks, outside its compiled code (`Stage3Coordinator.fetch_whole`). What lies
  outside the blocks (embeddings, the head, the loss) runs eagerly. A model without repeated
  blocks has its parameter-holding leaf modules compiled one by one.

How: a region's ``forward`` is replaced, on the instance, by its class's ``forward`` compiled
with ``torch.compile`` and bound to the instance.
Not ``torch.compile(module)``: that wraps the module in an ``OptimizedModule`` whose
state-dict keys start with ``_orig_mod.``. Not ``module.compile()`` (DeepSpeed's way): it
compiles ``_call_impl``, the module's hooks included, and Dynamo skips torch.nn's own classes
(``nn.Sequential``, ``nn.TransformerEncoderLayer``) as top-level frames in torch 2.13, so such
a model would silently not compile at all. Compiling ``forward`` keeps every hook outside the
compiled code and every state-dict key as it was (checkpoints of compiled and plain engines
are the same files).

The step that counts FLOPs for MFU (or runs the flops profiler) runs eagerly
(``torch.compiler.set_stance("force_eager")``): Dynamo refuses to compile under torch's
dispatch modes, and the first compile attempt under one would mark the code never to compile.

`CompileCounts` reads torch's own Dynamo counters: graphs compiled, graph breaks, frames
compiled (a recompilation is one more frame).
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from runtime.config import ConfigError, check_compile_kwargs
from runtime.errors import InvalidValueError, UnsupportedError

__all__ = [
    "CompileCounts",
    "CompileWatch",
    "CompiledModel",
    "compile_model",
    "compile_regions",
    "resolve_backend",
]

log = logging.getLogger("runtime.compile")


def resolve_backend(backend: Any) -> str | Callable:
    """A registered backend name as is, a callable as is, an import path ("pkg.mod.fn") as the
    function it names; anything else is refused naming the backends torch knows."""
    if callable(backend):
        return backend
    known = torch._dynamo.list_backends(exclude_tags=())
    if isinstance(backend, str) and backend in known:
        return backend
    if isinstance(backend, str) and "." in backend:
        module_name, _, attr = backend.rpartition(".")
        try:
            function = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise InvalidValueError(
                f"torch.compile backend {backend!r}: cannot import it ({err}); give a "
                f"registered backend ({', '.join(sorted(known))}) or the import path of a "
                "backend function"
            ) from None
        if callable(function):
            return function
    raise InvalidValueError(
        f"torch.compile backend {backend!r} is not a registered backend "
        f"({', '.join(sorted(known))}) nor the import path of a backend function"
    )


def _repeated_blocks(module: torch.nn.Module) -> list[str]:
    """Names of the repeated blocks: children of a ModuleList/Sequential sharing a class with
    another child there, holding parameters; the search stops at the first such level."""
    found: list[str] = []

    def visit(prefix: str, m: torch.nn.Module) -> None:
        children = list(m.named_children())
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            kinds = collections.Counter(type(c) for _, c in children)
            blocks = [
                n for n, c in children if kinds[type(c)] >= 2 and any(True for _ in c.parameters())
            ]
            if blocks:
                found.extend(prefix + n for n in blocks)
                children = [(n, c) for n, c in children if n not in blocks]
        for n, c in children:
            visit(f"{prefix}{n}.", c)

    visit("", module)
    return found


def _parameter_leaves(module: torch.nn.Module) -> list[str]:
    """Modules holding parameters of their own whose children hold none."""
    return [
        name
        for name, m in module.named_modules()
        if any(p is not None for p in m._parameters.values())
        and not any(True for c in m.children() for _ in c.parameters())
    ]


def compile_regions(module: torch.nn.Module, stage: int) -> list[str]:
    """The module names compiled at ``stage`` ("" is the whole model)."""
    if stage < 3:
        return [""]
    return _repeated_blocks(module) or _parameter_leaves(module)


@dataclass(frozen=True)
class CompileCounts:
    """torch's Dynamo counters (process-wide, since the process started)."""

    graphs: int
    """Graphs compiled (each region's first compile, each recompilation, each graph a graph
    break leaves)."""
    graph_breaks: int
    """Graph breaks met while tracing (each compile of a frame that breaks counts again)."""
    frames: int
    """Python frames Dynamo compiled: first compiles, recompilations and resumed frames."""

    @staticmethod
    def now() -> CompileCounts:
        from torch._dynamo.utils import counters

        return CompileCounts(
            graphs=int(counters["stats"]["unique_graphs"]),
            graph_breaks=int(sum(counters["graph_break"].values())),
            frames=int(counters["frames"]["total"]),
        )


@dataclass
class CompiledModel:
    """What `compile_model` did: the regions, the backend and the arguments."""

    regions: list[str]
    backend: str | Callable
    kwargs: dict[str, Any]


def compile_model(
    module: torch.nn.Module,
    stage: int,
    backend: Any,
    kwargs: Mapping[str, Any],
    fetch_whole: Callable[[list[str]], None] | None,
) -> CompiledModel:
    """Compile ``module``'s regions in place (their ``forward``); ``fetch_whole`` (stage 3)
    makes each region fetch its parameters in its own hooks, outside the compiled code."""
    kwargs = dict(kwargs)
    try:
        check_compile_kwargs(kwargs, "compile_kwargs")
    except ConfigError as err:
        raise InvalidValueError(str(err)) from None
    resolved = resolve_backend(backend)
    regions = compile_regions(module, stage)
    if not regions:
        raise UnsupportedError(
            "torch.compile: the model holds no parameters, so stage 3 has no region to "
            "compile; compile the model in the script (torch.compile) instead"
        )
    modules = dict(module.named_modules())
    if fetch_whole is not None:
        fetch_whole(regions)
    # Regions of one class share one code object, and Dynamo compiles at most recompile_limit
    # (8) variants of it before running it eagerly for good. Blocks that differ by more than
    # their tensors (a Hugging Face layer writes its own slot of the KV cache) each need their
    # own graph: allow one per region.
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, len(regions) + 8)
    compiled: dict[Callable, Callable] = {}  # one compiled function per class's forward
    for name in regions:
        m = modules[name]
        function = type(m).forward
        if function not in compiled:
            compiled[function] = torch.compile(function, backend=resolved, **kwargs)
        # A method bound to the module: a copy of the module (copy.deepcopy, an EMA copy)
        # binds the compiled function to itself, not to this module.
        m.forward = types.MethodType(compiled[function], m)
    config = getattr(module, "config", None)
    if stage == 3 and len(regions) > 1 and getattr(config, "use_cache", False) is True:
        log.warning(
            "torch.compile: this Hugging Face model keeps a KV cache in training "
            "(config.use_cache is true), where each layer writes its own slot: each of the %d "
            "compiled layers gets a graph of its own. Set model.config.use_cache = False "
            "(training does not read the cache) to compile one graph for all of them",
            len(regions),
        )
    return CompiledModel(regions, resolved, kwargs)


def describe_regions(regions: list[str]) -> str:
    """The regions in a few words for the log ("the whole model", "4 blocks: layers.0 ...")."""
    if regions == [""]:
        return "the whole model"
    shown = ", ".join(regions[:3]) + (", ..." if len(regions) > 3 else "")
    return f"{len(regions)} regions ({shown})"


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run compiled code eagerly inside (torch's FLOP counting needs the eager ops)."""
    with torch.compiler.set_stance("force_eager"):
        yield


class CompileWatch:
    """A step hook on rank 0 that says what torch.compile did once it has warmed up (graphs,
    graph breaks), and warns once if it compiles again later: a recompilation every few steps
    (a shape or a Python value that changes) costs more than it saves."""

    WARM_STEPS = 3
    """Optimizer steps after compile(): the first may count FLOPs eagerly, the next compile."""

    def __init__(self, regions: list[str]):
        self.regions = regions
        self.start = CompileCounts.now()
        self.steps = 0
        self.warm: CompileCounts | None = None
        self.warm_step = 0
        self.warned = False

    def after_step(self, engine, outcome) -> None:
        if outcome is None or self.warned:
            return
        self.steps += 1
        if self.steps < self.WARM_STEPS:
            return
        now = CompileCounts.now()
        if self.warm is None:
            self.warm, self.warm_step = now, engine.global_steps
            log.info(
                "torch.compile: %d graph(s), %d graph break(s) for %s",
                now.graphs - self.start.graphs,
                now.graph_breaks - self.start.graph_breaks,
                describe_regions(self.regions),
            )
        elif now.frames != self.warm.frames:
            self.warned = True
            log.warning(
                "torch.compile compiled again at step %d (%d more frame(s) since step %d): "
                "something the compiled code depends on changes between steps; run with "
                "TORCH_LOGS=recompiles to see what",
                engine.global_steps,
                now.frames - self.warm.frames,
                self.warm_step,
            )
