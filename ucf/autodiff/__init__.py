"""Gradients of statements, derived by ucf in its own language (docs/training.md).

``derive`` writes the gradient of one operand as a statement; ``Backward`` holds
a statement's gradients, compiles each into a kernel of its own and runs it,
keeping a sparse, blocked, N:M or dynamic operand's pattern in its gradient;
``gradients(k)`` (``ucf.gradients``) is the ``Backward`` of a compiled kernel.
"""

from ucf.autodiff.backward import Backward, gradients
from ucf.autodiff.derive import Derived, derive

__all__ = ["Backward", "Derived", "derive", "gradients"]
