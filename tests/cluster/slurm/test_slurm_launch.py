"""zlaunch through Slurm and mpirun on the real Slurm test cluster (3 nodes x 2 slots).

Every "gone" is checked by listing each node's processes, never by trusting zlaunch or Slurm.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.slurm.cluster import unavailable_reason
from tests.integration.launcher import fake_worker

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or ""),
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FAKE = fake_worker.__file__
LINE = re.compile(r"^\[node1:0\] step\s+(\d+)\s+loss ([0-9.]+)", re.MULTILINE)
ZLAUNCH = [sys.executable, "-m", "zlaunch"]
TRAIN = [
    "examples/train_gpt.py", "--config", "examples/configs/zero2.json",
    "--steps", "10", "--print-every", "5", "--threads", "1", "--max-chars", "50000",
    "--n-layer", "1", "--d-model", "64", "--seq-len", "32",
]  # fmt: skip
ALLOC = ["-N3", "--ntasks-per-node=2"]
# Both ways of starting the agents: one srun step per node, and one srun for every node whose
# agents connect back over TCP (3 nodes is under auto's threshold: each test names its mode).
MODES = ["step-per-node", "one-step"]
by_mode = pytest.mark.parametrize("mode", MODES)


def _env(slurm) -> dict[str, str]:
    sub = str(slurm.net.subnet)
    return {
        "PYTHONPATH": REPO,
        "OMP_NUM_THREADS": "1",
        # what an MPI site sets once: mpirun's daemons talk over the cluster network
        "OMPI_MCA_oob_tcp_if_include": sub,
        "OMPI_MCA_btl_tcp_if_include": sub,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }


def _losses(out: str) -> list[tuple[str, str]]:
    return LINE.findall(out)


def _workers(slurm, marker: str) -> dict[str, list[int]]:
    """Pids whose command line holds ``marker``, per node."""
    found = {}
    for host in slurm.hosts:
        pids = [pid for pid, line in slurm.net.pids(host) if marker in line]
        if pids:
            found[host] = pids
    return found


def _task_pids(slurm) -> set[int]:
    return {pid for procs in slurm.tasks().values() for pid, _ in procs}


def _new_tasks(slurm, before: set[int]) -> dict[str, list[tuple[int, str]]]:
    """Slurm steps and zlaunch processes on the nodes that were not there ``before`` (an
    earlier test's leftovers, and what they keep starting, are not this job's)."""
    found = {}
    for host, procs in slurm.tasks().items():
        new = [
            (pid, line)
            for pid, line in procs
            if pid not in before and ("zlaunch" in line or "slurmstepd" in line)
        ]
        if new:
            found[host] = new
    return found


def _wait(predicate, timeout: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


@pytest.fixture(scope="module")
def ssh_losses(slurm, tmp_path_factory):
    """The same job launched over SSH on the same three nodes: the reference losses."""
    runs = tmp_path_factory.mktemp("ssh-runs")
    out = subprocess.run(
        [*ZLAUNCH, "--hostfile", slurm.net.hostfile(2), "--ssh-config", slurm.net.ssh_config,
         "--log-dir", str(runs), *TRAIN],
        cwd=REPO, env={**slurm.env, **_env(slurm)}, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "world size 6" in out.stdout
    losses = _losses(out.stdout)
    assert [s for s, _ in losses] == ["5", "10"], out.stdout
    return losses


@pytest.mark.multirank
@by_mode
def test_inside_salloc_zlaunch_trains_as_over_ssh(idle_slurm, ssh_losses, tmp_path, mode):
    # no --hostfile inside an allocation: the launcher is Slurm, the hosts its nodes
    out = idle_slurm.run(
        [
            "salloc",
            *ALLOC,
            "--chdir",
            REPO,
            *ZLAUNCH,
            "--slurm-mode",
            mode,
            "--log-dir",
            str(tmp_path),
            *TRAIN,
        ],
        env=_env(idle_slurm),
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "world size 6" in out.stdout
    logs = {p.parent.name for p in tmp_path.rglob("rank-*.log")}
    assert logs == {"node1", "node2", "node3"}  # rank logs per node, as over SSH
    assert _losses(out.stdout) == ssh_losses


@pytest.mark.multirank
def test_inside_sbatch_zlaunch_trains_as_over_ssh(idle_slurm, ssh_losses, tmp_path):
    log = tmp_path / "batch.out"
    command = " ".join([*ZLAUNCH, "--launcher", "slurm", "--log-dir", str(tmp_path), *TRAIN])
    out = idle_slurm.run(
        ["sbatch", "-W", *ALLOC, "--chdir", REPO, "-o", str(log), "--wrap", command],
        env=_env(idle_slurm),
        timeout=300,
    )
    text = log.read_text()
    assert out.returncode == 0, text[-3000:]
    assert _losses(text) == ssh_losses


@pytest.mark.multirank
@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs mpirun (apt-get install openmpi-bin)"
)
def test_launcher_mpi_trains_as_over_ssh(idle_slurm, ssh_losses, tmp_path):
    out = idle_slurm.run(
        ["salloc", *ALLOC, "--chdir", REPO, *ZLAUNCH, "--launcher", "mpi",
         "--log-dir", str(tmp_path), *TRAIN],
        env=_env(idle_slurm), timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert _losses(out.stdout) == ssh_losses


def _start(slurm, tmp_path, worker_args, *options, alloc=("salloc", *ALLOC), env=None):
    records = tmp_path / "records"
    argv = [*alloc, *ZLAUNCH, *options, "--log-dir", str(tmp_path / "runs"),
            FAKE, "--record-dir", str(records), *worker_args]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, env={**slurm.env, **_env(slurm), **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    ready = _wait(lambda: len(list(records.glob("rank-*.json"))) == 6, 60)
    if ready is None:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"the 6 ranks did not start:\n{out[-2000:]}\n{err[-2000:]}")
    return proc, records


@by_mode
def test_a_rank_failure_stops_every_node(idle_slurm, tmp_path, mode):
    before = _task_pids(idle_slurm)
    proc, records = _start(
        idle_slurm,
        tmp_path,
        ["--only-rank", "3", "--delay", "1", "--exit", "7", "--others", "hang"],
        "--slurm-mode",
        mode,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err[-3000:]
    assert "rank 3 on node2" in err
    assert _wait(lambda: not _workers(idle_slurm, str(records)), 10) is not None, _workers(
        idle_slurm, str(records)
    )
    # nothing of the job on any node: no agent, no srun step's task, no worker
    assert _wait(lambda: not _new_tasks(idle_slurm, before), 15) is not None, _new_tasks(
        idle_slurm, before
    )


@by_mode
def test_scancel_is_reported_as_such(idle_slurm, tmp_path, mode):
    proc, records = _start(idle_slurm, tmp_path, ["--hang"], "--slurm-mode", mode)
    jobs = idle_slurm.jobs()
    assert len(jobs) == 1
    assert idle_slurm.run(["scancel", jobs[0]]).returncode == 0
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Slurm cancelled" in err and "(scancel)" in err, err[-3000:]
    assert "failed rank" not in err  # not reported as a crash
    assert _wait(lambda: not _workers(idle_slurm, str(records)), 10) is not None


@by_mode
def test_zlaunch_killed_leaves_no_task_on_any_node(idle_slurm, tmp_path, mode):
    # An allocation that outlives zlaunch (a batch job holding the nodes), so only the agents'
    # own guarantee can clean up: Slurm sees nothing ending.
    hold = idle_slurm.run(["sbatch", "--parsable", *ALLOC, "-o", os.devnull, "--wrap", "sleep 600"])
    assert hold.returncode == 0, hold.stderr
    job = hold.stdout.strip().split(";")[0]
    try:
        assert _wait(
            lambda: "R" in idle_slurm.run(["squeue", "-h", "-j", job, "-o", "%t"]).stdout, 30
        )
        env = {
            "SLURM_JOB_ID": job,
            "SLURM_JOB_NODELIST": "node[1-3]",
            "SLURM_TASKS_PER_NODE": "2(x3)",
        }
        proc, records = _start(
            idle_slurm, tmp_path, ["--hang"], "--slurm-mode", mode, alloc=(), env=env
        )
        assert _workers(idle_slurm, str(records))
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        assert _wait(lambda: not _workers(idle_slurm, str(records)), 20) is not None, _workers(
            idle_slurm, str(records)
        )
        print(f"zlaunch SIGKILLed: every worker gone after {time.monotonic() - killed:.2f} s")
        proc.communicate(timeout=30)
        assert job in idle_slurm.jobs()  # Slurm did not end anything: the agents did
    finally:
        idle_slurm.run(["scancel", job])


def test_from_the_login_node_zlaunch_asks_slurm_for_the_nodes(idle_slurm, tmp_path):
    records = tmp_path / "records"
    # secrets on zlaunch's command line reach the ranks (salloc's own line holds them redacted)
    token, password = "ibsecret" + "7" * 8, "pa55" + "w" * 8
    secret_args = ["--db", f"postgres://app:{password}@db/x"]
    out = idle_slurm.run(
        [*ZLAUNCH, "--nodes", "3", "--partition", idle_slurm.partition, "--num-gpus", "2",
         "--env", f"NCCL_IB_TOKEN={token}", "--log-dir", str(tmp_path / "runs"), FAKE,
         "--record-dir", str(records), "--allreduce", *secret_args],
        env=_env(idle_slurm), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    ranks = [json.loads(p.read_text()) for p in sorted(records.glob("rank-*.json"))]
    assert len(ranks) == 6
    assert {r["hostname"] for r in ranks} == {"node1", "node2", "node3"}
    assert all(r["allreduce"] == 21 for r in ranks)  # 1 + 2 + ... + 6
    assert all(r["env"]["NCCL_IB_TOKEN"] == token and r["argv"][-2:] == secret_args for r in ranks)
    # salloc's command line held them redacted (tests/integration/text/test_secrets.py):
    # the whole values came through its environment, which the zlaunch inside emptied
    assert not any(name.startswith("ZLAUNCH_SALLOC_") for r in ranks for name in r["env"])


@by_mode
def test_max_restarts_starts_new_steps_in_the_same_allocation(idle_slurm, tmp_path, mode):
    records = tmp_path / "records"
    out = idle_slurm.run(
        ["salloc", *ALLOC, *ZLAUNCH, "--slurm-mode", mode, "--max-restarts", "1",
         "--log-dir", str(tmp_path / "runs"),
         FAKE, "--record-dir", str(records), "--only-rank", "4", "--delay", "2", "--exit", "3"],
        env=_env(idle_slurm), timeout=120,
    )  # fmt: skip
    # --delay: rank 4 fails 2 s after its record, so every rank of the attempt has written its
    # own before the stop (a loaded machine starts six Python processes slowly)
    assert out.returncode == 3, out.stderr[-3000:]
    assert "restarting all ranks (attempt 1, 0 restart(s) left)" in out.stderr
    ranks = [json.loads(p.read_text()) for p in sorted(records.glob("rank-*.json"))]
    assert len(ranks) == 6 and all(r["env"]["ZLAUNCH_ATTEMPT"] == "1" for r in ranks)
    assert not _workers(idle_slurm, str(records))


@by_mode
def test_every_rank_gets_exactly_its_environment(idle_slurm, tmp_path, mode):
    records = tmp_path / "records"
    out = idle_slurm.run(
        ["salloc", *ALLOC, "--chdir", REPO, *ZLAUNCH, "--slurm-mode", mode,
         "--log-dir", str(tmp_path / "runs"), FAKE, "--record-dir", str(records)],
        env=_env(idle_slurm), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    ranks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in records.glob("*.json")}
    assert sorted(ranks) == list(range(6))
    for rank, record in ranks.items():
        env = record["env"]
        assert record["hostname"] == f"node{rank // 2 + 1}"
        assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")} == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % 2),
            "WORLD_SIZE": "6",
            "NODE_RANK": str(rank // 2),
        }
        assert env["MASTER_ADDR"] == "node1" and env["ZLAUNCH_ATTEMPT"] == "0"
        assert not [k for k in env if "CONNECT_TOKEN" in k]  # the agents' secret stays theirs
    assert not _workers(idle_slurm, str(records))


def test_one_step_names_the_node_whose_agent_could_not_start(idle_slurm, tmp_path):
    # node2 has no usable Python: its task exits at once, the others connect; the start fails
    # naming node2 with its last words, without waiting out the connect timeout
    python = tmp_path / "python-on-nodes"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$SLURMD_NODENAME" = node2 ]; then echo "no python on node2" >&2; exit 4; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    before = _task_pids(idle_slurm)
    started = time.monotonic()
    out = idle_slurm.run(
        ["salloc", *ALLOC, "--chdir", REPO, *ZLAUNCH, "--slurm-mode", "one-step",
         "--python", str(python), "--log-dir", str(tmp_path / "runs"), FAKE],
        env=_env(idle_slurm), timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "the agent on node2 did not connect back to" in out.stderr, out.stderr[-3000:]
    assert "no python on node2" in out.stderr
    assert time.monotonic() - started < 45  # not the 60 s connect timeout
    assert _wait(lambda: not _new_tasks(idle_slurm, before), 15) is not None, _new_tasks(
        idle_slurm, before
    )


def test_one_step_srun_killed_loses_every_agent_and_leaves_nothing(idle_slurm, tmp_path):
    # the one srun is every node's link: when it dies, every agent is lost at once (not after
    # a TCP timeout), the job fails saying so, and the agents stop their workers on every node
    before = _task_pids(idle_slurm)
    proc, records = _start(idle_slurm, tmp_path, ["--hang"], "--slurm-mode", "one-step")
    # this job's sruns: an earlier test's may still be exiting on a busy machine
    sruns = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit()
        and "--job-name=zlaunch-agents-" in _cmdline(int(pid))
        and _descends_from(int(pid), proc.pid)
    ]
    # srun itself, not the helper it forks (the helper's parent is srun)
    main = [pid for pid in sruns if _parent(pid) not in sruns]
    assert len(main) == 1, sruns
    os.kill(main[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, err[-3000:]
    assert "connection to the agent lost" in err, err[-3000:]
    assert "srun (the one step of every node's agent) ended: killed by SIGKILL" in err
    assert _wait(lambda: not _workers(idle_slurm, str(records)), 15) is not None, _workers(
        idle_slurm, str(records)
    )
    assert _wait(lambda: not _new_tasks(idle_slurm, before), 20) is not None, _new_tasks(
        idle_slurm, before
    )


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        pid = _parent(pid)
        if pid == ancestor:
            return True
    return False


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0
