"""``deepspeed.runtime.dataloader``: `RepeatingLoader`, which Megatron-DeepSpeed and DeepSpeed's
examples wrap their loaders in."""

from __future__ import annotations

from .._missing import module_getattr

__all__ = ["RepeatingLoader"]


class RepeatingLoader:
    """An endless iterator over ``loader``: when it is exhausted, a new pass starts (``iter``
    again, so a shuffling sampler reshuffles), as DeepSpeed's does."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


__getattr__ = module_getattr(__name__)
