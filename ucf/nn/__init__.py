"""Sparse layers for PyTorch, drop-ins for torch.nn modules (docs/training.md), sparse
attention over dynamic masks and variable sequence lengths (docs/attention.md).

Importing this package imports torch.
"""

from ucf.nn.attention import SparseAttention, attention
from ucf.nn.attention_masks import causal, local, longformer
from ucf.nn.linear import DynamicSparseLinear, SparseLinear
from ucf.nn.varlen import Packed, PackedLinear, packed

__all__ = [
    "DynamicSparseLinear",
    "Packed",
    "PackedLinear",
    "SparseAttention",
    "SparseLinear",
    "attention",
    "causal",
    "local",
    "longformer",
    "packed",
]
