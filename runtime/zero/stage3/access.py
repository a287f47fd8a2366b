"""Stage 3: fetch a parameter when forward code reads it, not only when its module is called.

Modules read their children's weights without calling them: ``nn.MultiheadAttention`` passes
``self.out_proj.weight`` to a function, DeBERTa reads ``rel_embeddings.weight``, Mamba
``conv1d.weight``. A released parameter is an empty tensor, so such a read would compute with
nothing. Every module's ``_parameters`` dict is replaced by `FetchingParameters`, whose item
lookup (what ``module.weight`` does) asks the coordinator to fetch a released unit while a
forward is running. Iterating the dict (``parameters()``, ``state_dict()``) does not go
through the lookup, so nothing is gathered by accident.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["FetchingParameters", "install", "uninstall"]


class FetchingParameters(dict):
    """A module's ``_parameters`` that calls ``on_read(param)`` for every lookup by name."""

    __slots__ = ("on_read",)

    def __init__(self, params: dict, on_read: Callable[[torch.nn.Parameter], None]):
        super().__init__(params)
        self.on_read = on_read

    def __getitem__(self, name):
        p = dict.__getitem__(self, name)
        if p is not None:
            self.on_read(p)
        return p

    def __reduce__(self):
        # A copy (copy.deepcopy of the model, pickling) is a plain dict: it must not carry
        # the coordinator along.
        return (dict, (dict(self),))


def install(module: torch.nn.Module, on_read: Callable[[torch.nn.Parameter], None]) -> None:
    for m in module.modules():
        if m._parameters and type(m._parameters) is not FetchingParameters:
            m._parameters = FetchingParameters(m._parameters, on_read)


def uninstall(module: torch.nn.Module) -> None:
    for m in module.modules():
        if type(m._parameters) is FetchingParameters:
            m._parameters = dict(m._parameters)
