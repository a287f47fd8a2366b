"""Engine checkpoints across world sizes and stages, consolidation, and loads that must fail.

Real gloo ranks in fresh processes (tests/integration/engine/mp_utils.py). The reference run trains 4
ranks at stage 2 and saves at step 4; other world sizes and stages load that checkpoint and
continue. The global batch of each step is the same at every world size, so continuations
must match the reference within float reduction-order noise.
"""

from __future__ import annotations

import pytest
import torch

from runtime.checkpoint import consolidate_state_dict
from runtime.checkpoint.reader import CheckpointReader
from tests.integration.engine.mp_utils import run_ranks
from tests.unit.checkpoint.test_engine_checkpoint import RTOL  # shared with the unit half

WORKER = "tests/integration/checkpoint/ckpt_worker.py"
SAVE_AT, TOTAL = 4, 8


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    a, b, c = (str(root / n) for n in ("a", "b", "c"))
    ref = run_ranks(
        4,
        f"{WORKER}:save_then_continue",
        {"stage": 2, "save_dir": a, "save_at": SAVE_AT, "total": TOTAL},
    )
    load = f"{WORKER}:load_then_continue"
    to_2_stage1 = run_ranks(2, load, {"stage": 1, "load_dir": a, "total": TOTAL, "resave_dir": b})
    to_2_stage3 = run_ranks(2, load, {"stage": 3, "load_dir": a, "total": TOTAL, "resave_dir": c})
    stage3_to_4_stage1 = run_ranks(4, load, {"stage": 1, "load_dir": c, "total": TOTAL})
    stage1_to_1_stage0 = run_ranks(1, load, {"stage": 0, "load_dir": b, "total": TOTAL})
    return {
        "dirs": (a, b, c),
        "ref": ref,
        "4xS2->2xS1": to_2_stage1,
        "4xS2->2xS3": to_2_stage3,
        "2xS3->4xS1": stage3_to_4_stage1,
        "2xS1->1xS0": stage1_to_1_stage0,
    }


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / max(b.double().norm(), 1e-30))


@pytest.mark.parametrize("case", ["4xS2->2xS1", "4xS2->2xS3", "2xS3->4xS1", "2xS1->1xS0"])
def test_continuation_matches_the_uninterrupted_reference(runs, case):
    ref = runs["ref"][0]["final"]
    for rank_result in runs[case]:
        assert rank_result["start"] == SAVE_AT
        final = rank_result["final"]
        assert final.keys() == ref.keys()
        worst = max(rel_diff(final[k], ref[k]) for k in ref)
        assert worst <= RTOL, f"{case}: relative difference {worst:.3g}"
    # The reference really moved after the save: a continuation that ignored the checkpoint
    # (or reset the moments) could not land this close.
    at_save = runs["ref"][0]["at_save"]
    assert max(rel_diff(ref[k], at_save[k]) for k in ref) > 1e-3


def test_optimizer_moments_carry_over_exactly(runs):
    a, b, c = runs["dirs"]
    with CheckpointReader(consolidate_dir(a)) as src:
        assert src.world_size == 4 and src.state("zero_stage") == 2
        assert set(src.kinds) == {"param", "exp_avg", "exp_avg_sq"}
        for resaved, world, stage in ((b, 2, 1), (c, 2, 3)):
            with CheckpointReader(consolidate_dir(resaved)) as dst:
                assert dst.world_size == world and dst.state("zero_stage") == stage
                assert dst.state("counters") == src.state("counters")
                assert dst.state("lr_scheduler") == src.state("lr_scheduler")
                assert (
                    dst.state("optimizer")["scalar_state"] == src.state("optimizer")["scalar_state"]
                )
                for name in src.shapes:
                    for kind in src.kinds:
                        assert torch.equal(dst.read_full(name, kind), src.read_full(name, kind)), (
                            name,
                            kind,
                        )


def consolidate_dir(save_dir: str) -> str:
    from runtime.checkpoint.storage import resolve_checkpoint

    return resolve_checkpoint(save_dir, None)


def test_consolidated_state_equals_the_live_parameters_exactly(runs):
    live = runs["ref"][0]["at_save"]
    state, path = consolidate_state_dict(runs["dirs"][0])
    assert path.endswith(f"global_step{SAVE_AT}")
    assert state.keys() == live.keys()  # tied head weight included under its own name
    for k in live:
        assert state[k].dtype == live[k].dtype and torch.equal(state[k], live[k]), k
    # And the result loads into a fresh model with load_state_dict (strict).
    from tests.integration.checkpoint.ckpt_worker import make_model

    model = make_model()
    model.load_state_dict(state)
    assert torch.equal(model.head.weight, live["head.weight"])
    half, _ = consolidate_state_dict(runs["dirs"][0], dtype=torch.bfloat16)
    assert all(v.dtype == torch.bfloat16 for v in half.values())


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    return run_ranks(1, f"{WORKER}:error_cases", {"tmp": str(tmp_path_factory.mktemp("err"))})[0]


def test_missing_latest_warns_and_returns_none(errors):
    assert errors["no_latest"] == (None, None)
    assert any("no 'latest' file" in w for w in errors["no_latest_warning"])


def test_client_state_that_is_not_json_fails_before_writing(errors):
    assert "client_state['f']" in errors["client_error"]
    assert "bad_client" not in errors["bad_client_dir"]


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("corrupt", ["shard-00000-of-00001.safetensors", "corrupt"]),
        ("shape", ["manifest.json", "has shape"]),
        ("names", ["manifest.json", "does not match the model", "extra.weight"]),
    ],
)
def test_a_bad_checkpoint_is_a_clear_error_and_nothing_is_loaded(errors, key, words):
    message = errors[f"{key}_error"]
    for word in words:
        assert word in message, message
    assert errors[f"{key}_unchanged"]


def test_the_intact_checkpoint_loads_with_its_client_state(errors):
    path, client = errors["good"]
    assert path.endswith("global_step2")
    assert client == {"epoch": 1, "pos": (3, 4)}
    assert errors["good_steps"] == 2
