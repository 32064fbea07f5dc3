"""Sparse layers for PyTorch, drop-ins for torch.nn modules (docs/training.md).

Importing this package imports torch.
"""

from ucf.nn.linear import DynamicSparseLinear, SparseLinear

__all__ = ["DynamicSparseLinear", "SparseLinear"]
