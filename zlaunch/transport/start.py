"""Start an agent on every host (bounded parallelism, the first failure named by host)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zlaunch.errors import HostUnreachable, LaunchError
from zlaunch.job import Host, K8sOptions, Launcher, SlurmMode, SshOptions
from zlaunch.transport.link import Link
from zlaunch.worker import module_argv

__all__ = ["Link", "open_link", "open_links", "agent_argv", "MAX_PARALLEL_CONNECTS"]

# Parallel SSH handshakes at once: enough for fast fan-out, few enough not to trip sshd's
# MaxStartups (10 by default) on a shared bastion.
MAX_PARALLEL_CONNECTS = 32


def agent_argv(python: str) -> list[str]:
    """``python -u -m zlaunch.agent``, less the working directory on sys.path (wherever the
    transport starts it: zlaunch/worker/python_start.py)."""
    return module_argv(python, "zlaunch.agent")


def open_link(
    host: Host,
    argv: Sequence[str],
    ssh: SshOptions,
    launcher: str = "ssh",
    launcher_args: Sequence[str] = (),
) -> Link:
    """Start ``argv`` on ``host``: through srun or mpirun when the launcher says so, else a
    subprocess for a local host and an SSH channel otherwise."""
    if launcher == Launcher.SLURM:
        from zlaunch.transport.slurm import SlurmLink

        return SlurmLink.start_on(host, argv, extra=launcher_args)
    if launcher == Launcher.MPI:
        from zlaunch.transport.mpi import MpiLink

        return MpiLink.start_on(host, argv, extra=launcher_args)
    if host.is_local:
        from zlaunch.transport.local import LocalLink

        return LocalLink.start(host, argv)
    from zlaunch.transport.ssh import SshLink

    return SshLink.start(host, argv, ssh)


def _scheduler(
    launcher: str,
    slots: int,
    ray: tuple[str | None, tuple[str, ...], tuple[str, ...]] | None,
    k8s: K8sOptions | None,
    warn: Callable[[str], None],
):
    """The dial-in scheduler that places ``launcher``'s agents (each imports its client only
    when it places them)."""
    if launcher == Launcher.RAY:
        from zlaunch.transport.ray_scheduler import RayScheduler

        address, include, exclude = ray or (None, (), ())
        return RayScheduler(address, slots, include, exclude)
    if k8s is None:
        raise LaunchError("--launcher k8s needs its options (--image)")
    from zlaunch.transport.k8s import K8sScheduler

    return K8sScheduler(k8s, warn)


def open_links(
    hosts: Sequence[Host],
    argv_for: Callable[[Host], Sequence[str]],
    ssh: SshOptions,
    *,
    on_open: Callable[[int, Link], Any] | None = None,
    launcher: str = "ssh",
    launcher_args: Sequence[str] = (),
    slurm_mode: str = "step-per-node",
    controller_addr: str | None = None,
    on_refused: Callable[[str], None] = lambda _why: None,
    interrupted: Callable[[], int | None] = lambda: None,
    controller_port: int = 0,
    token_file: str | None = None,
    on_listening: Callable[[str], None] = lambda _what: None,
    ray: tuple[str | None, tuple[str, ...], tuple[str, ...]] | None = None,
    k8s: K8sOptions | None = None,
) -> list[Link]:
    """Start on every host in parallel (bounded). If any host fails, the ones that did start
    are terminated and the first failure (in host order) is raised, naming its host.

    ``--launcher slurm`` with ``slurm_mode="one-step"``: one srun starts every host's agent,
    each connecting back to ``controller_addr`` (None: chosen from the route to the nodes);
    ``on_refused`` hears of each connection that failed the handshake (and, under
    ``--launcher k8s``, of an API server that stops answering during the job), and ``interrupted()``
    (a signal number, or None) ends the wait for them (transport/slurm_one_step.py).
    ``--launcher dialin``: agents started by someone else dial in to ``controller_addr`` and
    ``controller_port`` with the token of ``token_file`` (transport/dialin.py); where they are
    awaited is told to ``on_listening``. ``--launcher ray`` and ``--launcher k8s``: the same,
    the agents placed by a scheduler (``ray``: the cluster's address, the nodes included and
    excluded, transport/ray_scheduler.py; ``k8s``: the pods' namespace, image and resources,
    transport/k8s.py), each attempt with a new token that is gone once the agents are in.
    """
    if launcher in (Launcher.RAY, Launcher.K8S):
        from zlaunch.transport.dialin import cleanup_token_dir, open_dialin, private_token_dir

        argv = tuple(argv_for(hosts[0]))
        scheduler = _scheduler(launcher, len(hosts[0].slots), ray, k8s, warn=on_refused)
        folder = private_token_dir()
        try:
            return open_dialin(
                hosts,
                argv,
                token_file=os.path.join(folder, "token"),
                scheduler=scheduler,
                controller_addr=controller_addr,
                port=controller_port,
                on_open=on_open,
                on_listening=on_listening,
                on_refused=on_refused,
                interrupted=interrupted,
            )
        finally:
            cleanup_token_dir(folder)
    if launcher == Launcher.DIALIN:
        from zlaunch.transport.dialin import open_dialin

        argvs = {tuple(argv_for(host)) for host in hosts}
        if len(argvs) != 1 or token_file is None:
            raise LaunchError("dial-in agents run one command and need the token file")
        return open_dialin(
            hosts,
            argvs.pop(),
            token_file=token_file,
            controller_addr=controller_addr,
            port=controller_port,
            on_open=on_open,
            on_listening=on_listening,
            on_refused=on_refused,
            interrupted=interrupted,
        )
    if launcher == Launcher.SLURM and slurm_mode == SlurmMode.ONE_STEP:
        from zlaunch.transport.slurm_one_step import open_one_step

        argvs = {tuple(argv_for(host)) for host in hosts}
        if len(argvs) != 1:
            raise LaunchError("one srun step starts the same agent command on every node")
        return open_one_step(
            hosts,
            argvs.pop(),
            on_open=on_open,
            extra=launcher_args,
            controller_addr=controller_addr,
            on_refused=on_refused,
            interrupted=interrupted,
        )
    links: list[Link | None] = [None] * len(hosts)
    errors: list[tuple[int, Exception]] = []
    lock = threading.Lock()

    def start(index: int) -> None:
        try:
            link = open_link(hosts[index], argv_for(hosts[index]), ssh, launcher, launcher_args)
        except Exception as err:  # noqa: BLE001 - reported below, naming the host
            with lock:
                errors.append((index, err))
            return
        links[index] = link
        if on_open is not None:
            on_open(index, link)

    workers = max(1, min(MAX_PARALLEL_CONNECTS, len(hosts)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="connect") as pool:
        list(pool.map(start, range(len(hosts))))
    if errors:
        for link in links:
            if link is not None:
                link.terminate()
        errors.sort(key=lambda item: item[0])
        index, err = errors[0]
        # Every host that could not be reached, by name (a restart may go on without them).
        names = [hosts[i].name for i, e in errors if isinstance(e, (HostUnreachable, OSError))]
        if isinstance(err, HostUnreachable):
            raise HostUnreachable(err.message, hosts=names, hint=err.hint) from err
        if not isinstance(err, LaunchError):
            raise HostUnreachable(f"cannot start on {hosts[index].display}: {err}", hosts=names)
        raise err
    return [link for link in links if link is not None]
