"""zlaunch: start, watch and stop multi-node PyTorch training jobs.

The controller side. It never imports torch or the runtime at import time, so the CLI
starts fast; modules that need heavy packages import them where they are used.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
