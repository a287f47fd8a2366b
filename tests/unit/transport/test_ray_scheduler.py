"""--launcher ray's pure parts: the options, and the bundles asked of a cluster (from a
made-up ``ray.nodes()``: GPUs where the cluster has them, pinned to the nodes
--include/--exclude choose, refused when they name no node or leave too few)."""

from __future__ import annotations

import os

import pytest

from zlaunch.commands.run_options import build_options
from zlaunch.errors import LaunchError, UsageError
from zlaunch.transport.ray_scheduler import PIN, RayScheduler


class _FakeRay:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def _node(ip, gpus=0, alive=True):
    resources = {"CPU": 4.0, f"node:{ip}": 1.0, **({"GPU": float(gpus)} if gpus else {})}
    return {"NodeID": f"id-{ip}", "NodeManagerAddress": ip, "Alive": alive, "Resources": resources}


NODES = [_node("10.0.0.2"), _node("10.0.0.3"), _node("10.0.0.4"), _node("10.0.0.5", alive=False)]


def test_one_cpu_bundle_per_node_without_gpus_and_gpu_bundles_with_them():
    ray = _FakeRay(NODES)
    assert RayScheduler(None, 2)._bundles(ray, 3) == [{"CPU": 2.0}] * 3
    gpus = _FakeRay([_node("10.0.0.2", gpus=8), _node("10.0.0.3", gpus=8)])
    assert RayScheduler(None, 8)._bundles(gpus, 2) == [{"GPU": 8.0, "CPU": 0.0}] * 2
    with pytest.raises(LaunchError, match="--num-nodes 4: the Ray cluster has 3 node"):
        RayScheduler(None, 1)._bundles(ray, 4)  # the dead node does not count


def test_include_and_exclude_pin_the_bundles_to_the_chosen_nodes():
    ray = _FakeRay(NODES)
    chosen = RayScheduler(None, 1, include=["10.0.0.4", "id-10.0.0.2"])._bundles(ray, 2)
    assert chosen == [{"CPU": 1.0, "node:10.0.0.2": PIN}, {"CPU": 1.0, "node:10.0.0.4": PIN}]
    rest = RayScheduler(None, 1, exclude=["id-10.0.0.3"])._bundles(ray, 2)
    assert [set(b) - {"CPU"} for b in rest] == [{"node:10.0.0.2"}, {"node:10.0.0.4"}]
    with pytest.raises(LaunchError, match="--include/--exclude leave 1 Ray node"):
        RayScheduler(None, 1, include=["10.0.0.2"])._bundles(ray, 2)
    with pytest.raises(UsageError, match="name 10.9.9.9, which is no Ray node alive"):
        RayScheduler(None, 1, exclude=["10.9.9.9"])._bundles(ray, 1)
    with pytest.raises(UsageError, match="name 10.0.0.5"):  # dead: not a node to place on
        RayScheduler(None, 1, include=["10.0.0.5"])._bundles(ray, 1)


def _options(tmp_path, **values):
    (tmp_path / "train.py").write_text("print('hi')\n")
    return build_options(
        script=str(tmp_path / "train.py"), script_args=(), home=str(tmp_path),
        environ={"PATH": os.environ.get("PATH", "")}, **values,
    )  # fmt: skip


def test_ray_options(tmp_path):
    options = _options(
        tmp_path, launcher="ray", num_nodes=3, include="10.0.0.2,id-b@10.0.0.4",
        ray_address="10.0.0.2:6379",
    )  # fmt: skip
    assert [h.name for h in options.hosts] == ["agent-0", "agent-1", "agent-2"]
    assert options.ray_include == ("10.0.0.2", "id-b", "10.0.0.4")
    assert options.ray_address == "10.0.0.2:6379"
    with pytest.raises(UsageError, match="--launcher ray needs --num-nodes N"):
        _options(tmp_path, launcher="ray")
    with pytest.raises(UsageError, match="--hostfile has no effect with --launcher ray"):
        _options(tmp_path, launcher="ray", num_nodes=2, hostfile="hosts")
    with pytest.raises(UsageError, match="--ray-address has no effect with --launcher ssh"):
        _options(tmp_path, launcher="ssh", ray_address="h:1")


def test_a_lost_agent_is_told_of_its_own_ray_node_only():
    from zlaunch.transport.ray_scheduler import RayPlacement

    placement = RayPlacement(ray=None)
    placement.ips = ["10.0.0.2", "10.0.0.3"]
    first, second = object(), object()
    placement.links = {0: first, 1: second}
    placement.dead = {1: "node died", 0: "actor killed"}
    assert placement.stderr_tail(None, link=second) == ["Ray node 10.0.0.3 lost (node died)"]
    assert placement.stderr_tail(None, link=first) == ["Ray node 10.0.0.2 lost (actor killed)"]
    assert len(placement.stderr_tail(None)) == 2  # no link: every node lost
