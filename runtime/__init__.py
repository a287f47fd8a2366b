"""zlaunch runtime: a DeepSpeed-compatible training engine with ZeRO stages 0-3.

Workers import this package; it never imports `zlaunch`.
"""
