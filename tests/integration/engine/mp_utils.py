"""Run a function on N gloo ranks and collect each rank's return value.

Each rank runs in a process of its own with what a launcher gives a worker (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment), so `runtime.initialize` sets the
process group up by itself. The function is named by file and name (``"tests/integration/checkpoint/async_save_worker.py:save_and_continue"``); it is
called with the keyword arguments given and its return value comes back through a file
(torch.save). One thread per process keeps N ranks fair on a small machine.

Why a pool: importing torch and the runtime costs each rank about a second of CPU, paid again
by every call; on two cores, with a few hundred calls in the suite, that was minutes of the
run. So each world size keeps one warm *pool process* per rank that has imported torch and the
runtime once and forks a fresh child for every call. The child is the rank: a copy of a process
that has run no tensor op, started no thread and joined no group, so no state passes from one
call to the next (a test that patches the runtime patches its own child). The environment a
call would have had in a fresh process is checked against the pool's: if anything differs but
the port, the pool is started again in the new one. ``ZLAUNCH_TEST_FRESH_RANKS=1`` runs every
call in fresh processes instead.
"""

from __future__ import annotations

import ast
import atexit
import importlib.util
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["run_ranks", "RankFailed", "free_port", "rank_env"]

REPO = Path(__file__).resolve().parents[3]

# Preloaded by a pool before it forks when a target's file imports them: the costly imports.
_PRELOADABLE = ("transformers",)


class RankFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """This process's environment plus what a launcher gives rank ``rank`` of a local job."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    env.pop("ZLAUNCH_CONFIG", None)
    return env


class _FreshRank:
    """A rank in a process of its own, started for this call."""

    def __init__(self, rank: int, world_size: int, port: int, target: str, tmpdir: Path):
        self._proc = subprocess.Popen(
            [sys.executable, "-u", __file__, target, str(tmpdir)],
            env=rank_env(rank, world_size, port),
            cwd=str(REPO),
            stdout=(tmpdir / f"rank-{rank}.log").open("w"),
            stderr=subprocess.STDOUT,
        )

    def poll(self) -> int | None:
        return self._proc.poll()

    def kill(self) -> None:
        self._proc.kill()

    def wait(self) -> int:
        return self._proc.wait()


class _PoolProcess:
    """One rank's warm process: forks a child per call and reports its pid and exit code.

    Its stdin takes one JSON request per line; its stdout answers ``started PID`` and then
    ``exited CODE`` per request (a negative code is the signal that ended the child).
    """

    def __init__(self, rank: int, world_size: int):
        self.env = rank_env(rank, world_size, 0)
        self._proc = subprocess.Popen(
            [sys.executable, "-u", __file__, "--pool"],
            env=self.env,
            cwd=str(REPO),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            with self._cond:
                self._lines.append(line.strip())
                self._cond.notify_all()
        with self._cond:
            self._lines.append("eof")
            self._cond.notify_all()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def request(self, target: str, tmpdir: Path, port: int, preload: list[str]) -> str:
        """Ask for a child; the returned id tags this request's answers."""
        with self._cond:
            self._lines.clear()
        job = tmpdir.name
        message = {
            "id": job,
            "target": target,
            "tmpdir": str(tmpdir),
            "port": port,
            "preload": preload,
        }
        self._proc.stdin.write(json.dumps(message) + "\n")
        self._proc.stdin.flush()
        return job

    def answers(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    def close(self) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class _PooledRank:
    """A rank forked by its warm pool process for this call."""

    def __init__(self, pool: _PoolProcess, target: str, tmpdir: Path, port: int, preload):
        self._pool = pool
        self._pid: int | None = None
        self._code: int | None = None
        self._job = pool.request(target, tmpdir, port, preload)

    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        for answer in self._pool.answers():
            if answer == "eof":  # the pool process itself died: the rank with it
                self._code = -9
                break
            kind, job, value = answer.split(" ")
            if job != self._job:  # a late answer about an abandoned earlier call
                continue
            if kind == "started":
                self._pid = int(value)
            elif kind == "exited":
                self._code = int(value)
        return self._code

    def kill(self) -> None:
        while self.poll() is None and self._pid is None:
            time.sleep(0.01)
        if self._code is None:
            try:
                os.kill(self._pid, 9)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.01)
        return self._code


_pools: dict[int, list[_PoolProcess]] = {}


def _pool(world_size: int) -> list[_PoolProcess] | None:
    """The warm processes of this world size (None: run fresh, as the environment asks).

    A pool serves calls made in the environment it started with; when the test's
    environment has changed since (a module that sets a variable, a monkeypatched one), the
    pool is replaced by one started in the new environment, which costs what fresh processes
    would, once.
    """
    if os.environ.get("ZLAUNCH_TEST_FRESH_RANKS") == "1":
        return None
    pool = _pools.get(world_size)
    wanted = [_comparable(rank_env(rank, world_size, 0)) for rank in range(world_size)]
    if pool is not None and (
        not all(p.alive() for p in pool) or [_comparable(p.env) for p in pool] != wanted
    ):
        for process in pool:
            process.close()
        pool = None
    if pool is None:
        pool = [_PoolProcess(rank, world_size) for rank in range(world_size)]
        _pools[world_size] = pool
    return pool


def _comparable(env: dict[str, str]) -> dict[str, str]:
    """The environment less what pytest changes for every test."""
    return {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}


@atexit.register
def _close_pools() -> None:
    for pool in _pools.values():
        for process in pool:
            process.close()
    _pools.clear()


def _preloads(target: str) -> list[str]:
    """The costly packages the target's file imports (anywhere in it)."""
    path = REPO / target.rsplit(":", 1)[0]
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return [name for name in _PRELOADABLE if name in names]


def run_ranks(
    world_size: int, target: str, kwargs: dict[str, Any] | None = None, timeout: float = 180
) -> list[Any]:
    """Start ``world_size`` ranks running ``target(**kwargs)``; return the results by rank."""
    with tempfile.TemporaryDirectory(prefix="zl-mp-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "args.pkl").write_bytes(pickle.dumps(kwargs or {}))
        port = free_port()
        pool = _pool(world_size)
        if pool is None:
            procs = [_FreshRank(r, world_size, port, target, tmpdir) for r in range(world_size)]
        else:
            preload = _preloads(target)
            procs = [_PooledRank(p, target, tmpdir, port, preload) for p in pool]
        deadline = time.monotonic() + timeout
        # Poll so that one failed rank stops the others at once instead of leaving them
        # blocked in a collective until the gloo timeout.
        while any(p.poll() is None for p in procs):
            failed_early = any(p.poll() not in (None, 0) for p in procs)
            if failed_early or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                if not failed_early:
                    logs = "\n".join(
                        (tmpdir / f"rank-{r}.log").read_text()[-2000:] for r in range(world_size)
                    )
                    raise RankFailed(
                        f"{target} on {world_size} ranks timed out after {timeout}s; output:\n{logs}"
                    )
                break
            time.sleep(0.02)
        outputs = [(tmpdir / f"rank-{r}.log").read_text() for r in range(world_size)]
        failed = [(r, p.poll()) for r, p in enumerate(procs) if p.poll() != 0]
        failed.sort(key=lambda rc: rc[1] == -9)  # the ranks we killed are not the root cause
        if failed:
            r, code = failed[0]
            raise RankFailed(
                f"{target}: rank {r} exited with {code}; its output:\n{outputs[r][-6000:]}"
            )
        import torch

        return [torch.load(tmpdir / f"rank-{r}.pt", weights_only=False) for r in range(world_size)]


def _child(target: str, tmpdir: str) -> None:
    import torch

    torch.set_num_threads(1)
    path, func = target.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kwargs = pickle.loads((Path(tmpdir) / "args.pkl").read_bytes())
    result = getattr(module, func)(**kwargs)
    rank = int(os.environ["RANK"])
    torch.save(result, Path(tmpdir) / f"rank-{rank}.pt")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _serve_pool() -> None:
    """The warm process: import once, then fork one child per request read from stdin."""
    import torch
    import torch.distributed  # noqa: F401

    import runtime  # noqa: F401

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    for line in sys.stdin:
        request = json.loads(line)
        for name in request["preload"]:
            importlib.import_module(name)
        log = Path(request["tmpdir"]) / f"rank-{rank}.log"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                sys.stdin.close()
                os.environ["MASTER_PORT"] = str(request["port"])
                _child(request["target"], request["tmpdir"])
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(f"started {request['id']} {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exited {request['id']} {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--pool":
        _serve_pool()
    else:
        _child(sys.argv[1], sys.argv[2])
