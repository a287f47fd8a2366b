"""``deepspeed.ops.adagrad``: not served by the bundled runtime (DeepSpeed's compiled CPU kernel).

accelerate imports ``DeepSpeedCPUAdagrad`` only when optimizer offload meets a torch adagrad-family optimizer;
asking for it raises NotInBundledRuntime with the way out.
"""

from __future__ import annotations

from ..._missing import module_getattr

__all__: list[str] = []
__getattr__ = module_getattr(__name__)
