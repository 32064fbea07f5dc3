"""Tensors with sparsity attributes (SparTA's TeSA) and programs that propagate them.

``attribute`` holds :class:`TeSA`, ``program`` parses a program of statements into
its data-flow graph, ``rules`` turns a statement into the mask statements that
propagate pruning forward and backward, and ``propagation`` runs them to a fixpoint.
``rounding`` and ``cover`` split an attribute into parts that kernels run well:
widths the hardware has, aligned blocks of a few shapes, an N:M part.
"""

from ucf.tesa.cover import block_cover, nm_split
from ucf.tesa.rounding import bit_rounding

__all__ = ["bit_rounding", "block_cover", "nm_split"]
