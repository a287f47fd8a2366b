"""A job's range of hosts on the command line: --nnodes MIN:MAX (torchrun's spelling) or
--min-nodes/--max-nodes, --grow-interval, and --nodes refusing a range (it asks salloc for a
count of nodes from a login node)."""

from __future__ import annotations

import os

import pytest

from zlaunch.commands.run_options import build_options
from zlaunch.errors import UsageError
from zlaunch.job import DEFAULT_GROW_INTERVAL

HOSTS = "localhost slots=2\n127.0.0.1 slots=2\nnode3 slots=2\nnode4 slots=1\n"
GROWS = {"max_restarts": 1, "checkpoint_dir": "ckpt"}


def options(tmp_path, **values):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "hosts").write_text(HOSTS)
    environ = {"PATH": os.environ.get("PATH", "")}
    hostfile = str(tmp_path / "hosts")
    values = {"script": "train.py", "script_args": (), "hostfile": hostfile, **values}
    return build_options(chdir=str(tmp_path), environ=environ, home=str(tmp_path), **values)


def test_nnodes_min_max_starts_on_the_first_max_hosts_and_keeps_the_rest_as_spares(tmp_path):
    opts = options(tmp_path, nnodes="2:3", **GROWS)
    assert (opts.min_nodes, opts.max_nodes) == (2, 3)
    assert [h.name for h in opts.hosts] == ["localhost", "127.0.0.1", "node3"]
    assert [h.name for h in opts.spare_hosts] == ["node4"]
    assert opts.grow_interval == DEFAULT_GROW_INTERVAL == 60.0
    assert opts.hostfile == str(tmp_path / "hosts")


def test_the_long_form_is_the_same_range_and_num_nodes_starts_on_fewer(tmp_path):
    long = options(tmp_path, min_nodes=2, max_nodes=3, **GROWS)
    assert [h.name for h in long.hosts] == ["localhost", "127.0.0.1", "node3"]
    fewer = options(tmp_path, min_nodes=1, max_nodes=4, num_nodes=2, grow_interval=5.0, **GROWS)
    assert [h.name for h in fewer.hosts] == ["localhost", "127.0.0.1"]
    assert [h.name for h in fewer.spare_hosts] == ["node3", "node4"]
    assert (fewer.max_nodes, fewer.grow_interval) == (4, 5.0)


def test_num_gpus_is_the_slots_a_joining_host_runs(tmp_path):
    opts = options(tmp_path, nnodes="1:2", num_gpus=1, **GROWS)
    assert opts.slots_per_host == 1 and all(len(h.slots) == 1 for h in opts.hosts)


@pytest.mark.parametrize(
    "values, words",
    [
        ({"nnodes": "3:2", **GROWS}, ["MIN is more than MAX"]),
        ({"nnodes": "0:2", **GROWS}, ["1 or more"]),
        ({"nnodes": "a:b", **GROWS}, ["MIN and MAX must be numbers"]),
        ({"nnodes": "2:3", "min_nodes": 1, **GROWS}, ["--min-nodes 1 disagree"]),
        ({"nnodes": "2:3", "max_nodes": 4, **GROWS}, ["--max-nodes 4 disagree"]),
        ({"max_nodes": 3, **GROWS}, ["needs --min-nodes"]),
        ({"min_nodes": 1, "max_nodes": 2, "num_nodes": 3, **GROWS}, ["fewer than the 3 host"]),
        ({"nnodes": "1:3", "max_restarts": 1}, ["needs --checkpoint-dir"]),
        ({"nnodes": "1:3", **GROWS, "save_on": "none"}, ["a save signal"]),
        ({"nnodes": "1:3", "checkpoint_dir": "ckpt"}, ["only matters when the job restarts"]),
        ({"grow_interval": 5.0, **GROWS}, ["needs --max-nodes"]),
        ({"nnodes": "1:3", "grow_interval": -1.0, **GROWS}, ["--grow-interval must be 0 or more"]),
        ({"nnodes": "1:3", "grow_interval": float("nan"), **GROWS}, ["--grow-interval"]),
    ],
)
def test_a_bad_range_is_refused_naming_the_flag(tmp_path, values, words):
    with pytest.raises(UsageError) as err:
        options(tmp_path, **values)
    text = err.value.message + " " + (err.value.hint or "")
    for word in words:
        assert word in text, text


def test_a_range_is_refused_with_another_launcher(tmp_path):
    with pytest.raises(UsageError) as err:
        options(tmp_path, nnodes="1:3", launcher="mpi", **GROWS)
    assert "--launcher mpi" in err.value.message


@pytest.mark.parametrize("value", ["2:3", " 2:3 ", "x:y"])
def test_nodes_refuses_a_range_and_says_the_spelling_of_one(capsys, value):
    from zlaunch.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["run", "--nodes", value, "--dry-run", "train.py"])
    err = capsys.readouterr().err
    assert exit.value.code == 2, err
    assert "not a range" in err and "Traceback" not in err
    assert ("--nnodes 2:3" if "2" in value else "--nnodes MIN:MAX") in err


def test_nodes_still_takes_a_count(monkeypatch):
    from zlaunch.commands.run import _node_count

    assert _node_count("3") == 3 and _node_count(None) is None
    for bad in ("0", "-1", "three", "1" * 7):
        with pytest.raises(UsageError):
            _node_count(bad)
