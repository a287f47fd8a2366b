"""``runtime.parallel_groups.ModelParallelGroups``: the path scripts write (the module is runtime.distributed.parallel_groups)."""

import sys

from runtime.distributed import parallel_groups

sys.modules[__name__] = parallel_groups
