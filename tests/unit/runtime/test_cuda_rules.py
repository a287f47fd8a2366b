"""torch's rules for CUDA and NCCL that a CPU can check: the device is chosen before the process
group and named to it (``device_id``: eager NCCL init), a group the script made itself gets
the visible device, the stage-3 order check hands its group tensors on the group's device
(NCCL refuses host tensors), and the save-on-signal flag costs no collective and no host read
of its own (it rides in the step's one all-reduce). The process-group calls are recorded, not
made."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from runtime.checkpoint.preempt import SaveOnSignal
from runtime.distributed import launch_env as dist_env
from runtime.optim.precision import StepRiders
from runtime.zero.stage3.sequence import CollectiveSequence


class FakeCuda:
    """What `init_distributed` asks of CUDA and torch.distributed, recorded in order."""

    def __init__(self, monkeypatch, devices: int, initialized: bool = False):
        self.calls: list[tuple] = []
        self.initialized = initialized
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: devices)
        monkeypatch.setattr(cuda, "set_device", lambda d: self.calls.append(("set_device", d)))
        monkeypatch.setattr(dist, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(dist, "init_process_group", self._init)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(dist_env.group_teardown, "tear_down_at_exit", lambda: None)
        monkeypatch.setattr(dist_env.group_teardown, "import_before_init", lambda: None)

    def _init(self, backend, **kwargs):
        self.calls.append(("init_process_group", backend, kwargs.get("device_id")))
        self.initialized = True


LAUNCHED = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


def test_the_device_is_set_and_named_before_the_nccl_group_is_made(monkeypatch):
    for name, value in LAUNCHED.items():
        monkeypatch.setenv(name, value)
    fake = FakeCuda(monkeypatch, devices=2)
    env = dist_env.init_distributed()
    assert fake.calls[:2] == [
        ("set_device", 1),
        ("init_process_group", "nccl", torch.device("cuda", 1)),
    ]
    assert env.device == torch.device("cuda", 1) and env.backend == "nccl"


def test_a_world_of_one_binds_its_group_to_the_device_too(monkeypatch):
    for name in (*LAUNCHED, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeCuda(monkeypatch, devices=1)
    dist_env.init_distributed()
    assert fake.calls[1] == ("init_process_group", "nccl", torch.device("cuda", 0))


def test_a_group_the_script_made_gets_the_one_visible_device(monkeypatch):
    # srun --gpus-per-task: LOCAL_RANK 3, and this task sees one GPU, its own.
    monkeypatch.setenv("LOCAL_RANK", "3")
    fake = FakeCuda(monkeypatch, devices=1, initialized=True)
    env = dist_env.init_distributed()
    assert env.device == torch.device("cuda", 0)
    assert fake.calls == [("set_device", torch.device("cuda", 0))]


class Stop(Exception):
    pass


class DeviceComm:
    """Two ranks on a device the host cannot read (``meta`` stands in for a GPU): records where
    each all-gather's tensors live, then stops the caller."""

    rank, world_size = 0, 2
    device = torch.device("meta")

    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    def all_gather(self, out, own, async_op=False):
        self.seen.append((out.device.type, own.device.type))
        raise Stop


def test_the_stage3_order_check_gathers_on_the_groups_device():
    comm = DeviceComm()
    sequence = CollectiveSequence(comm, units=[])
    with pytest.raises(Stop):
        sequence.end_pass("forward")  # the end-of-pass comparison
    with pytest.raises(Stop):
        sequence.record("fetch", unit=type("U", (), {"index": 0})())  # a verified pass
    assert comm.seen == [("meta", "meta"), ("meta", "meta")]


# -- the step's one host read: the save-on-signal flag rides in it ------------------------------


class NoCollectives:
    rank, world_size = 0, 2

    def all_reduce(self, tensor, async_op=False):
        raise AssertionError("the save flag ran a collective of its own")


class SavingEngine:
    """What the save hook reads of an engine, at an optimizer-step boundary."""

    micro_steps, global_steps, global_rank = 4, 4, 0
    comm = NoCollectives()

    def __init__(self):
        self.step_riders = StepRiders()

    def gradient_accumulation_steps(self):
        return 1

    def save_checkpoint(self):
        raise Stop  # the decision to save is what is tested


def _step(engine, hook, peer_flag: float) -> None:
    """The step's all-reduce over two ranks: this one's boarded values plus a peer's."""
    hook.board(engine.step_riders)
    local = engine.step_riders.take_local()
    engine.step_riders.set_sums([v + peer_flag for v in local.tolist()])
    hook.after_step(engine, outcome=object())


def test_the_save_request_rides_in_the_steps_all_reduce(monkeypatch):
    import signal

    monkeypatch.setattr(signal, "signal", lambda *a: None)
    hook = SaveOnSignal(signal.SIGUSR1)
    engine = SavingEngine()
    _step(engine, hook, peer_flag=0.0)  # nobody asked: no save, no collective
    with pytest.raises(Stop):
        _step(engine, hook, peer_flag=1.0)  # the peer got the signal: this rank saves too
