"""ucf's PyTorch layers: sparse attention over dynamic masks, and variable sequence
lengths. torch is imported on first use."""

from ucf.nn.attention import SparseAttention, attention
from ucf.nn.masks import causal, local, longformer

__all__ = ["SparseAttention", "attention", "causal", "local", "longformer"]
