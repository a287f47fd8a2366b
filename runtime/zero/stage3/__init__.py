"""ZeRO stage 3: parameters partitioned per module unit and gathered while the module runs.

`build` plans the units (`units`) and builds the `Stage3Strategy` the engine drives;
`coordinator` keeps the phases and the forward/backward decisions; beside it, one concept
each: `hooks` (which module fetches which units), `live` (fetch with prefetch, gather and
release under the live bound), `prefetch` (the pure planner), `grads` (reduce-scatter of
gradients), `access` (fetch on parameter read), `sequence` (collectives pair up across ranks),
`optimizer` (the step), `save` (16-bit weights gathered for saving).
"""

from __future__ import annotations

from runtime.zero.stage3.build import Stage3Strategy, build_stage3
from runtime.zero.stage3.save import consolidated_state_dict
from runtime.zero.stage3.units import Unit

__all__ = [
    "Stage3Strategy",
    "Unit",
    "build_stage3",
    "consolidated_state_dict",
]
