"""A sparse operand's gradient computed on the output gradient's positions, where they
are the operand's own.

The gradient of a sparse operand lives on its pattern: the derived statement multiplies
every term by ``pattern_<wrt>``, ones at its stored positions (``ucf.autodiff.derive``).
When the output is sparse too, its gradient is a second sparse operand, and the kernel
intersects the two, which also costs a pass that counts the output's entries first. An
output that stores exactly the operand's positions, as an SDDMM's does (``A(i,j) =
B(i,j) * C(i,k) * D(k,j)``: A holds B's entries), makes the pattern redundant: without
it the output's gradient is the one sparse operand, read in the operand's format with
the operand's variables, and the gradient comes out position for position on it, in one
pass (``ucf.lower.assembly``'s same structure). The gradient of B at 10k rows of 10, K =
1, one thread, CPU time, load 6.5: 0.444 ms a kernel call with the pattern, 0.250
without; 100k rows: 6.71 and 3.86 ms.

The positions are compared on every call, by value unless they are the very arrays
(the forward result's index arrays are its own copies of the operand's): arrays found
equal once may be written in place before the next call, and a gradient computed on the
operand's positions from other ones would be wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.autodiff.derive import derive
from ucf.format.tensor import Tensor
from ucf.lang.ast import accesses


class OnPositions:
    """For each sparse operand whose gradient can skip its pattern, the derived statement
    without it and its kernel."""

    def __init__(self, back: Any):
        """``back``: the ``ucf.autodiff.backward.Backward`` whose gradients these are (it
        imports this module)."""
        self.back = back
        self._kernels: dict[str, Any] = {}
        self._applies: dict[str, bool] = {}

    def applies(self, wrt: str) -> bool:
        """Whether ``wrt``'s gradient may be computed on the output gradient's positions
        when they are ``wrt``'s: a sparse output in ``wrt``'s structure, indexed as the
        one read of ``wrt`` is, no dynamic operand, no schedule given for ``wrt`` (it was
        written for the statement with the pattern), and a derived statement that reads
        no hoisted sum, range or extent of its own."""
        if wrt not in self._applies:
            self._applies[wrt] = self._static(wrt)
        return self._applies[wrt]

    def _static(self, wrt: str) -> bool:
        b = self.back
        out, fmt = b.output_format, b.formats[wrt]
        if out is None or fmt.is_dense or b.dynamic or wrt in b.schedules:
            return False
        if out.structure != fmt.structure:
            return False
        reads = [a for a in accesses(b.statement.rhs) if a.tensor == wrt]
        if len(reads) != 1 or reads[0].indices != b.statement.lhs.indices:
            return False
        d = b.derived(wrt)
        return d.pattern is not None and not (d.prelude or d.ranges or d.extents)

    def same(self, x: Tensor, grad: Any) -> bool:
        """Whether ``grad`` stores exactly ``x``'s positions, in ``x``'s order."""
        if not isinstance(grad, Tensor) or grad.shape != x.shape:
            return False
        if grad.format.structure != x.format.structure or grad.index_dtype != x.index_dtype:
            return False
        if len(x.vals) != len(grad.vals) or any(
            a.keys() != b.keys() for a, b in zip(x.levels, grad.levels, strict=True)
        ):
            return False
        return all(
            level[k] is g[k] or np.array_equal(level[k], g[k])
            for level, g in zip(x.levels, grad.levels, strict=True)
            for k in level
        )

    def __call__(self, wrt: str, grad: Tensor, operands: dict[str, Any]) -> Tensor:
        """``wrt``'s gradient on ``grad``'s positions, which ``same`` found to be ``wrt``'s
        (the caller puts its values on the operand's index arrays)."""
        kernel, d = self._kernel(wrt)
        args = {
            a.tensor: operands[a.tensor] for a in accesses(d.statement.rhs) if a.tensor != d.grad
        }
        args[d.grad] = grad
        return kernel(**args)

    def _kernel(self, wrt: str) -> tuple[Any, Any]:
        if wrt not in self._kernels:
            from ucf.exec.kernel import Kernel

            b = self.back
            pattern = b.derived(wrt).pattern
            d = derive(b.statement, wrt, keep_pattern=False)
            fmts = {n: f for n, f in b.kernel_formats(wrt)[0].items() if n != pattern}
            k = Kernel(str(d.statement), fmts, None, b.target, b.dtype, b.index_dtype)
            self._kernels[wrt] = (k, d)
        return self._kernels[wrt]
