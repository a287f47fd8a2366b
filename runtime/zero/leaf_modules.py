"""Stage-3 leaf modules: a module whose whole subtree is fetched, released and reduced as one.

Stage 3 issues one all-gather per module that owns parameters, in the order the modules run.
That pairs up across ranks only while every rank runs the same modules. A mixture-of-experts
layer breaks this: each rank routes its tokens to different experts, so the ranks would run
(and gather) different expert modules. Declaring the layer a *leaf* makes it one unit: every
rank gathers all of its experts when the layer starts, whichever experts its tokens reach,
and reduces the experts' gradients at the end of backward, zeros for the unused ones, in the
same order on every rank.

``set_z3_leaf_modules(model, [SwitchTransformersSparseMLP])`` is DeepSpeed's spelling
(``deepspeed.utils.set_z3_leaf_modules``) and marks instances the same way (``_z3_leaf``).
Common expert layers are found without it (`find_expert_leaves`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from ..errors import InvalidValueError

__all__ = [
    "set_z3_leaf_modules",
    "unset_z3_leaf_modules",
    "get_z3_leaf_modules",
    "z3_leaf_module",
    "find_expert_leaves",
    "leaf_modules",
]

_MARK = "_z3_leaf"


def _matches(module: torch.nn.Module, classes: Sequence) -> bool:
    return any(
        type(module).__name__ == c if isinstance(c, str) else isinstance(module, c) for c in classes
    )


def set_z3_leaf_modules(
    model: torch.nn.Module, leaf_module_classes: Iterable
) -> list[torch.nn.Module]:
    """Mark every module of ``model`` of the given classes (types or class names) a leaf.

    Call it before ``runtime.initialize``. Returns the modules marked; none is an error, since
    a declaration that matches nothing is a typo that would otherwise go unnoticed.
    """
    classes = list(leaf_module_classes)
    marked = [m for m in model.modules() if _matches(m, classes)]
    if not marked:
        names = ", ".join(c if isinstance(c, str) else c.__name__ for c in classes)
        raise InvalidValueError(f"set_z3_leaf_modules: no module of the model is a {names}")
    for m in marked:
        setattr(m, _MARK, True)
    return marked


def unset_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes: Iterable) -> None:
    classes = list(leaf_module_classes)
    for m in model.modules():
        if _matches(m, classes) and hasattr(m, _MARK):
            delattr(m, _MARK)


def z3_leaf_module(module: torch.nn.Module) -> bool:
    return bool(getattr(module, _MARK, False))


def get_z3_leaf_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if z3_leaf_module(m)]


def _is_called_container(module: torch.nn.Module) -> bool:
    """A ModuleList/ModuleDict subclass that defines forward (it dispatches to its children)."""
    forward = type(module).forward
    return forward is not torch.nn.Module.forward and forward not in (
        torch.nn.ModuleList.forward,
        torch.nn.ModuleDict.forward,
    )


def find_expert_leaves(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Expert layers whose children run depending on the data, by name.

    An *experts container* is a module named ``experts`` (or whose class name contains
    "Expert") holding two or more child modules of one class: tokens are routed among those
    children. When the container has a forward of its own it is the leaf; a plain ModuleList
    or ModuleDict is never called, so its parent (the layer that routes) is.
    """
    parents = {}
    for name, m in model.named_modules():
        for child in m.children():
            parents[id(child)] = (name, m)
    leaves: dict[str, torch.nn.Module] = {}
    for name, m in model.named_modules():
        children = list(m.children())
        expertish = name.rsplit(".", 1)[-1] == "experts" or "expert" in type(m).__name__.lower()
        if not expertish or len(children) < 2:
            continue
        if len({type(c) for c in children}) != 1 or not any(True for _ in m.parameters()):
            continue
        if isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)) and not _is_called_container(
            m
        ):
            parent_name, parent = parents.get(id(m), (None, None))
            if parent is None:
                continue
            leaves[parent_name] = parent
        else:
            leaves[name] = m
    return leaves


def leaf_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The leaves stage 3 uses: declared ones, plus expert layers found by `find_expert_leaves`
    outside them. A leaf inside another leaf is part of the outer one."""
    chosen = {n: m for n, m in model.named_modules() if z3_leaf_module(m)}
    chosen.update(find_expert_leaves(model))
    names = sorted(chosen, key=len)
    outer: dict[str, torch.nn.Module] = {}
    for n in names:
        if not any(n == o or n.startswith(o + ".") or o == "" for o in outer):
            outer[n] = chosen[n]
    return outer
