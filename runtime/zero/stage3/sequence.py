"""Stage 3: make sure every rank issues the same collectives in the same order.

Stage 3's all-gathers and reduce-scatters are issued as modules run. If ranks run different
modules (a branch taken on one rank only, experts chosen by the data), collectives of
different units pair up: with equal sizes the ranks silently exchange the wrong weights; with
different sizes gloo aborts the process. `CollectiveSequence` records every collective of a
pass and checks the sequences agree:

* at the end of every pass, one all-gather of a running hash (8 bytes per rank): a mismatch
  of equal-size collectives is reported before the optimizer steps on wrong gradients;
* *verified* passes (the first ones, and the ones after any rank left its recorded module
  order) also check before each collective, so even a size mismatch is reported by name
  instead of aborting. The check costs one tiny all-gather per collective, so it stops once
  passes have agreed `VERIFIED_PASSES` times in a row.
"""

from __future__ import annotations

import torch

from ...comm import Communicator
from ...errors import UsageError
from .units import Unit

__all__ = ["CollectiveSequence", "RankMismatchError", "VERIFIED_PASSES"]

VERIFIED_PASSES = 2
_MOD = (1 << 61) - 1
_KINDS = ("fetch", "reduce")


class RankMismatchError(UsageError):
    """The ranks ran different modules, so their stage-3 collectives do not pair up."""


class CollectiveSequence:
    def __init__(self, comm: Communicator, units: list[Unit]):
        self.comm = comm
        self.units = units
        self.events: list[int] = []
        self.hash = 0
        self.verify = True
        self._agreed = 0
        self._diverged = False

    def mark_diverged(self) -> None:
        """This rank left its recorded module order in this pass."""
        self._diverged = True

    def record(self, kind: str, unit: Unit) -> None:
        code = (_KINDS.index(kind) << 40) | unit.index
        if self.verify:
            self._check_each(code)
        self.events.append(code)
        self.hash = (self.hash * 1_000_003 + code + 1) % _MOD

    def _gather(self, values: list[int]) -> torch.Tensor:
        own = torch.tensor(values, dtype=torch.int64)
        out = torch.empty(len(values) * self.comm.world_size, dtype=torch.int64)
        self.comm.all_gather(out, own)
        return out.view(self.comm.world_size, len(values))

    def _check_each(self, code: int) -> None:
        peers = self._gather([code, len(self.events)])
        if bool((peers != peers[0]).any()):
            self._raise(peers[:, 0].tolist(), len(self.events))

    def end_pass(self, what: str) -> None:
        """All ranks: compare this pass's sequences; decide whether the next is verified."""
        peers = self._gather([self.hash, len(self.events), int(self._diverged)])
        agree = bool((peers[:, :2] == peers[0, :2]).all())
        if not agree:
            self._report_sequences(what)
        if bool(peers[:, 2].any()):
            self._agreed = 0
        else:
            self._agreed += 1
        self.verify = self._agreed < VERIFIED_PASSES
        self.events, self.hash, self._diverged = [], 0, False

    def _report_sequences(self, what: str) -> None:
        lengths = self._gather([len(self.events)])[:, 0].tolist()
        longest = max(lengths)
        padded = self.events + [-1] * (longest - len(self.events))
        seqs = self._gather(padded).tolist() if longest else [[] for _ in lengths]
        pos = next(
            (i for i in range(longest) if len({s[i] for s in seqs}) > 1),
            min(lengths),
        )
        self._raise([s[pos] if pos < len(s) else -1 for s in seqs], pos, what)

    def _describe(self, code: int) -> str:
        if code < 0:
            return "nothing (its pass ended)"
        kind, index = _KINDS[code >> 40], code & ((1 << 40) - 1)
        unit = self.units[index]
        verb = "gathered" if kind == "fetch" else "reduced the gradients of"
        return f"{verb} {unit.name!r}"

    def _raise(self, codes: list[int], pos: int, what: str = "pass") -> None:
        lines = [f"rank {r} {self._describe(c)}" for r, c in enumerate(codes)]
        raise RankMismatchError(
            f"stage 3: the ranks ran different modules in this {what} (collective #{pos}: "
            + "; ".join(lines)
            + "). Modules that run on some ranks only, or whose submodules depend on the data "
            "(mixture-of-experts layers), must be fetched whole: call "
            "runtime.zero.set_z3_leaf_modules(model, [TheLayerClass]) before "
            "runtime.initialize."
        )
