"""The arithmetic of a restart on fewer hosts: which hosts, which batch."""

from __future__ import annotations

import pytest

from runtime.config import ConfigError, load_config
from zlaunch.errors import LaunchError
from zlaunch.job.hostfile import Host
from zlaunch.launcher.elastic import batch_for_world, next_hosts
from zlaunch.wire.batch import BatchError, BatchOverride, override_from_env


def _hosts(*names):
    return [Host(name=n, slots=(0, 1)) for n in names]


def test_lost_hosts_are_replaced_by_spares_in_order():
    hosts, spares = next_hosts(_hosts("a", "b", "c"), {"b"}, _hosts("d", "e"), min_nodes=2)
    assert [h.name for h in hosts] == ["a", "c", "d"] and [h.name for h in spares] == ["e"]
    hosts, spares = next_hosts(_hosts("a", "b", "c"), {"a", "c"}, _hosts("d"), min_nodes=2)
    assert [h.name for h in hosts] == ["b", "d"] and spares == []


def test_fewer_than_min_nodes_stops_with_a_reason():
    with pytest.raises(LaunchError, match="1 host\\(s\\) left, fewer than --min-nodes 2"):
        next_hosts(_hosts("a", "b"), {"b"}, [], min_nodes=2)


def test_global_batch_kept_by_the_accumulation_steps():
    config = load_config({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2})
    # 2 x 2 x 6 ranks = 24 samples per step: on 4 ranks 2 x 3, on 3 ranks 2 x 4, on 5 none
    assert batch_for_world(config, 6, 4) == BatchOverride(24, 2, 3)
    assert batch_for_world(config, 6, 3) == BatchOverride(24, 2, 4)
    with pytest.raises(ConfigError, match="train_batch_size 24 cannot be kept on 5 ranks"):
        batch_for_world(config, 6, 5)
    override = batch_for_world(config, 6, 4)
    assert override_from_env({"ZLAUNCH_BATCH": override.encode()}) == override
    resolved = override.apply(config).resolve(4)
    assert (resolved.train_batch_size, resolved.gradient_accumulation_steps) == (24, 3)


@pytest.mark.parametrize("raw", ["24,2", "a,b,c", "24,0,3"])
def test_bad_batch_variable_is_an_error(raw):
    with pytest.raises(BatchError, match="ZLAUNCH_BATCH"):
        override_from_env({"ZLAUNCH_BATCH": raw})
