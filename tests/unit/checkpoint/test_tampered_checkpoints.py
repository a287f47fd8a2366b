"""Crafted checkpoints. Every tampering of a manifest is one CheckpointError,
raised before the first tensor is written into the engine (which trains on as it was), and
every allocation is bounded by the manifest's declared sizes. One gloo rank in a fresh
process for the engine loads; the reader alone needs none."""

from __future__ import annotations

import json
import os
import threading

import pytest

from runtime.checkpoint import CheckpointError, jsonable
from runtime.checkpoint.reader import CheckpointReader
from runtime.checkpoint.storage import MANIFEST
from tests.unit.checkpoint.test_save_faults import _crafted


def test_a_fifo_manifest_is_an_error_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / MANIFEST)
    result: list = []

    def read():
        try:
            CheckpointReader(str(tmp_path))
        except CheckpointError as err:
            result.append(str(err))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(10)
    assert result and "not a regular file" in result[0]


def test_two_shard_records_naming_one_file_are_refused(tmp_path):
    def change(m):
        m["shards"][1]["file"] = m["shards"][0]["file"]
        m["shards"][1]["bytes"] = m["shards"][0]["bytes"]

    with pytest.raises(CheckpointError, match="listed by more than one shard record"):
        CheckpointReader(_crafted(tmp_path, change))


def test_an_extra_tensor_listed_twice_is_refused(tmp_path):
    def change(m):
        m["shards"][0]["extra"] = {"buf": {"shape": [1]}}
        m["shards"][1]["extra"] = {"buf": {"shape": [1]}}

    with pytest.raises(CheckpointError, match="listed twice"):
        CheckpointReader(_crafted(tmp_path, change))


@pytest.mark.parametrize(
    "value",
    [
        {"__ndarray__": ["a"], "dtype": "U200000000", "shape": [1]},
        {"__tensor__": [1], "dtype": "load", "shape": [1]},
        {"__tensor__": [1, 2], "dtype": "float32", "shape": [10**6, 10**6]},
        {"__ndarray__": [1], "dtype": "float32", "shape": "x"},
        {"__tensor__": ["a"], "dtype": "float32", "shape": [1]},
    ],
)
def test_encoded_arrays_are_bounded_by_their_own_declared_sizes(value):
    with pytest.raises(CheckpointError):
        jsonable.decode(value)


def test_a_crafted_client_state_in_a_small_manifest_is_refused_by_the_reader(tmp_path):
    bomb = {"__ndarray__": ["a"], "dtype": "U200000000", "shape": [1]}
    path = _crafted(tmp_path, lambda m: m.__setitem__("client_state", bomb))
    assert len(json.dumps(bomb)) < 100
    with CheckpointReader(path) as reader, pytest.raises(CheckpointError, match="client_state"):
        reader.state("client_state")
