"""Where stage 3 hooks the model: which module fetches which units, and the hooks registered.

A module fetches the units of the parameters it holds directly (a tied weight: every module
holding it); a leaf module (`leaf_modules`) fetches its whole subtree's units, and the modules
inside a leaf fetch nothing of their own (the leaf did). A module fetched *whole* (a region
compiled with torch.compile, `runtime.engine.torch_compile.compile_regions`) likewise fetches every unit of its
subtree, so that no hook runs inside the compiled code. Persistent units are always gathered,
so no hook fetches them.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from typing import Protocol

import torch

from .units import Unit

__all__ = ["HookHandlers", "install_hooks", "tensors_in", "unit_owners"]


class HookHandlers(Protocol):
    """What the hooks call (`Stage3Coordinator` implements it)."""

    def begin_pass(self, module, args) -> None: ...
    def end_forward(self, module, args, output) -> None: ...
    def pre_forward(self, units: list[Unit], module, args) -> None: ...
    def post_forward(self, units: list[Unit], module, args, output) -> None: ...
    def grad_arriving(self, u: Unit, grad) -> None: ...
    def grad_ready(self, u: Unit, i: int, p: torch.Tensor) -> None: ...


def tensors_in(obj) -> Iterator[torch.Tensor]:
    """The tensors of a module's output: itself, or inside lists, tuples and dicts."""
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from tensors_in(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from tensors_in(o)


def unit_owners(
    module: torch.nn.Module, units: list[Unit], whole: Collection[str] = ()
) -> list[tuple[torch.nn.Module, list]]:
    """(module, the non-persistent units its forward fetches) for every module, in order.

    ``whole``: names of modules that fetch every unit of their subtree (compiled regions); the
    modules inside them fetch nothing."""
    unit_of = {id(p): u for u in units for p in u.params}
    leaves = {u.leaf for u in units if u.leaf is not None}
    fetching = leaves | set(whole)
    inside = tuple(n + "." for n in fetching)
    out = []
    for name, m in module.named_modules():
        if ("" in fetching and m is not module) or (inside and name.startswith(inside)):
            continue  # inside a leaf or a whole region: that module fetched
        mine = []
        if name in whole:
            params = list(m.parameters())
        elif name in leaves:
            params = [p for u in units if u.leaf == name for p in u.params]
        else:
            params = [p for p in m._parameters.values() if p is not None]
        for p in params:
            u = unit_of.get(id(p))
            if u is not None and not u.persistent and all(u is not v for v in mine):
                mine.append(u)
        out.append((m, mine))
    return out


def install_hooks(
    module: torch.nn.Module, units: list[Unit], on: HookHandlers, whole: Collection[str] = ()
) -> list:
    """Register the forward hooks of every fetching module and the gradient hooks of every
    trained parameter; returns the handles (``handle.remove()`` undoes each). ``whole``: as in
    `unit_owners`."""
    hooks = []
    for m, mine in unit_owners(module, units, whole):
        if m is module:
            # First of the root's pre-hooks: the pass begins before any unit is fetched.
            hooks.append(m.register_forward_pre_hook(on.begin_pass, prepend=True))
        if mine:
            hooks.append(m.register_forward_pre_hook(functools.partial(on.pre_forward, mine)))
            post = functools.partial(on.post_forward, mine)
            # always_call: a forward that raises still gives its units back.
            hooks.append(m.register_forward_hook(post, always_call=True))
    hooks.append(module.register_forward_hook(on.end_forward, always_call=True))
    for u in units:
        for i, p in enumerate(u.params):
            if p.requires_grad:
                hooks.append(p.register_hook(functools.partial(on.grad_arriving, u)))
                ready = functools.partial(on.grad_ready, u, i)
                hooks.append(p.register_post_accumulate_grad_hook(ready))
    return hooks
