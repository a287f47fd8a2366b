"""Resuming the DeepSpeed corpus (checkpoints real DeepSpeed 0.19.8 wrote of small models on a
grid of ZeRO stages, world sizes, precisions and optimizers: tests/fixtures/deepspeed/corpus)
with this runtime at world sizes 1-4, at the stage it was saved at and at another: the next
steps' losses must be the ones DeepSpeed's own continuation gave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.deepspeed.corpus_cases import CASES, RESUME_STEPS
from tests.integration.engine.mp_utils import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.slow]

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed" / "corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
WORKER = "tests/integration/checkpoint/ds_corpus_worker.py"
# fp32: float reduction order only. bf16: the first step after the load is the loaded weights'
# loss (DeepSpeed's to 1e-7); the next ones are bf16 arithmetic rounded elsewhere, amplified
# by Adam's normalised steps on a model this small: DeepSpeed's own continuations of the same
# bf16 run at other stages and world sizes differ from each other by up to 3.3e-4.
TOLERANCE = {"fp32": 2e-6, "bf16": 5e-4}
FIRST_STEP = {"fp32": 2e-6, "bf16": 1e-5}


def test_the_corpus_is_deepspeeds_and_complete():
    assert EXPECTED["deepspeed"] == "0.19.8"
    assert sorted(EXPECTED["cases"]) == sorted(CASES)


def _other_stage(stage: int, world: int) -> int:
    """Another ZeRO stage, a different one at each world size."""
    others = [s for s in (1, 2, 3) if s != stage]
    return others[world % 2]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_checkpoint_resumes_with_deepspeeds_own_losses(world):
    runs = [(case, spec.stage) for case, spec in sorted(CASES.items())]
    runs += [(case, _other_stage(spec.stage, world)) for case, spec in sorted(CASES.items())]
    got = run_ranks(
        world,
        f"{WORKER}:resume",
        {"corpus": str(CORPUS), "runs": runs, "steps": RESUME_STEPS},
        timeout=300,
    )[0]
    failures = []
    for case, stage in runs:
        result = got[f"{case}@z{stage}"]
        expected = EXPECTED["cases"][case]["after"]
        if "error" in result:
            failures.append(f"{case} at ZeRO-{stage}: {result['error']}")
            continue
        precision = CASES[case].precision
        diff = max(abs(a - b) for a, b in zip(result["losses"], expected, strict=True))
        first = abs(result["losses"][0] - expected[0])
        if (
            diff >= TOLERANCE[precision]
            or first >= FIRST_STEP[precision]
            or result["global_steps"] != 3
        ):
            failures.append(f"{case} at ZeRO-{stage}: {result} vs DeepSpeed's {expected}")
    assert not failures, "\n".join(failures)


# The precisions whose fp32 masters safe_get_full_fp32_param reads back: all of them (under
# bf16 it returns the optimizer's fp32 master, as DeepSpeed's does, not the bf16 parameter).
MASTERS_READ = ("fp32", "bf16")


@pytest.mark.parametrize("world", [1, 3])
def test_the_loaded_masters_are_deepspeeds_own_consolidated_fp32(world, monkeypatch):
    """After the load and before any step, every fp32 master equals, bit for bit, what
    DeepSpeed's own zero_to_fp32 reconstructs from the same files (the reference is DeepSpeed's
    reader, not ours), at the checkpoint's stage and another, at a world size it was not saved
    at for most cases. Frozen parameters are not in DeepSpeed's fp32 state; they are checked by
    the losses above."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    cases = {case: spec for case, spec in sorted(CASES.items()) if spec.precision in MASTERS_READ}
    runs = [(case, spec.stage) for case, spec in cases.items()]
    runs += [(case, _other_stage(spec.stage, world)) for case, spec in cases.items()]
    got = run_ranks(world, f"{WORKER}:masters", {"corpus": str(CORPUS), "runs": runs}, timeout=300)[
        0
    ]
    mismatched = []
    for case, stage in runs:
        reference = get_fp32_state_dict_from_zero_checkpoint(str(CORPUS / case))
        loaded = got[f"{case}@z{stage}"]
        assert set(reference) <= set(loaded), (case, sorted(set(reference) - set(loaded)))
        for name, value in reference.items():
            if value.flatten().tolist() != loaded[name]:
                mismatched.append(f"{case} at ZeRO-{stage}: {name}")
    assert not mismatched, "\n".join(mismatched)
