"""Tensors with sparsity attributes (SparTA's TeSA) and programs that propagate them.

``attribute`` holds :class:`TeSA`, ``program`` parses a program of statements into
its data-flow graph, ``rules`` turns a statement into the mask statements that
propagate pruning forward and backward, and ``propagation`` runs them to a fixpoint.
"""
