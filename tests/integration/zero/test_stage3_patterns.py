"""Stage 3 when ranks run different modules: reported by name, never an abort, a hang or a
silently wrong step; mixture-of-experts layers trained whole (found, or declared).

The zoo (tests/cluster/zoo) checks that third-party architectures train right; these tests check what
happens when the ranks' executions differ, and the expert-layer detection on its own.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.engine.mp_utils import run_ranks

HERE = "tests/integration/zero/test_stage3_patterns.py"
CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 1000,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}


class Branchy(torch.nn.Module):
    """``inp -> a or b -> head``; which branch runs is decided by the caller."""

    def __init__(self, b_out: int):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(8, 8)
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, b_out)
        self.head = torch.nn.Linear(8, 1)
        self.use_b = False

    def forward(self, x):
        h = self.inp(x)
        h = self.b(h)[:, :8] if self.use_b else self.a(h)
        return self.head(h)


def rank_runs_other_branch(b_out: int, diverge_at: int, zero: dict | None = None) -> dict:
    """Rank 1 takes branch b from step ``diverge_at`` on; what each rank saw."""
    import torch.distributed as dist

    import runtime
    from runtime.zero.stage3.sequence import RankMismatchError

    model = Branchy(b_out)
    config = dict(CONFIG, zero_optimization={**CONFIG["zero_optimization"], **(zero or {})})
    engine, *_ = runtime.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(2, 8)
    for step in range(6):
        model.use_b = dist.get_rank() == 1 and step >= diverge_at
        where = "backward"
        masters = [m.detach().clone() for m in engine.optimizer.master]
        try:
            engine.backward(engine(x).pow(2).mean())
            where = "step"
            engine.step()
        except RankMismatchError as e:
            unchanged = all(
                torch.equal(a, b) for a, b in zip(masters, engine.optimizer.master, strict=True)
            )
            return {
                "error": str(e),
                "step": step,
                "where": where,
                "global_steps": engine.global_steps,
                "masters_unchanged": unchanged,
            }
    return {"error": None, "step": 6, "global_steps": engine.global_steps}


@pytest.mark.multirank
def test_different_sizes_reported_before_the_collective():
    """In the first (verified) passes a mismatch is caught before the mismatched all-gather,
    which gloo would otherwise answer by aborting the process."""
    results = run_ranks(
        2, f"{HERE}:rank_runs_other_branch", {"b_out": 24, "diverge_at": 0}, timeout=60
    )
    for r in results:
        assert (r["step"], r["where"], r["global_steps"]) == (0, "backward", 0)
        assert "rank 0 gathered 'a'" in r["error"] and "rank 1 gathered 'b'" in r["error"]
        assert "set_z3_leaf_modules" in r["error"]


@pytest.mark.multirank
def test_same_sizes_reported_before_the_step():
    """After the verified passes, equal-size collectives of different modules pair up
    silently; the end-of-pass check, riding in the step's gradient-norm all-reduce, reports it
    before the optimizer applies anything: no step counted, the master weights untouched.

    Without prefetching or keeping, so that both ranks issue the same number of all-gathers:
    with them, the rank still on its recorded trace prefetches or keeps what the other
    fetches again, and an unverified pass then waits in a collective (docs/runtime.md's stage-3
    section says so)."""
    zero = {"stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 1}
    results = run_ranks(
        2, f"{HERE}:rank_runs_other_branch", {"b_out": 8, "diverge_at": 4, "zero": zero}, timeout=60
    )
    for r in results:
        assert (r["step"], r["where"], r["global_steps"]) == (4, "step", 4), r
        assert r["masters_unchanged"], r
        assert "'a'" in r["error"] and "'b'" in r["error"]


def switch_with_leaves(mode: str) -> dict:
    """Train the zoo's Switch Transformers MoE at stage 3: experts auto-detected ("auto"),
    declared ("declared"), or neither ("none": detection switched off)."""
    import runtime
    import runtime.zero.leaf_modules as leaf_modules
    from runtime.zero.stage3.sequence import RankMismatchError
    from tests.cluster.zoo import training
    from tests.cluster.zoo.models import ZOO

    model = ZOO["switch_moe"].build()
    if mode != "auto":
        leaf_modules.find_expert_leaves = lambda module: {}
    if mode == "declared":
        from transformers.models.switch_transformers import modeling_switch_transformers as sw

        runtime.zero.set_z3_leaf_modules(model, [sw.SwitchTransformersSparseMLP])
    try:
        results = training.train_model_on_ranks(model, "switch_moe", stage=3)
    except RankMismatchError as e:
        return {"error": str(e)}
    return {"error": None, "losses": results["losses"]}


@pytest.mark.multirank
def test_moe_trains_with_experts_found_or_declared_and_reports_otherwise():
    pytest.importorskip("transformers")
    from tests.cluster.zoo.training import WORLD, reference

    ref_losses, _, _ = reference("switch_moe")
    for mode in ("declared", "none"):
        results = run_ranks(WORLD, f"{HERE}:switch_with_leaves", {"mode": mode}, timeout=300)
        if mode == "none":
            for r in results:
                assert "experts.expert_" in r["error"], r
            continue
        per_rank = [r["losses"] for r in results]
        gas = len(per_rank[0]) // len(ref_losses)
        for s, want in enumerate(ref_losses):
            got = sum(per_rank[r][s * gas + m] for r in range(WORLD) for m in range(gas))
            assert abs(got / (WORLD * gas) - want) <= 1e-4 * abs(want)


def sequence_gathers(steps: int, gas: int) -> dict:
    """Train Branchy (every rank on branch a) with the comms logger; the small all-gathers."""
    import runtime

    model = Branchy(8)
    config = dict(
        CONFIG, gradient_accumulation_steps=gas, comms_logger={"enabled": True, "verbose": False}
    )
    engine, *_ = runtime.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(2, 8)
    for _ in range(steps * gas):
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    return {"rows": engine.comms_summary(show=False)}


@pytest.mark.multirank
def test_the_sequence_check_rides_in_the_step_once_passes_agree():
    """After the two verified passes, a pass that ends an accumulation sends no collective of
    its own for the check: the end-of-pass all-gathers (3 int64 per rank, 48 bytes gathered)
    stay at two however many steps run; accumulation micro-steps still check at their end."""
    results = run_ranks(2, f"{HERE}:sequence_gathers", {"steps": 6, "gas": 1}, timeout=60)
    accumulating = run_ranks(2, f"{HERE}:sequence_gathers", {"steps": 3, "gas": 2}, timeout=60)

    def end_of_pass_gathers(rows):
        return sum(r["count"] for r in rows if r["kind"] == "all_gather" and r["size"] == 48)

    assert [end_of_pass_gathers(r["rows"]) for r in results] == [2, 2]
    # 6 passes: the first two verified, then two micro-steps that do not end a step
    assert [end_of_pass_gathers(r["rows"]) for r in accumulating] == [4, 4]
