"""Stage 3's parameter shards in swap files (`SwappedShardStore`) against a real temporary
directory: values back as written, in order, with a bounded number of writes behind; no
in-memory view to misuse; a write the disk refuses stops at the flush and is never read back."""

from __future__ import annotations

import resource

import pytest
import torch

from runtime.errors import UsageError
from runtime.zero.nvme import ALIGN, SwapDir, SwapError, SwappedShardStore, Swapper
from runtime.zero.partition import ParamSpec, plan_layout

SIZES = [1000, 3000, 300_000]


def _store(tmp_path, buffer_count=2, dtype=torch.bfloat16):
    layout = plan_layout([ParamSpec(f"p{i}", (n,)) for i, n in enumerate(SIZES)], 2, 1)
    swapper = Swapper(SwapDir(str(tmp_path), rank=1, run_id="t"), workers=2, block_size=ALIGN)
    store = SwappedShardStore(
        layout, 1, dtype, torch.device("cpu"), swapper, tag="s1",
        buffer_count=buffer_count, owns_swapper=True,
    )  # fmt: skip
    return layout, store


def test_shards_read_back_as_last_written_with_writes_behind_bounded(tmp_path):
    layout, store = _store(tmp_path, buffer_count=2)
    try:
        assert [g.shard_numel for g in layout.groups] == [n // 2 for n in SIZES]
        assert store.data.numel() == 0 and store.nbytes == 0  # nothing held in memory
        values = {}
        for _ in range(3):
            for g in layout.groups:
                values[g.index] = torch.randn(g.shard_numel).to(torch.bfloat16)
                store.write_from(g, values[g.index].float())  # converted to the store's dtype
                assert len(store._writes) <= 2
        # A read issued right after writes sees them (no flush needed first).
        for g in layout.groups:
            assert torch.equal(store.read_shard(g), values[g.index])
            dst = torch.full((g.shard_numel,), 7.0, dtype=torch.bfloat16)
            store.load_into(g, dst)
            assert torch.equal(dst, values[g.index])
            wide = torch.zeros(g.shard_numel, dtype=torch.float32)  # another dtype: a copy
            store.load_into(g, wide)
            assert torch.equal(wide, values[g.index].float())
        # The copy read_shard gives is the caller's: changing it changes nothing stored.
        g = layout.groups[0]
        store.read_shard(g).zero_()
        assert torch.equal(store.read_shard(g), values[0])
        with pytest.raises(UsageError, match="swap files.*read_shard.*write_from"):
            store.shard(g)
        with pytest.raises(UsageError, match="swap files"):
            store.shards(1)
    finally:
        store.close()
    assert list(tmp_path.iterdir()) == []  # the owning store's close removed the directory


def test_a_write_the_disk_refuses_stops_at_the_flush_and_is_never_read(tmp_path):
    layout, store = _store(tmp_path, buffer_count=4, dtype=torch.float32)
    small, big = layout.groups[0], layout.groups[2]
    kept = torch.randn(small.shard_numel)
    store.write_from(small, kept)
    store.flush()
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * ALIGN, old[1]))
    try:
        store.write_from(big, torch.randn(big.shard_numel))  # 600 KB past the limit
        with pytest.raises(SwapError, match=r"nvme_path '.*' cannot hold 's1\.2'"):
            store.flush()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    with pytest.raises(SwapError, match=r"'s1\.2' cannot be read: its last write failed"):
        store.read_shard(big)
    assert torch.equal(store.read_shard(small), kept)
    store.close()
