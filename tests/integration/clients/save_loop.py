"""A training loop that never ends by itself: a step every 50 ms, ``steps N`` in ``./started``.

Plain (no flag) it knows nothing of zlaunch's save request, as a Trainer script does not.
With ``--handle`` it forms a gloo group and answers the request with
zlaunch.save_request.SaveRequest: at the step all ranks agree on, each rank writes
``rank-R.saved`` into ZLAUNCH_CHECKPOINT_DIR and exits 0.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> None:
    handle = "--handle" in sys.argv
    save = None
    if handle:
        import torch.distributed as dist

        from zlaunch.save_request import SaveRequest

        dist.init_process_group("gloo")
        save = SaveRequest()
    rank = os.environ.get("RANK", "0")
    step = 0
    while True:
        time.sleep(0.05)
        step += 1
        if rank == "0" and step == 3:
            Path("started").write_text(f"steps {step}\n")
        if save is not None and save.agreed():
            out = Path(os.environ["ZLAUNCH_CHECKPOINT_DIR"])
            out.mkdir(parents=True, exist_ok=True)
            (out / f"rank-{rank}.saved").write_text(f"step {step}\n")
            print(f"saved at step {step}", flush=True)
            return


if __name__ == "__main__":
    main()
