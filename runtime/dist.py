"""``import runtime.dist as dist``: DeepSpeed's ``deepspeed.comm`` for scripts (the module is runtime.distributed.script_comm)."""

import sys

from runtime.distributed import script_comm

sys.modules[__name__] = script_comm
