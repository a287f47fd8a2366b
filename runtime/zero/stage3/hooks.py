"""Where stage 3 hooks the model: which module fetches which units, and the hooks registered.

A module fetches the units of the parameters it holds directly (a tied weight: every module
holding it); a leaf module (`leaf_modules`) fetches its whole subtree's units, and the modules
inside a leaf fetch nothing of their own (the leaf did). Persistent units are always gathered,
so no hook fetches them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
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


def unit_owners(module: torch.nn.Module, units: list[Unit]) -> list[tuple[torch.nn.Module, list]]:
    """(module, the non-persistent units its forward fetches) for every module, in order."""
    unit_of = {id(p): u for u in units for p in u.params}
    leaves = {u.leaf for u in units if u.leaf is not None}
    inside = tuple(n + "." for n in leaves)
    out = []
    for name, m in module.named_modules():
        if "" in leaves and m is not module:
            continue
        if name in leaves:
            mine = [u for u in units if u.leaf == name and not u.persistent]
        elif inside and name.startswith(inside):
            continue
        else:
            mine = []
            for p in m._parameters.values():
                u = unit_of.get(id(p)) if p is not None else None
                if u is not None and not u.persistent and u not in mine:
                    mine.append(u)
        out.append((m, mine))
    return out


def install_hooks(module: torch.nn.Module, units: list[Unit], on: HookHandlers) -> list:
    """Register the forward hooks of every fetching module and the gradient hooks of every
    trained parameter; returns the handles (``handle.remove()`` undoes each)."""
    hooks = []
    for m, mine in unit_owners(module, units):
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
