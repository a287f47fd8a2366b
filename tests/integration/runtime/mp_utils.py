"""Run a function on N gloo ranks in fresh processes and collect each rank's return value.

Each rank is a real subprocess started the way a launcher starts a worker (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment), so `runtime.initialize` sets the
process group up by itself. The function is named as ``"path/to/file.py:function"``; it is
called with the keyword arguments given and its return value comes back through a file
(torch.save). One thread per process keeps N ranks fair on a small machine.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_ranks", "RankFailed", "free_port", "rank_env"]

REPO = Path(__file__).resolve().parents[3]


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


def run_ranks(
    world_size: int, target: str, kwargs: dict[str, Any] | None = None, timeout: float = 180
) -> list[Any]:
    """Start ``world_size`` ranks running ``target(**kwargs)``; return the results by rank."""
    with tempfile.TemporaryDirectory(prefix="zl-mp-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "args.pkl").write_bytes(pickle.dumps(kwargs or {}))
        port = free_port()
        procs = []
        for rank in range(world_size):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-u", __file__, target, str(tmpdir)],
                    env=rank_env(rank, world_size, port),
                    cwd=str(REPO),
                    stdout=(tmpdir / f"rank-{rank}.log").open("w"),
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + timeout
        # Poll so that one failed rank stops the others at once instead of leaving them
        # blocked in a collective until the gloo timeout.
        while any(p.poll() is None for p in procs):
            failed_early = any(p.returncode not in (None, 0) for p in procs)
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
            time.sleep(0.05)
        outputs = [(tmpdir / f"rank-{r}.log").read_text() for r in range(world_size)]
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
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


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
