"""`communication_data_type`, `prescale_gradients` and `gradient_predivide_factor` on 2 gloo
ranks, on models nobody here wrote (torch's TransformerEncoder, Hugging Face Llama and
GPT-2 from tiny configs), and the one collective + one host read per optimizer step.

Each 16-bit run is compared with the same run in fp32 communication: the losses stay within
the bound docs/gradient-communication.md states (measured there), are not bit-identical (the
flag is honoured), and the gradient reduction sends exactly half the bytes.
"""

from __future__ import annotations

import pytest

from tests.integration.engine.mp_utils import run_ranks
from tests.integration.zero.comm_dtype_cases import RIDER_VALUES, STEPS, config

pytestmark = pytest.mark.multirank

HERE = "tests/integration/zero/test_comm_dtype.py"
WORLD = 2
# Largest relative loss deviation from the fp32-communication run over STEPS steps, per wire
# dtype: about 5x the largest measured (docs/gradient-communication.md: 3.7e-5 and 2.2e-5).
BOUND = {"bf16": 2e-4, "fp16": 1e-4}
# What the small all-reduce of every step sends at 2 ranks (a ring sends 2 (N-1)/N x 40 B).
RIDER_BYTES = 2 * (WORLD - 1) / WORLD * RIDER_VALUES * 8

CASES: dict[str, tuple[str, dict]] = {}
for _model, _stages in (("encoder", (0, 1, 2, 3)), ("llama", (0, 1, 2, 3)), ("gpt2", (2,))):
    for _stage in _stages:
        for _wire in (None, "bf16", "fp16"):
            _top = {"communication_data_type": _wire} if _wire else {}
            CASES[f"{_model}-{_stage}-{_wire}"] = (_model, config(_stage, **_top))
# bf16 training with fp32 on the wire: twice the bytes, the sum rounded once
CASES["llama-2-bf16train"] = ("llama", config(2, "bf16"))
CASES["llama-2-bf16train-fp32"] = ("llama", config(2, "bf16", communication_data_type="FP32"))
# gradient_predivide_factor where DeepSpeed reads it: stage 0, stage 2 without reduce-scatter
_NO_RS = {"stage": 2, "reduce_bucket_size": 4096, "reduce_scatter": False}
CASES["encoder-0-predivide3"] = ("encoder", config(0, gradient_predivide_factor=3))
CASES["encoder-2nors-None"] = ("encoder", {**config(2), "zero_optimization": _NO_RS})
CASES["encoder-2nors-predivide3"] = (
    "encoder",
    {**config(2, gradient_predivide_factor=3), "zero_optimization": _NO_RS},
)
# stage 1 with reduce-scatter ignores both keys, as DeepSpeed does
CASES["encoder-1-prescale"] = ("encoder", config(1, prescale_gradients=True))
CASES["encoder-1-predivide3"] = ("encoder", config(1, gradient_predivide_factor=3))


def worker(cases: dict) -> dict:
    import os

    import runtime
    from tests.integration.zero.comm_dtype_cases import step_syncs, train_case

    rank = int(os.environ["RANK"])
    out = {name: train_case(runtime, rank, model, cfg) for name, (model, cfg) in cases.items()}
    out["syncs"] = {stage: step_syncs(runtime, rank, stage) for stage in (0, 1, 2, 3)}
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks(WORLD, f"{HERE}:worker", {"cases": CASES}, timeout=600)


def _deviation(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def _reduce_bytes(case: dict, stage: int) -> float:
    """Bytes per step of the gradient reduction: the reduce-scatter, or (stage 0) the
    all-reduces less the step's small one."""
    if stage == 0:
        return case["bytes"]["all_reduce"] - RIDER_BYTES
    return case["bytes"]["reduce_scatter"]


@pytest.mark.parametrize("wire", ["bf16", "fp16"])
@pytest.mark.parametrize(
    "model,stage",
    [("encoder", s) for s in (0, 1, 2, 3)] + [("llama", s) for s in (0, 1, 2, 3)] + [("gpt2", 2)],
)
def test_16bit_wire_halves_bytes_and_stays_within_bound(results, model, stage, wire):
    for r in results:
        plain, lite = r[f"{model}-{stage}-None"], r[f"{model}-{stage}-{wire}"]
        assert _reduce_bytes(lite, stage) * 2 == _reduce_bytes(plain, stage)
        # the parameters' all-gather is not touched
        assert lite["bytes"].get("all_gather") == plain["bytes"].get("all_gather")
        assert lite["losses"][0] == plain["losses"][0]  # same start, same first batch
        assert lite["losses"] != plain["losses"], "the wire dtype made no difference"
        assert _deviation(lite["losses"], plain["losses"]) <= BOUND[wire]
        assert len(lite["losses"]) == STEPS
        assert plain["losses"][-1] < plain["losses"][0]  # it trains


def test_fp32_wire_under_bf16_doubles_bytes(results):
    for r in results:
        plain, wide = r["llama-2-bf16train"], r["llama-2-bf16train-fp32"]
        assert wide["bytes"]["reduce_scatter"] == 2 * plain["bytes"]["reduce_scatter"]
        # At 2 ranks the sum of two bf16 gradients is rounded once into the bf16 buffer
        # whichever dtype carried them, so the runs agree bit for bit (from 3 ranks on, the
        # fp32 wire sums before it rounds).
        assert wide["losses"] == plain["losses"]


@pytest.mark.parametrize(
    "plain,divided", [("0-None", "0-predivide3"), ("2nors-None", "2nors-predivide3")]
)
def test_predivide_factor_moves_the_division_only(results, plain, divided):
    for r in results:
        a, b = r[f"encoder-{plain}"], r[f"encoder-{divided}"]
        # divided by 3 before and multiplied by 3/2 after: other roundings, the same mean
        assert a["losses"] != b["losses"]
        assert _deviation(b["losses"], a["losses"]) <= 1e-5
        assert a["bytes"] == b["bytes"]


@pytest.mark.parametrize("case", ["encoder-1-prescale", "encoder-1-predivide3"])
def test_stage1_reduce_scatter_ignores_scaling_keys_as_deepspeed(results, case):
    for r in results:
        assert r[case]["losses"] == r["encoder-1-None"]["losses"]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_small_collective_and_one_host_read_per_step(results, stage):
    for r in results:
        syncs = r["syncs"][stage]
        steps = syncs["steps"]
        assert syncs["small_all_reduce"] == steps, syncs
        # Stage 3's own check that the ranks' collectives pair up (runtime.zero.stage3.
        # sequence) reads the host at the end of its two verified passes (steps 0 and 1);
        # after them it rides in the step's all-reduce: one host read per step, as elsewhere.
        own = [w for w in syncs["where"] if "stage3/sequence.py" not in w]
        assert len(own) == steps, syncs["where"]
        checks = [w for w in syncs["where"] if "stage3/sequence.py" in w]
        assert all(w.endswith("step 1") for w in checks), checks
        assert bool(checks) == (stage == 3), checks
