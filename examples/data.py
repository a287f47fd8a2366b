"""A character-level corpus every machine has offline: the Python standard library's source.

The text is the top-level `*.py` files of the running interpreter's stdlib directory, in sorted
order, cut at `max_chars`: deterministic for a given Python version, no download. The vocabulary
is fixed (tab, newline and printable ASCII; anything else reads as '?'), so the model's shape
does not depend on the machine.
"""

from __future__ import annotations

import pathlib
import sysconfig

import torch
from torch.utils.data import Dataset

__all__ = ["VOCAB", "CharDataset", "decode", "encode", "load_corpus", "stdlib_text"]

VOCAB = "\t\n" + "".join(chr(c) for c in range(32, 127))
"""The 97 characters the model sees."""
_INDEX = {ch: i for i, ch in enumerate(VOCAB)}
_UNKNOWN = _INDEX["?"]


def stdlib_text(max_chars: int = 2_000_000) -> str:
    """The first `max_chars` characters of the stdlib's top-level sources, in file-name order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    size = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text)
        if size >= max_chars:
            break
    if not parts:
        raise RuntimeError(f"no Python sources found under {root}")
    return "".join(parts)[:max_chars]


def encode(text: str) -> torch.Tensor:
    """Token ids (int64) of `text`."""
    return torch.tensor([_INDEX.get(ch, _UNKNOWN) for ch in text], dtype=torch.long)


def decode(ids: torch.Tensor | list[int]) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


def load_corpus(max_chars: int = 2_000_000) -> torch.Tensor:
    """The encoded corpus."""
    return encode(stdlib_text(max_chars))


class CharDataset(Dataset):
    """Non-overlapping windows: item i is (tokens[s:s+seq_len], tokens[s+1:s+seq_len+1]) with
    s = i * seq_len. `split` takes the first 90% ("train") or the last 10% ("val")."""

    def __init__(
        self,
        seq_len: int,
        *,
        split: str = "train",
        max_chars: int = 2_000_000,
        tokens: torch.Tensor | None = None,
    ):
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        tokens = load_corpus(max_chars) if tokens is None else tokens
        cut = int(len(tokens) * 0.9)
        self.tokens = tokens[:cut] if split == "train" else tokens[cut:]
        self.seq_len = seq_len
        if len(self.tokens) <= seq_len:
            raise ValueError(f"corpus of {len(self.tokens)} tokens is too short for {seq_len}")

    @property
    def vocab_size(self) -> int:
        return len(VOCAB)

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.seq_len
        chunk = self.tokens[start : start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]
