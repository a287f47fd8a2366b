"""A rank that loads tampered checkpoints: every tampering must fail with
one CheckpointError before anything in the engine changed, and the engine must train on."""

from __future__ import annotations

import json
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from tests.integration.checkpoint.ckpt_worker import build, full_state, train_step  # noqa: E402


def _set(path: list, value):
    def change(manifest: dict) -> None:
        target = manifest
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


BIG_NDARRAY = {"__ndarray__": ["a"], "dtype": "U200000000", "shape": [1]}
TAMPERED = {
    "counters text": _set(["counters", "global_steps"], "abc"),
    "counters negative": _set(["counters", "skipped_steps"], -1),
    "rank_state not a state": _set(["rank_state", 0], {"python": [1, 2]}),
    "rank_state torch too short": _set(
        ["rank_state", 0, "torch"], {"__tensor__": [1, 2, 3], "dtype": "uint8", "shape": [3]}
    ),
    "lr text": _set(["optimizer", "param_groups", 0, "lr"], "fast"),
    "scheduler lr text": _set(["lr_scheduler", "base_lrs"], ["fast"]),
    "scalar state dtype": _set(
        ["optimizer", "scalar_state", 0, "values"],
        {"__dict__": [["step", {"__tensor__": [1], "dtype": "load", "shape": [1]}]]},
    ),
    "client ndarray bomb": _set(["client_state"], BIG_NDARRAY),
    "client tensor count": _set(
        ["client_state"], {"__tensor__": [1, 2], "dtype": "float32", "shape": [1000, 1000]}
    ),
}


def tampered_loads(tmp: str) -> dict:
    from runtime.checkpoint import CheckpointError

    engine = build(2)
    for _ in range(2):
        train_step(engine)
    good = os.path.join(tmp, "good")
    engine.save_checkpoint(good, client_state={"epoch": 1})
    train_step(engine)
    tag_dir = os.path.join(good, "global_step2")
    manifest_path = os.path.join(tag_dir, "manifest.json")
    original = open(manifest_path).read()
    out: dict = {}
    for name, change in TAMPERED.items():
        manifest = json.loads(original)
        change(manifest)
        with open(manifest_path, "w") as handle:
            json.dump(manifest, handle)
        before = full_state(engine.module)
        opt_before = [
            {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for s in engine.optimizer.optimizer.state.values()
        ]
        groups_before = [dict(g, params=None) for g in engine.optimizer.param_groups]
        steps_before = engine.global_steps
        try:
            engine.load_checkpoint(good)
            error = None
        except CheckpointError as err:
            error = str(err)
        except Exception as err:  # noqa: BLE001 - a foreign exception is what the test catches
            error = f"FOREIGN {type(err).__name__}: {err}"
        now = full_state(engine.module)
        opt_now = list(engine.optimizer.optimizer.state.values())
        unchanged = (
            all(torch.equal(now[k], before[k]) for k in before)
            and all(
                torch.equal(opt_now[i][k], v) if torch.is_tensor(v) else opt_now[i][k] == v
                for i, s in enumerate(opt_before)
                for k, v in s.items()
            )
            and [dict(g, params=None) for g in engine.optimizer.param_groups] == groups_before
            and engine.global_steps == steps_before
        )
        out[name] = (error, unchanged)
    with open(manifest_path, "w") as handle:
        handle.write(original)
    out["trains on"] = train_step(engine)
    out["good"] = engine.load_checkpoint(good)[1]
    return out
