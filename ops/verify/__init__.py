"""`rollout verify`, the offline regression gate between the baseline and the optimized variant.

`verify` is the command (ops.verify.command: judge, store, print, exit code); the measurement
itself, with torch and transformers, is ops.verify.runner, imported only when the command runs;
ops.verify.report is its report. Importing this package imports no torch.
"""

from ops.verify.command import verify

__all__ = ["verify"]
