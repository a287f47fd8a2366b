"""Write reference.json: the `cases.CASES` runs under torchrun with real DeepSpeed.

    python -m tests.integration.deepspeed_api.make_reference [CASE ...]   (needs deepspeed installed: the bench extra)

Per case (`cases.outcome`): the per-step losses and gradient norms, and the logits of the
saved model loaded with `from_pretrained` (the adapter's tensors for LoRA). `test_trainer.py` compares the bundled
runtime with these numbers, so the comparison needs no DeepSpeed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile

from tests.integration.deepspeed_api.cases import CASES, REFERENCE, outcome


def run_case(case, out: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    # The repository must be importable (the runtime is not used), the bundled API must not.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "deepspeed_api" not in p
    )
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={case.ranks}",
        "--standalone", case.script, *case.args(out),
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True)
    return outcome(case, out)


def main() -> None:
    """All cases, or those named on the command line (the others are kept as recorded)."""
    version = importlib.metadata.version("deepspeed")
    names = sys.argv[1:] or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        sys.exit(f"unknown case(s) {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    reference = {"deepspeed": version, "cases": {}}
    if os.path.exists(REFERENCE) and names != list(CASES):
        with open(REFERENCE) as f:
            reference["cases"] = json.load(f)["cases"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            reference["cases"][name] = run_case(CASES[name], os.path.join(tmp, name))
    with open(REFERENCE, "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")
    print(f"wrote {REFERENCE} (DeepSpeed {version})")


if __name__ == "__main__":
    main()
