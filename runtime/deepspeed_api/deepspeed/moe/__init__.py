"""``deepspeed.moe``: importable, for scripts that import it with mixture-of-experts off.

The bundled runtime has no expert parallelism: building a `layer.MoE` raises
`NotInBundledRuntime`. Without MoE layers a model has no expert parameters, so the helpers
scripts call unconditionally (`utils.has_moe_layers`, parameter-group splitting) answer as
DeepSpeed's do for such a model.
"""

from __future__ import annotations

from .._missing import module_getattr
from . import layer, utils

__all__ = ["layer", "utils"]
__getattr__ = module_getattr(__name__)
