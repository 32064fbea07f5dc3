"""Fused multiply-adds: the rule by which ucf rounds its floating-point sums.

Every accumulation of a product of floats is one fused multiply-add (``ir.FMA``), the
product added unrounded and the sum rounded once: ``acc = acc + a * b`` into a scalar
accumulator, ``x[p] += a * b`` into an output or a workspace, and the vector
accumulators of the register-blocked micro-kernels (``ucf.passes.registers``,
``row_groups``, ``condensed``), which build theirs with ``ir.add_product`` too. Nothing
else fuses: an element-wise ``a * b + c`` rounds twice, as written, and so does an
atomic add (threads summing into one place: the product is rounded, then added).

Why: a micro-kernel runs at the speed of its multiply-adds, and x86's FMA3 does one of 8
floats per instruction where a multiply and an add take two (and, with the product in
a register in between, more of the 16 vector registers). One rule for every kernel
keeps what held before it: the micro-kernels sum each output element's terms in the
order of the loop nest they replace, with the same roundings, so a kernel with and
without them agrees bit for bit; and the targets agree bit for bit, the llvm target's
``llvm.fma`` intrinsic and the C target's ``fmaf``/``fma`` (also CUDA's) being exactly
rounded (the C target is still compiled with ``-ffp-contract=off``, so the compiler
fuses nothing the code does not say). A result differs from an unfused one, numpy's
``einsum`` for one, by rounding only, and is exact wherever the products and sums are
(small integers).
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.walk import with_blocks


def with_fma(fn: ir.Function) -> ir.Function:
    """``fn`` with every accumulation of a product of floats fused. It runs after the
    passes that match accumulating stores (register blocking, row groups): a fused
    store is a plain one."""
    return replace(fn, body=_block(fn.body))


def _block(stmts: list[ir.Stmt]) -> list[ir.Stmt]:
    return [_fused(s) for s in stmts]


def _fused(s: ir.Stmt) -> ir.Stmt:
    if isinstance(s, ir.Assign) and isinstance(s.value, ir.Bin) and s.value.op == "+":
        left, right = s.value.left, s.value.right
        if left == s.var:
            return replace(s, value=ir.add_product(left, right))
        if right == s.var:
            return replace(s, value=ir.add_product(right, left))
        return s
    if isinstance(s, ir.Store) and s.accumulate and not s.atomic:
        n = ir.lanes(s.value.type)
        old = ir.Load(s.array, s.index) if n == 1 else ir.VLoad(s.array, s.index, n)
        value = ir.add_product(old, s.value)
        if isinstance(value, ir.FMA):
            return replace(s, value=value, accumulate=False)
        return s
    return with_blocks(s, _block)
