"""``from zlaunch.save_request import SaveRequest``: the path scripts write (the module is zlaunch.worker.save_request)."""

import sys

from zlaunch.worker import save_request

sys.modules[__name__] = save_request
