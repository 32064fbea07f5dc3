"""The pipeline's result: everything a call needs that does not depend on the operands'
values, which the kernel cache pickles.

It lives apart from ``ucf.pipeline`` so that loading a cached kernel imports the classes
its fields hold and nothing of the compiler that built them: the code generators are
imported when a source text is first printed, which a kernel whose object code is in
the disk cache never does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ucf.cin.blocking import Blocking
from ucf.cin.notation import CIN
from ucf.cin.relabelled import Relabelled
from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.lang.ast import Statement


@dataclass
class Plan:
    """Everything a call needs that does not depend on the operands' values."""

    statement: Statement
    cin: CIN
    orders: dict[str, int]
    compute: ir.Function
    assemble: ir.Function | None
    computed_format: Format  # output format the kernel writes
    output_format: Format  # format the user asked for
    local_level: int | None  # output level whose pos the assemble pass fills per segment
    cuda_source: str = ""  # target cuda: the .cu text (c_source and llvm_ir are then empty)
    cuda_module: Any = None  # target cuda: the ucf.ir.gpu_nodes.Module it prints
    helpers: list[ir.Function] = field(default_factory=list)  # internal functions (a sort)
    blocking: Blocking | None = None  # how blocked formats split the kernel's statement
    variables: tuple[str, ...] = ()  # the statement's index variables, as the user wrote it
    integer_sums: list = field(default_factory=list)  # ucf.lower.held: checked per call
    openmp: bool = True  # the llvm target's parallel loops call libgomp
    # The compute function writes every element of its dense output (``ucf.lower.zeroing``),
    # so the output need not be zeroed before a call.
    writes_all: bool = False
    # The sparse output is appended in one pass, each value stored once (``Lowered``).
    one_pass: bool = False
    # The slot of the operand whose structure the sparse output has (``Lowered``; ""
    # for none): every value is stored, and the positions are that operand's.
    same_structure: str = ""
    # The default's output is an operand converted and relabelled (``ucf.cin.relabelled``):
    # a call returns that instead of calling the kernel.
    copied: Relabelled | None = None
    # The schedule the plan was built from, as text (kept light for the disk cache; ""
    # for the plain nest), the default model's choice where none was given; None for a
    # GPU default, which no schedule spells.
    schedule: str | None = None

    def __repr__(self) -> str:
        names = ", ".join(f.name for f in (self.assemble, self.compute) if f is not None)
        return f"Plan('{self.statement}', output '{self.output_format.name}', functions {names})"

    @property
    def call_zeroes(self) -> bool:
        """Whether a call zeroes the dense output before the kernel runs: an ``=``
        statement whose kernel does not write every element itself."""
        return self.statement.op == "=" and not self.writes_all

    @property
    def _functions(self) -> list[ir.Function]:
        return [*self.helpers, *(f for f in (self.assemble, self.compute) if f is not None)]

    @cached_property
    def c_source(self) -> str:
        """The C text of the kernel's functions. Printed when first read (by the c target,
        or ``k.c_source``), not for every plan: a kernel runs on one target."""
        from ucf.codegen import c

        return "" if self.cuda_module is not None else c.source(self._functions)

    @cached_property
    def llvm_ir(self) -> str:
        """The LLVM IR text of the kernel's functions, printed when first read (by the llvm
        target, unless the disk cache already holds its object code)."""
        if self.cuda_module is not None:
            return ""
        from ucf.codegen import llvm

        return llvm.module(self._functions, openmp=self.openmp)
