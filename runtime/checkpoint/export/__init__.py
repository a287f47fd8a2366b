"""Convert a checkpoint of any readable format (this runtime's, DeepSpeed's) to another.

`convert(src, dst, to=...)` needs no process group and no engine; ``to`` is one of `TARGETS`:

* ``zlaunch``: this runtime's sharded format, optimizer state and all (`native`);
* ``hf``: a Hugging Face model folder for ``from_pretrained`` (`hf`);
* ``dcp``: torch distributed checkpoint files (`dcp`);
* ``safetensors``: one safetensors state dict (what ``zlaunch consolidate`` writes).

Nothing already there is lost and nothing half-written is ever seen (`target`): an output
that holds anything is replaced only with ``force``; folders are built privately beside the
output and switched in whole, a file is renamed over the old one once complete; an output that
is, or holds, the checkpoint read is refused (writing it would remove the source).
"""

from __future__ import annotations

from runtime.checkpoint.export.dispatch import (
    DTYPES,
    TARGETS,
    ConvertResult,
    convert,
    refuse_overlap,
)
from runtime.checkpoint.export.safetensors_stream import SafetensorsStream

__all__ = [
    "ConvertResult",
    "DTYPES",
    "SafetensorsStream",
    "TARGETS",
    "convert",
    "refuse_overlap",
]
