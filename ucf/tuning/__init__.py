"""Schedule tuning on Optuna: ``ucf.tune`` and its result ``ucf.Tuned`` (docs/tuning.md).

Optuna and the other packages of the ``tune`` extra are imported when a tuning
run starts, so importing this package costs nothing extra.
"""

from ucf.tuning.result import Tuned
from ucf.tuning.study import tune

__all__ = ["Tuned", "tune"]
