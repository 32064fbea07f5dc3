"""The LLVM types of LLIR's scalar and vector types, shared by the LLVM code generator
(``ucf.codegen.llvm``) and its OpenMP outlining (``ucf.codegen.llvm_openmp``)."""

from __future__ import annotations

from llvmlite import ir as ll

from ucf.ir import nodes as ir

TYPES = {
    "i1": ll.IntType(1),
    "i32": ll.IntType(32),
    "i64": ll.IntType(64),
    "f32": ll.FloatType(),
    "f64": ll.DoubleType(),
    "f16": ll.HalfType(),
    "bf16": ll.IntType(16),  # the top half of a float's bits: cast() shifts them back
    "i8": ll.IntType(8),
    "u8": ll.IntType(8),  # LLVM's integers have no sign; casts from it zero-extend
}
FLOAT_WIDTH = {"f16": 16, "f32": 32, "f64": 64}


def ll_type(ty: str) -> ll.Type:
    """The LLVM type of an LLIR scalar or vector type."""
    n = ir.lanes(ty)
    return TYPES[ty] if n == 1 else ll.VectorType(TYPES[ir.element(ty)], n)


def is_float(ty: str) -> bool:
    return ir.element(ty) in FLOAT_WIDTH


SIZES = ir.ELEMENT_BYTES
I8P = ll.PointerType(ll.IntType(8))
I32 = ll.IntType(32)
