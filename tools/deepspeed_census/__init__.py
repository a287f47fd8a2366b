"""What of DeepSpeed's API the clients people run reach, read from installed packages.

``python -m tools.deepspeed_census`` regenerates the bundled runtime's list of DeepSpeed's
engine attributes (``runtime/deepspeed_api/deepspeed/runtime/engine_names.py``) from the
installed DeepSpeed.
"""
