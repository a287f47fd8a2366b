"""Stage 3 when ranks run different modules: reported by name, never an abort, a hang or a
silently wrong step; mixture-of-experts layers trained whole (found, or declared).

The zoo (tests/cluster/zoo) checks that third-party architectures train right; these tests check what
happens when the ranks' executions differ, and the expert-layer detection on its own.
"""

from __future__ import annotations

import pytest

from tests.integration.runtime.mp_utils import run_ranks

HERE = "tests/integration/runtime/test_stage3_patterns.py"


@pytest.mark.multirank
def test_different_sizes_reported_before_the_collective():
    """In the first (verified) passes a mismatch is caught before the mismatched all-gather,
    which gloo would otherwise answer by aborting the process."""
    results = run_ranks(
        2, f"{HERE}:rank_runs_other_branch", {"b_out": 24, "diverge_at": 0}, timeout=60
    )
    for r in results:
        assert r["step"] == 0 and r["global_steps"] == 0
        assert "rank 0 gathered 'a'" in r["error"] and "rank 1 gathered 'b'" in r["error"]
        assert "set_z3_leaf_modules" in r["error"]


@pytest.mark.multirank
def test_same_sizes_reported_before_the_step():
    """After the verified passes, equal-size collectives of different modules pair up
    silently; the end-of-pass check reports it before the optimizer applies the step.

    Without prefetching or keeping, so that both ranks issue the same number of all-gathers:
    with them, the rank still on its recorded trace prefetches or keeps what the other
    fetches again, and an unverified pass then waits in a collective (the README's stage-3
    section says so)."""
    zero = {"stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 1}
    results = run_ranks(
        2, f"{HERE}:rank_runs_other_branch", {"b_out": 8, "diverge_at": 4, "zero": zero}, timeout=60
    )
    for r in results:
        assert r["step"] == 4 and r["global_steps"] == 4, r
        assert "'a'" in r["error"] and "'b'" in r["error"]


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
