"""ucf's PyTorch layers: sparse attention over dynamic masks, and variable sequence
lengths. torch is imported on first use."""

from ucf.nn.attention import SparseAttention, attention
from ucf.nn.masks import causal, local, longformer
from ucf.nn.varlen import Packed, PackedLinear, packed

__all__ = [
    "Packed",
    "PackedLinear",
    "SparseAttention",
    "attention",
    "causal",
    "local",
    "longformer",
    "packed",
]
