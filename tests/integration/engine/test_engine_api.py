"""The engine's API in one process (world size 1): initialize, config sources, client optimizer
and scheduler, the accumulation-misuse error, optimizer names, data loader, counters."""

from __future__ import annotations

import json
import types

import pytest
import torch

import runtime
from runtime.config import ConfigError
from runtime.engine.engine import AccumulationError
from tests.unit.engine.test_engine_api import single_process_group  # noqa: F401 - fixtures, shared with the unit half


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def config(**extra):
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    }
    cfg.update(extra)
    return cfg


def loss_of(engine, seed=0):
    g = torch.Generator().manual_seed(seed)
    return engine(torch.randn(2, 4, generator=g)).float().pow(2).mean()


def test_initialize_returns_engine_optimizer_loader_scheduler_and_counts():
    data = [(torch.randn(4), torch.randn(2)) for _ in range(10)]
    seen_batches = []

    def collate(items):
        seen_batches.append(len(items))
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    engine, opt, loader, sched = runtime.initialize(
        model=model(), config=config(), training_data=data, collate_fn=collate
    )
    assert opt is engine.optimizer and sched is None and loader is engine.training_dataloader
    assert (engine.world_size, engine.global_rank, engine.local_rank) == (1, 0, 0)
    assert engine.train_batch_size() == 4 and engine.train_micro_batch_size_per_gpu() == 2
    assert engine.gradient_accumulation_steps() == 2
    x, _ = next(iter(loader))
    assert x.shape == (2, 4) and seen_batches == [2]
    before = [p.detach().clone() for p in engine.module.parameters()]
    for i in range(4):
        assert engine.is_gradient_accumulation_boundary() == (i % 2 == 1)
        scaled = engine.backward(loss_of(engine, i))
        assert scaled.requires_grad
        engine.step()
        changed = any(
            not torch.equal(a, b) for a, b in zip(before, engine.module.parameters(), strict=True)
        )
        assert changed == (i >= 1)  # the first update happens at the first boundary
    assert (engine.micro_steps, engine.global_steps, engine.global_samples) == (4, 2, 8)
    assert engine.skipped_steps == 0
    assert engine.get_lr() == [0.01]
    assert engine.get_global_grad_norm() > 0
    assert engine.loss_scale == 1.0 and engine.loss_scale() == 1.0


def test_backward_returns_the_loss_divided_by_accumulation_steps():
    engine, *_ = runtime.initialize(model=model(), config=config())
    loss = loss_of(engine)
    assert torch.allclose(engine.backward(loss), loss / 2)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_backward_without_step_raises_a_clear_error(stage):
    engine, *_ = runtime.initialize(
        model=model(), config=config(zero_optimization={"stage": stage})
    )
    # The loop from the issue: steps only while global_steps % accum == 0.
    with pytest.raises(AccumulationError) as err:
        for i in range(8):
            engine.backward(loss_of(engine, i))
            if engine.global_steps % 2 == 0:
                engine.step()
    message = str(err.value)
    assert "engine.step() after" in message and "gradient_accumulation_steps=2" in message
    assert engine.global_steps == 1


def test_second_backward_after_the_boundary_reduction_is_refused():
    engine, *_ = runtime.initialize(model=model(), config=config(gradient_accumulation_steps=1))
    engine.backward(loss_of(engine))
    with pytest.raises(AccumulationError):
        engine.backward(loss_of(engine))


def test_config_from_path_args_and_environment(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config(gradient_accumulation_steps=3)))
    engine, *_ = runtime.initialize(model=model(), config=str(path))
    assert engine.gradient_accumulation_steps() == 3
    args = types.SimpleNamespace(deepspeed_config=str(path))
    engine, *_ = runtime.initialize(args=args, model=model())
    assert engine.gradient_accumulation_steps() == 3
    with pytest.raises(ConfigError, match="given twice"):
        runtime.initialize(args=args, model=model(), config=config())
    monkeypatch.setenv("ZLAUNCH_CONFIG", str(path))
    engine, *_ = runtime.initialize(model=model())
    assert engine.train_batch_size() == 6
    monkeypatch.delenv("ZLAUNCH_CONFIG")
    with pytest.raises(ConfigError, match="no config"):
        runtime.initialize(model=model())


def test_client_optimizer_and_scheduler_override_the_config():
    net = model()
    decay = [p for n, p in net.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in net.named_parameters() if n.endswith("bias")]
    opt = torch.optim.SGD(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=0.5,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    engine, eopt, _, esched = runtime.initialize(
        model=net, optimizer=opt, lr_scheduler=sched, config=config(gradient_accumulation_steps=1)
    )
    assert eopt.optimizer is opt and esched is sched
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    # Reference: plain SGD with the same groups on a copy.
    ref = model()
    rdecay = [p for n, p in ref.named_parameters() if n.endswith("weight")]
    rno = [p for n, p in ref.named_parameters() if n.endswith("bias")]
    ropt = torch.optim.SGD(
        [{"params": rdecay, "weight_decay": 0.1}, {"params": rno, "weight_decay": 0.0}], lr=0.5
    )
    rsched = torch.optim.lr_scheduler.StepLR(ropt, step_size=1, gamma=0.5)
    for i in range(3):
        engine.backward(loss_of(engine, i))
        engine.step()
        g = torch.Generator().manual_seed(i)
        loss = ref(torch.randn(2, 4, generator=g)).pow(2).mean()
        ropt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ropt.step()
        rsched.step()
    assert engine.get_lr() == [0.0625, 0.0625]
    for a, b in zip(engine.module.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_client_optimizer_and_scheduler_factories():
    calls = {}

    def make_opt(groups):
        calls["groups"] = groups
        return torch.optim.Adam(groups, lr=0.1)

    def make_sched(opt):
        calls["opt"] = opt
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)

    engine, eopt, _, sched = runtime.initialize(
        model=model(), optimizer=make_opt, lr_scheduler=make_sched, config=config()
    )
    assert isinstance(eopt.optimizer, torch.optim.Adam) and calls["opt"] is eopt.optimizer
    assert engine.get_lr() == [0.05]


def test_fp16_exposes_the_live_loss_scale():
    engine, *_ = runtime.initialize(
        model=model(), config=config(fp16={"enabled": True, "initial_scale_power": 12})
    )
    assert engine.loss_scale == 4096.0 and engine.loss_scale() == 4096.0
    assert next(engine.module.parameters()).dtype == torch.float16
    engine.backward(loss_of(engine))
    engine.step()
    engine.backward(loss_of(engine, 1))
    engine.step()
    assert engine.global_steps == 1 and engine.skipped_steps == 0


def test_import_runtime_is_light():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import sys, runtime; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_config_scheduler_is_built_and_does_not_step_on_accumulation():
    cfg = config(
        scheduler={
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": 0.01,
                "warmup_num_steps": 4,
                "warmup_type": "linear",
            },
        }
    )
    engine, _, _, sched = runtime.initialize(model=model(), config=cfg)
    lrs = []
    for i in range(6):
        engine.backward(loss_of(engine, i))
        engine.step()
        lrs.append(engine.get_lr()[0])
    assert sched is engine.lr_scheduler and sched.last_epoch == 3
    # the lr changes only at the accumulation boundaries (every second micro-step)
    assert lrs[1] == lrs[2] and lrs[3] == lrs[4]
    assert lrs[1] < lrs[3] < lrs[5]


def test_incomplete_distributed_environment_is_a_clear_error():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK="0", WORLD_SIZE="2")
    code = (
        "from runtime.distributed.launch_env import init_distributed, DistInitError\n"
        "try:\n    init_distributed()\nexcept DistInitError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "MASTER_ADDR, MASTER_PORT not set" in out.stdout, out.stderr


def test_fp16_overflow_skips_the_step_and_logs_one_line(caplog):
    engine, *_ = runtime.initialize(
        model=model(),
        config=config(gradient_accumulation_steps=1, fp16={"enabled": True, "hysteresis": 1}),
    )
    before = [p.detach().clone() for p in engine.module.parameters()]
    with caplog.at_level("WARNING", logger="runtime.optim.precision"):
        engine.backward(loss_of(engine) * float("inf"))
        engine.step()
    lines = [r.getMessage() for r in caplog.records if r.name == "runtime.optim.precision"]
    assert len(lines) == 1 and "skipping step" in lines[0] and "65536 -> 32768" in lines[0]
    assert engine.skipped_steps == 1 and engine.global_steps == 1
    assert engine.loss_scale == 32768.0 and engine.get_global_grad_norm() is None
    assert all(torch.equal(a, b) for a, b in zip(before, engine.module.parameters(), strict=True))


def test_a_resume_with_another_accumulation_count_starts_at_a_whole_step(tmp_path):
    """Saved after 4 micro-steps at 2 a step, resumed at 3 a step: the next optimizer step
    comes after 3 micro-steps, not 2 (the saved counter, 4, sits mid-step at 3)."""
    engine, *_ = runtime.initialize(model=model(), config=config())
    for i in range(4):
        engine.backward(loss_of(engine, i))
        engine.step()
    engine.save_checkpoint(str(tmp_path))
    resumed, *_ = runtime.initialize(
        model=model(), config=config(gradient_accumulation_steps=3, train_batch_size=6)
    )
    resumed.load_checkpoint(str(tmp_path))
    assert resumed.global_steps == 2
    steps = []
    for i in range(6):
        assert resumed.is_gradient_accumulation_boundary() == (i % 3 == 2)
        resumed.backward(loss_of(resumed, i))
        resumed.step()
        steps.append(resumed.global_steps)
    assert steps == [2, 2, 3, 3, 3, 4]
