"""The DeepSpeed API a ported script calls, with DeepSpeed's semantics: init_distributed,
add_config_arguments, engine.no_sync, set_gradient_accumulation_boundary, was_step_applied,
get_mom, set_train_batch_size, and the deepspeed.comm-style functions (runtime.dist).

One process for the engine calls, two gloo ranks for what needs peers; where DeepSpeed is
installed, the same calls run on its engine in a subprocess and the answers must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import runtime
from runtime.engine.engine import AccumulationError
from tests.integration.engine.mp_utils import REPO, free_port, run_ranks

HERE = "tests/integration/engine/test_fidelity_api.py"


@pytest.fixture(autouse=True, scope="module")
def single_process_group():
    was = dist.is_initialized()
    yield
    if not was and dist.is_initialized():
        dist.destroy_process_group()


def make_engine(stage=0, gas=2, optimizer=None, **extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "steps_per_print": 10**6,
        "zero_optimization": {"stage": stage},
        "optimizer": optimizer or {"type": "AdamW", "params": {"lr": 0.01}},
        **extra,
    }
    engine, *_ = runtime.initialize(model=model, config=config)
    return engine


def batch(i: int) -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(100 + i))


def loss(engine, i: int) -> torch.Tensor:
    return engine(batch(i)).float().pow(2).mean()


def full_params(engine) -> list[torch.Tensor]:
    with runtime.zero.GatheredParameters(
        list(engine.module.parameters()), enabled=engine.zero_stage == 3
    ):
        return params_of(engine)


def params_of(engine) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.module.parameters()]


# --- engine calls ---------------------------------------------------------------------------------


def ours_answers() -> dict:
    """The same calls as DS_SCRIPT below, on this runtime's engine."""
    out = {}
    engine = make_engine()
    applied = []
    for _ in range(4):
        engine.backward(loss(engine, 0))
        engine.step()
        applied.append(engine.was_step_applied())
    out["applied"] = applied
    out["mom_adamw"] = [list(m) for m in engine.get_mom()]
    sgd = {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}
    out["mom_sgd"] = make_engine(optimizer=sgd).get_mom()
    engine.set_train_batch_size(8)
    out["after_set"] = [engine.train_batch_size(), engine.gradient_accumulation_steps()]
    try:
        engine.set_train_batch_size(3)
        out["set_bad"] = "accepted"
    except ValueError:
        out["set_bad"] = "ValueError"
    try:
        with make_engine(stage=2).no_sync():
            pass
        out["no_sync_stage2"] = "accepted"
    except AccumulationError:
        out["no_sync_stage2"] = "refused"
    engine = make_engine(gas=1)
    try:
        with engine.no_sync():
            engine.backward(loss(engine, 0))
            engine.step()
        out["step_in_no_sync"] = "accepted"
    except AccumulationError:
        out["step_in_no_sync"] = "refused"
    engine = make_engine(stage=1, gas=3)
    engine.set_gradient_accumulation_boundary(False)
    for i in range(2):
        engine.backward(loss(engine, i))
    engine.set_gradient_accumulation_boundary(True)
    engine.backward(loss(engine, 2))
    engine.step()
    out["manual_boundary"] = [engine.global_steps, engine.was_step_applied()]
    return out


EXPECTED = {
    "applied": [False, True, False, True],
    "mom_adamw": [[0.9, 0.999]],
    "mom_sgd": [0.9],
    "after_set": [8, 4],
    "set_bad": "ValueError",
    "no_sync_stage2": "refused",
    "step_in_no_sync": "refused",
    "manual_boundary": [1, True],
}

DS_SCRIPT = r"""
import json, os, logging
import torch, deepspeed
from tests.fixtures.deepspeed.no_jit import without_jit_ops
without_jit_ops()
logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
def make_engine(stage=0, gas=2, optimizer=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas,
           "steps_per_print": 10**6, "zero_optimization": {"stage": stage},
           "optimizer": optimizer or {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine
def loss(engine, i):
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(100 + i))
    return engine(x).float().pow(2).mean()
out = {}
engine = make_engine()
applied = []
for i in range(4):
    engine.backward(loss(engine, 0)); engine.step(); applied.append(engine.was_step_applied())
out["applied"] = applied
out["mom_adamw"] = [list(m) for m in engine.get_mom()]
out["mom_sgd"] = make_engine(optimizer={"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}).get_mom()
engine.set_train_batch_size(8)
out["after_set"] = [engine.train_batch_size(), engine.gradient_accumulation_steps()]
try:
    engine.set_train_batch_size(3); out["set_bad"] = "accepted"
except ValueError:
    out["set_bad"] = "ValueError"
try:
    with make_engine(stage=2).no_sync():
        pass
    out["no_sync_stage2"] = "accepted"
except AssertionError:
    out["no_sync_stage2"] = "refused"
engine = make_engine(gas=1)
try:
    with engine.no_sync():
        engine.backward(loss(engine, 0)); engine.step()
    out["step_in_no_sync"] = "accepted"
except AssertionError:
    out["step_in_no_sync"] = "refused"
engine = make_engine(stage=1, gas=3)
engine.set_gradient_accumulation_boundary(False)
for i in range(2):
    engine.backward(loss(engine, i))
engine.set_gradient_accumulation_boundary(True)
engine.backward(loss(engine, 2)); engine.step()
out["manual_boundary"] = [engine.global_steps, engine.was_step_applied()]
print("RESULT " + json.dumps(out))
"""


def test_engine_calls_answer_as_deepspeed_documents():
    assert ours_answers() == EXPECTED


@pytest.mark.slow
def test_engine_calls_answer_as_deepspeed_does():
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install '.[bench]' to compare with it)")
    env = dict(os.environ)
    env.update(
        DS_ACCELERATOR="cpu",
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
    )
    done = subprocess.run(
        [sys.executable, "-c", DS_SCRIPT],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(lines[-1][len("RESULT ") :]) == ours_answers()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_manual_boundary_equals_the_counted_accumulation(stage):
    counted = make_engine(stage=stage, gas=3)
    for i in range(3):
        counted.backward(loss(counted, i))
        counted.step()
    manual = make_engine(stage=stage, gas=3)
    manual.set_gradient_accumulation_boundary(False)
    for i in range(2):
        manual.backward(loss(manual, i))
    manual.set_gradient_accumulation_boundary(True)
    manual.backward(loss(manual, 2))
    manual.step()
    assert manual.global_steps == counted.global_steps == 1
    for a, b in zip(full_params(manual), full_params(counted), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    with pytest.raises(AccumulationError, match="without engine.step"):
        manual.backward(loss(manual, 3))  # reduced at the boundary: step() must come first
        manual.backward(loss(manual, 4))


def test_set_train_batch_size_moves_the_boundary():
    engine = make_engine(gas=2)
    engine.set_train_batch_size(6)
    applied = []
    for i in range(6):
        engine.backward(loss(engine, i))
        engine.step()
        applied.append(engine.was_step_applied())
    assert applied == [False, False, True, False, False, True]
    assert engine.global_samples == 12
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ValueError, match="positive multiple of"):
            engine.set_train_batch_size(bad)


def test_no_sync_is_not_reentrant_and_refused_at_stage_3():
    engine = make_engine(stage=1, gas=1)
    with engine.no_sync(), pytest.raises(AccumulationError, match="cannot be nested"):
        with engine.no_sync():
            pass
    with pytest.raises(AccumulationError, match="ZeRO stage 3"):
        with make_engine(stage=3).no_sync():
            pass


def test_get_mom_follows_one_cycle_momentum():
    scheduler = {
        "type": "OneCycle",
        "params": {
            "cycle_min_lr": 0.01,
            "cycle_max_lr": 0.1,
            "cycle_first_step_size": 2,
            "cycle_min_mom": 0.8,
            "cycle_max_mom": 0.9,
        },
    }
    engine = make_engine(gas=1, scheduler=scheduler)
    moms = [engine.get_mom()[0][0]]
    for i in range(2):
        engine.backward(loss(engine, i))
        engine.step()
        moms.append(engine.get_mom()[0][0])
    assert moms == pytest.approx([0.8, 0.85, 0.8])


# --- initialize, init_distributed, add_config_arguments --------------------------------------------


def test_add_config_arguments_feeds_initialize(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps({"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    )
    parser = runtime.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(path)])
    assert args.deepspeed is True and args.deepscale is False
    model = torch.nn.Linear(2, 2)
    engine, *_ = runtime.initialize(args=args, model=model)
    assert engine.train_batch_size() == 2
    old = parser.parse_args(["--deepscale_config", str(path)])  # the deprecated spelling
    engine, *_ = runtime.initialize(args=old, model=torch.nn.Linear(2, 2))
    assert engine.gradient_accumulation_steps() == 1
    both = parser.parse_args(["--deepscale_config", "a.json", "--deepspeed_config", "b.json"])
    with pytest.raises(runtime.config.ConfigError, match="pass only --deepspeed_config"):
        runtime.initialize(args=both, model=torch.nn.Linear(2, 2))


INIT_SCRIPT = r"""
import runtime, runtime.dist as d
try:
    d.get_rank()
except RuntimeError as err:
    print("BEFORE", err)
for bad in ({"dist_backend": "mpi"}, {"rank": 3}):
    try:
        runtime.init_distributed(**bad)
    except ValueError as err:
        print("REFUSED", sorted(bad))
runtime.init_distributed(dist_backend="gloo")
runtime.init_distributed()  # a second call is a no-op, as in DeepSpeed
print("AFTER", d.is_initialized(), d.get_rank(), d.get_world_size(), d.get_local_rank())
"""


def test_init_distributed_creates_the_group_once():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(
        [sys.executable, "-c", INIT_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("BEFORE the process group is not initialised; call runtime.init")
    assert out[1:3] == ["REFUSED ['dist_backend']", "REFUSED ['rank']"]
    assert out[3] == "AFTER True 0 1 0"


def test_config_notes_are_logged_once_from_rank_0_not_warned(
    caplog, recwarn, tmp_path, monkeypatch
):
    source = {
        "train_batch_size": 2,
        "gradient_clipping": "auto",
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    }
    with caplog.at_level("WARNING", logger="runtime.config"):
        runtime.initialize(model=torch.nn.Linear(2, 2), config=source)
    notes = [r.getMessage() for r in caplog.records if r.name == "runtime.config"]
    assert len(notes) == 1 and '"auto" for gradient_clipping' in notes[0]
    assert not [w for w in recwarn if issubclass(w.category, runtime.config.ConfigWarning)]
    # zlaunch validated this very file before launch and showed its notes: ranks stay quiet
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(source))
    monkeypatch.setenv("ZLAUNCH_CONFIG", str(path))
    caplog.clear()
    with caplog.at_level("WARNING", logger="runtime.config"):
        runtime.initialize(model=torch.nn.Linear(2, 2), config=str(path))
    assert not [r for r in caplog.records if r.name == "runtime.config"]


# --- two ranks: runtime.dist and no_sync ----------------------------------------------------------


def two_rank_calls() -> dict:
    import runtime.dist as d

    engine = make_engine(stage=1, gas=1)
    rank = d.get_rank()
    out = {"rank": rank, "world": d.get_world_size(), "local": d.get_local_rank()}
    t = torch.tensor([float(rank + 1)])
    d.all_reduce(t)
    out["sum"] = t.item()
    t = torch.tensor([float(rank + 1)])
    d.all_reduce(t, op=d.ReduceOp.AVG)
    out["avg"] = t.item()
    t = torch.tensor([float(rank + 1)])
    d.all_reduce(t, op=d.ReduceOp.MAX)
    out["max"] = t.item()
    t = torch.tensor([float(rank)])
    d.broadcast(t, src=1)
    out["broadcast"] = t.item()
    d.barrier()
    # no_sync: the backward inside moves no bytes; the one after reduces both
    before = engine.comm.stats.total_bytes
    with engine.no_sync():
        engine.backward(loss(engine, rank))
    out["bytes_in_no_sync"] = engine.comm.stats.total_bytes - before
    engine.backward(loss(engine, 10 + rank))
    engine.step()
    out["no_sync_params"] = params_of(engine)
    # the reference: both micro-batches in one backward
    ref = make_engine(stage=1, gas=1)
    ref.backward(loss(ref, rank) + loss(ref, 10 + rank))
    ref.step()
    out["ref_params"] = params_of(ref)
    return out


@pytest.mark.multirank
def test_dist_functions_and_no_sync_on_two_ranks():
    a, b = run_ranks(2, f"{HERE}:two_rank_calls", timeout=300)
    assert [(r["rank"], r["world"], r["local"]) for r in (a, b)] == [(0, 2, 0), (1, 2, 1)]
    for r in (a, b):
        assert (r["sum"], r["avg"], r["max"], r["broadcast"]) == (3.0, 1.5, 2.0, 1.0)
        assert r["bytes_in_no_sync"] == 0
        for p, q in zip(r["no_sync_params"], r["ref_params"], strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    for p, q in zip(a["no_sync_params"], b["no_sync_params"], strict=True):
        assert torch.equal(p, q)
