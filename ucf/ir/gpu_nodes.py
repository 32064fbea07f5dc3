"""LLIR nodes of the GPU mapping (``ucf.lower.gpu_grid``) that the CUDA printer reads.

They live with the other nodes so that ``ucf.codegen`` depends on ``ucf.ir``
only, never on a lowering pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64

#: LLIR intrinsic calls that are tile collectives: (array, index, value, group size).
GROUP_CALLS = ("atomicAddGroup", "segReduceGroup")


@dataclass(frozen=True)
class Special(ir.Expr):
    """A CUDA built-in index such as ``threadIdx.x``, as a 64-bit integer."""

    name: str
    type: str = I64


@dataclass
class Scope(ir.Stmt):
    """A brace-delimited block: the binding of one GPU loop and the code it covers."""

    BLOCKS: ClassVar[tuple[str, ...]] = ("body",)
    body: list[ir.Stmt]


@dataclass
class Launch(ir.Stmt):
    """Host code: launch ``kernel`` on ``grid`` blocks of ``threads`` threads."""

    kernel: str
    grid: list[ir.Expr]
    threads: int
    args: list  # Var or Array, in the kernel's parameter order


@dataclass
class Module:
    """A compute function split into device kernels and the host code that launches them."""

    kernels: list[ir.Function]
    host: ir.Function
    notes: list[str] = field(default_factory=list)
