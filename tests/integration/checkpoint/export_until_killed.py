"""``python -m tests.integration.checkpoint.export_until_killed SRC DST HF_CONFIG READY``:
export SRC to DST (``--to hf``, one shard per tensor, ``force``), and once half of the bytes
are written touch READY and wait there to be killed."""

from __future__ import annotations

import sys
import time

from runtime.checkpoint.export import convert


def main(src: str, dst: str, hf_config: str, ready: str) -> None:
    def progress(total: int):
        written = [0]

        def step(n: int) -> None:
            written[0] += n
            if written[0] * 2 >= total:
                open(ready, "w").close()
                time.sleep(600)  # killed here, half-way through the shards

        return step

    convert(src, dst, "hf", hf_config=hf_config, max_shard_bytes=1, force=True, progress=progress)


if __name__ == "__main__":
    main(*sys.argv[1:])
