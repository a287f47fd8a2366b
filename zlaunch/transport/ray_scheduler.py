"""``--launcher ray``: a Ray cluster places the agents, which dial in (transport/dialin.py).

The controller joins the cluster as a Ray driver (Ray's own client: ``ray.init``), reserves one
bundle per node in a STRICT_SPREAD placement group (each bundle the node's slots, as GPUs where
the cluster has them, else CPUs; pinned to the chosen nodes by Ray's ``node:<ip>`` resource
when ``--include``/``--exclude`` choose them), and starts one agent actor per bundle. Each
actor writes the job's token to a private file on its node (the token reaches the actor as a
method argument, never on a command line) and runs ``python -m zlaunch.agent --connect ...``.

An actor that dies with its node is Ray's node-death notice: that node's link is cut, and the
controller takes the node as lost at once. When the job ends (or its start fails), every
actor is killed and the placement group removed: nothing is left on any node.

Ray is imported here only, and only when ``--launcher ray`` runs (``pip install
'zlaunch[ray]'``).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from zlaunch.errors import LaunchError, UsageError
from zlaunch.transport.connect_back import ConnectBackLink
from zlaunch.transport.dialin import Rendezvous
from zlaunch.wire import Answer

__all__ = ["PLACEMENT_TIMEOUT", "RayPlacement", "RayScheduler", "import_ray"]

PLACEMENT_TIMEOUT = 120.0
"""Seconds the placement group may take to be placed (a cluster that cannot place it says why
through Ray; the wait is then refused with the bundles asked for)."""
PIN = 0.001
"""How much of a node's own ``node:<ip>`` resource a bundle asks for, to land on that node."""


def import_ray():
    """Ray, or a clear error naming the extra."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--launcher ray needs Ray on this machine",
            hint="pip install 'zlaunch[ray]' (or pip install ray), the same version as the "
            "cluster's",
        ) from None
    return ray


class _AgentActor:
    """One node's agent, as a Ray actor (threaded: ``run`` blocks while the agent runs)."""

    def where(self) -> tuple[str, str]:
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def run(self, argv: list[str], address: str, token: str) -> int:
        import signal
        import subprocess

        fd, path = tempfile.mkstemp(prefix="zlaunch-token-")  # mode 0600
        try:
            os.write(fd, (token + "\n").encode())
            os.close(fd)

            def _die_with_actor() -> None:  # the actor killed: the agent stops its workers
                import ctypes

                ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PDEATHSIG

            env = {k: v for k, v in os.environ.items() if "TOKEN" not in k.upper()}
            proc = subprocess.Popen(
                [*argv, "--connect", address, "--token-file", path],
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_actor,
                start_new_session=True,
            )
            return proc.wait()
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass


class RayScheduler:
    """Places one agent per node on the Ray cluster at ``address`` (None: ``RAY_ADDRESS``, else
    a local Ray)."""

    def __init__(
        self,
        address: str | None,
        slots: int,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
    ):
        self.address = address
        self.slots = slots
        self.include = list(include)
        self.exclude = list(exclude)

    def place(self, rendezvous: Rendezvous) -> RayPlacement:
        ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        address = self.address or os.environ.get("RAY_ADDRESS") or None
        try:
            ray.init(
                address=address,
                namespace="zlaunch",
                log_to_driver=False,
                logging_level="ERROR",
                configure_logging=False,
                include_dashboard=False if address is None else None,
            )
        except Exception as err:  # noqa: BLE001 - Ray's own errors, named for the user
            raise LaunchError(
                f"cannot join the Ray cluster at {address or 'this machine'}: {err}",
                hint="--ray-address HOST:PORT (or RAY_ADDRESS) names the cluster's head",
            ) from None
        placement = RayPlacement(ray)
        try:
            bundles = self._bundles(ray, rendezvous.nodes)
            pg = placement_group(bundles, strategy="STRICT_SPREAD", name="zlaunch-agents")
            placement.pg = pg
            ready = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT)[0]
            if not ready:
                raise LaunchError(
                    f"Ray could not place {rendezvous.nodes} bundles of {bundles[0]} on distinct "
                    f"nodes within {PLACEMENT_TIMEOUT:.0f} s",
                    hint="fewer --num-nodes, fewer --num-gpus, or --include/--exclude other nodes",
                )
            actor_class = ray.remote(max_concurrency=2)(_AgentActor)
            kind = "GPU" if "GPU" in bundles[0] else "CPU"
            for index in range(rendezvous.nodes):
                actor = actor_class.options(
                    num_cpus=bundles[0]["CPU"] if kind == "CPU" else 0,
                    num_gpus=bundles[0]["GPU"] if kind == "GPU" else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=index
                    ),
                ).remote()
                placement.actors.append(actor)
            places = ray.get([actor.where.remote() for actor in placement.actors])
            placement.ips = [ip for ip, _ in places]
            placement.node_ids = [node for _, node in places]
            argv = list(rendezvous.agent_argv)
            placement.runs = [
                actor.run.remote(argv, rendezvous.address, rendezvous.token)
                for actor in placement.actors
            ]
            placement.watch()
        except BaseException:
            placement.remove()
            raise
        return placement

    def _bundles(self, ray, nodes: int) -> list[dict[str, float]]:
        """One bundle per node: the node's slots as GPUs where the cluster has them, else CPUs;
        pinned to chosen nodes when --include/--exclude say which."""
        alive = [n for n in ray.nodes() if n.get("Alive")]
        has_gpus = any(n.get("Resources", {}).get("GPU", 0) for n in alive)
        base = {"GPU": float(self.slots), "CPU": 0.0} if has_gpus else {"CPU": float(self.slots)}
        if not self.include and not self.exclude:
            if len(alive) < nodes:
                raise LaunchError(
                    f"--num-nodes {nodes}: the Ray cluster has {len(alive)} node(s) alive",
                    hint="start more Ray nodes, or ask for fewer",
                )
            return [dict(base) for _ in range(nodes)]

        def named(node: dict[str, Any], names: Sequence[str]) -> bool:
            return node.get("NodeID") in names or node.get("NodeManagerAddress") in names

        chosen = [n for n in alive if (not self.include or named(n, self.include))]
        chosen = [n for n in chosen if not named(n, self.exclude)]
        unknown = [
            name for name in self.include + self.exclude if not any(named(n, [name]) for n in alive)
        ]
        if unknown:
            raise UsageError(
                f"--include/--exclude name {', '.join(unknown)}, which is no Ray node alive "
                "(by node id or IP)",
                hint="`ray status -v` or ray.nodes() lists the nodes' ids and addresses",
            )
        if len(chosen) < nodes:
            raise LaunchError(
                f"--num-nodes {nodes}: --include/--exclude leave {len(chosen)} Ray node(s)",
                hint="include more nodes, or ask for fewer",
            )
        return [{**base, f"node:{n['NodeManagerAddress']}": PIN} for n in chosen[:nodes]]


class RayPlacement:
    """The actors and the placement group of one attempt (see dialin.Placement)."""

    def __init__(self, ray):
        self.ray = ray
        self.pg = None
        self.actors: list[Any] = []
        self.runs: list[Any] = []
        self.ips: list[str] = []
        self.node_ids: list[str] = []
        self.links: dict[int, ConnectBackLink] = {}  # bundle index -> its agent's link
        self.dead: dict[int, str] = {}
        self._released = 0
        self._lock = threading.Lock()
        self._removed = False
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # ---- what the dial-in path asks -----------------------------------------------------

    def joined(self, link: ConnectBackLink, answer: Answer, peer: str) -> None:
        with self._lock:
            if peer in self.ips:
                index = self.ips.index(peer)
                self.links[index] = link
                if index in self.dead:
                    link.cut()

    def failed(self) -> str | None:
        with self._lock:
            if self.dead:
                index, why = next(iter(self.dead.items()))
                return f"the agent actor on Ray node {self.ips[index]} ended: {why}"
        return None

    def stderr_tail(self, task: int | None, link: ConnectBackLink | None = None) -> list[str]:
        """How ``link``'s Ray node was lost, as Ray told it (a line naming the node): a lost
        agent's failure record says why, and only its own. ``link`` None, or one no actor's
        agent dialed in on: every Ray node lost."""
        with self._lock:
            mine = [index for index, known in self.links.items() if known is link]
            lost = mine if mine else list(self.dead)
            return [f"Ray node {self.ips[i]} lost ({self.dead[i]})" for i in lost if i in self.dead]

    def wait(self, timeout: float | None = None) -> int | None:
        return None

    def end_reason(self, wait: float = 2.0) -> str | None:
        """None: a Ray node lost is its agent lost, a failure as over SSH (recorded in
        failure.json, restarted under --max-restarts), not a job the scheduler ended on
        purpose as Slurm's scancel or time limit is."""
        return None

    def release(self, link: ConnectBackLink) -> None:
        with self._lock:
            self._released += 1  # one per agent that dialed in: every actor's, on a whole start
            last = self._released >= len(self.actors)
        if last:
            self.remove()

    def settle(self) -> None:
        """Nothing to wait for: the last ``release`` removes everything itself."""

    def remove(self) -> None:
        """Kill every actor (each agent with it), remove the placement group, leave Ray."""
        with self._lock:
            if self._removed:
                return
            self._removed = True
        self._stop.set()
        ray = self.ray
        if self.runs:  # the agents exit once their links close: a moment for that
            ray.wait(self.runs, num_returns=len(self.runs), timeout=5.0)
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001, S110 - gone with its node already
                pass
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001, S110 - the cluster is gone
                pass
        if self._watcher is not None:
            self._watcher.join(2.0)
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001, S110
            pass

    # ---- Ray's notice of a lost node ----------------------------------------------------

    def watch(self) -> None:
        self._watcher = threading.Thread(target=self._watch, name="ray-nodes", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        ray = self.ray
        pending = list(self.runs)
        while pending and not self._stop.is_set():
            try:
                done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            except Exception:  # noqa: BLE001 - the driver is shutting down
                return
            for ref in done:
                index = self.runs.index(ref)
                try:
                    ray.get(ref)
                    continue  # the agent exited: its connection says the rest
                except Exception as err:  # noqa: BLE001 - an actor's death, whatever Ray calls it
                    why = type(err).__name__
                with self._lock:
                    self.dead[index] = why
                    link = self.links.get(index)
                if link is not None:
                    link.cut()
