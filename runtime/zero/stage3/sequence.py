"""Stage 3: make sure every rank issues the same collectives in the same order.

Stage 3's all-gathers and reduce-scatters are issued as modules run. If ranks run different
modules (a branch taken on one rank only, experts chosen by the data), collectives of
different units pair up: with equal sizes the ranks silently exchange the wrong weights; with
different sizes gloo aborts the process. `CollectiveSequence` records every collective of a
pass and checks the sequences agree:

* at the end of every pass, a running hash of its collectives is compared across ranks: a
  mismatch of equal-size collectives is reported before the optimizer steps on wrong
  gradients;
* *verified* passes (the first ones, and the ones after any rank left its recorded module
  order) also check before each collective, so even a size mismatch is reported by name
  instead of aborting. The check costs one tiny all-gather per collective, so it stops once
  passes have agreed `VERIFIED_PASSES` times in a row.

Where the comparison runs: after a pass that is not verified and ends an accumulation (the
common steady state), the hash rides in the step's gradient-norm all-reduce
(`runtime.optim.precision.StepRiders`) and is settled before the optimizer applies anything: no
collective and no host read of its own. A sum can still tell equal values from different ones:
all N values are equal exactly when N * sum(h^2) == sum(h)^2, computed in Python integers from
float64 sums that stay exact (two 20-bit pieces of the hash, up to 4096 ranks). Other passes
(verified ones, evaluation, accumulation micro-steps, larger worlds) end with one all-gather of
24 bytes per rank as before.
"""

from __future__ import annotations

import torch

from runtime.distributed import Communicator

from ...errors import UsageError
from .units import Unit

__all__ = ["CollectiveSequence", "RankMismatchError", "VERIFIED_PASSES", "SEAT"]

VERIFIED_PASSES = 2
SEAT = "stage3_sequence"  # its seat in the step's all-reduce
_MOD = (1 << 61) - 1
_KINDS = ("fetch", "reduce")
_PIECE = 20  # bits of the hash per summed piece: N * (2^20)^2 stays below 2^53 for N <= 4096
_MAX_RIDING_WORLD = 4096


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
        self.riding = False
        """A finished pass waits for the step's all-reduce to compare it (`board`/`settle`)."""

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
        # On the group's device: an NCCL group refuses host tensors.
        device = self.comm.device
        own = torch.tensor(values, dtype=torch.int64, device=device)
        out = torch.empty(len(values) * self.comm.world_size, dtype=torch.int64, device=device)
        self.comm.all_gather(out, own)
        return out.view(self.comm.world_size, len(values))

    def _check_each(self, code: int) -> None:
        peers = self._gather([code, len(self.events)])
        if bool((peers != peers[0]).any()):
            self._raise(peers[:, 0].tolist(), len(self.events))

    def end_pass(self, what: str, ends_accumulation: bool = False) -> None:
        """All ranks: compare this pass's sequences (now, or in the coming step's all-reduce
        when `ends_accumulation` and the pass was not verified); decide whether the next pass is
        verified."""
        if self.riding:  # a pass whose step never came: compare it with this one, now
            self.riding = False
        elif ends_accumulation and not self.verify:
            if self.comm.world_size <= _MAX_RIDING_WORLD:
                self.riding = True
                return
        self._compare_now(what)

    def _compare_now(self, what: str) -> None:
        """One all-gather of (hash, count, diverged) from every rank, then the verdict."""
        peers = self._gather([self.hash, len(self.events), int(self._diverged)])
        agree = bool((peers[:, :2] == peers[0, :2]).all())
        self._conclude(agree, bool(peers[:, 2].any()), what)

    def _conclude(self, agree: bool, diverged: bool, what: str) -> None:
        if not agree:
            self._report_sequences(what)
        if diverged:
            self._agreed = 0
        else:
            self._agreed += 1
        self.verify = self._agreed < VERIFIED_PASSES
        self.events, self.hash, self._diverged = [], 0, False

    # ---- riding in the step's all-reduce -------------------------------------------------------

    def _riders(self) -> torch.Tensor:
        low, high = self.hash & ((1 << _PIECE) - 1), (self.hash >> _PIECE) & ((1 << _PIECE) - 1)
        n = len(self.events)
        values = [low, low * low, high, high * high, n, n * n, int(self._diverged)]
        return torch.tensor(values, dtype=torch.float64)

    def board(self, riders) -> None:
        """Before the step's gradient check: put the waiting pass's hash on `riders`."""
        if self.riding:
            riders.board(self._riders(), SEAT)

    def settle(self, sums: list[float] | None) -> None:
        """After the gradient check, before the optimizer applies anything: compare the
        waiting pass from the sums (None: they did not ride; gather here instead)."""
        if not self.riding:
            return
        self.riding = False
        if sums is None:
            self._compare_now("backward")
            return
        world = self.comm.world_size
        whole = [round(v) for v in sums]
        agree = all(world * whole[i + 1] == whole[i] * whole[i] for i in (0, 2, 4))
        self._conclude(agree, whole[6] > 0, "backward")

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
