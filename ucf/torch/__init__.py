"""ucf kernels in PyTorch.

- ``ucf.torch.einsum(stmt, ..., **tensors)`` runs a statement on torch tensors and
  returns a torch tensor that is differentiable in every operand
  (``ucf/torch/differentiable.py``);
- ``ucf.torch.op(stmt, ...)`` registers a statement, and its gradients, as
  ``torch.library`` custom operators for ``torch.compile`` (``ucf/torch/ops.py``).

torch is imported on first use; without it these raise
:class:`ucf.MissingDependencyError` with the pip command.
"""

from ucf.torch.differentiable import einsum
from ucf.torch.ops import op

__all__ = ["einsum", "op"]
