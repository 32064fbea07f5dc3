"""Execution plans (SparTA §3.3, Algorithm 3): a program rewritten over split operands.

Each sparse input of a statement is split into parts that one simple kernel
computes well: its widths rounded to the hardware's (``bit_rounding``), then per
width a weighted block cover (``block_cover``) whose blocks of one shape form
one part, stored in the format of that shape (CSR for single elements, BCSR for
blocks) with values of that width (``VALUES``: 8 and 4 bits quantized, 16 bits
half precision). Of the operands one statement reads, only the sparsest is split (a
product of two operands split into blocks of different orders has no loop order that
follows both); the others are read whole. A statement linear in a split operand
becomes one sub-statement per part, added up; any other statement reads the sum of
the parts in place of the operand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ucf.cin.blocking import unblock
from ucf.errors import OperandError, boundary
from ucf.format.format import Format
from ucf.lang.ast import (
    Statement,
    accesses,
    index_variables,
)
from ucf.lang.parser import parse_statement
from ucf.schedule.candidates import Refused, first_passing
from ucf.schedule.commands import Command, DismantleCommand, Parallelize, Reorder
from ucf.schedule.records import Dismantle, Parallel
from ucf.schedule.text import spelled
from ucf.tesa.policy import with_width


@dataclass(frozen=True)
class Part:
    """One part of a split operand: its elements of one width in blocks of one shape."""

    name: str
    tensor: str
    bits: int
    block: tuple[int, ...]
    mask: np.ndarray
    columns: bool = False  # blocks stored by column: every read sums the rows away
    transposed: bool = False  # read only by products computed transposed

    @property
    def format(self) -> Format:
        """The part's storage: its block shape's format, with values of its width. Blocks
        of an operand whose rows every statement sums away (``W`` of ``X·W``) are stored
        by column, so a kernel can walk each column of blocks in a thread of its own and
        apply each block to every row of the other factor while it is in cache. Blocks
        read only by products computed transposed (``Transposed``) also store each
        block's places column by column (``W``'s transpose in BCSR), so that the
        register tiles run over a block's columns with its rows summed inside."""
        if self.block == (1, 1):
            fmt = Format.compressed(2, 1, (1, 0) if self.columns else None)
        else:
            bh, bw = self.block
            fmt = Format.blocked_rows(bh, bw, self.columns or self.transposed, self.transposed)
        return with_width(fmt, self.bits)


class ProgramPlan:
    """The program as statements over parts; ``compile`` returns a callable that takes
    the original operands, splits them and returns the outputs. ``masks`` holds the
    attributes of the inputs read whole and of the outputs, where they prune: those
    elements are zeroed, as in the parts, so every tensor honours its attribute."""

    def __init__(
        self,
        steps: list[str],
        parts: list[Part],
        outputs: tuple[str, ...],
        masks: dict[str, np.ndarray],
        schedules: Mapping[str, list[Command]] | None = None,
    ):
        self.steps = steps
        self.parts = parts
        self.outputs = outputs
        self.masks = masks
        self.schedules = dict(schedules or {})  # by step: the transposes' tiles

    @cached_property
    def inputs(self) -> frozenset[str]:
        """The program's inputs the plan reads: the operands the steps read that no step
        writes, with each split operand in place of its parts. Worked out once: every call
        of a compiled plan checks its operands against it."""
        parts = {p.name: p.tensor for p in self.parts}
        read, written = set(), set()
        for step in self.steps:
            stmt = parse_statement(step)
            read |= {parts.get(a.tensor, a.tensor) for a in accesses(stmt.rhs)}
            written.add(stmt.lhs.tensor)
        return frozenset(read - written)

    def _check_inputs(self, names: Iterable[str]) -> None:
        unknown = sorted(set(names) - self.inputs)
        if unknown:
            raise OperandError(
                f"{unknown[0]} is not an input of the plan; its inputs are "
                f"{', '.join(sorted(self.inputs))}"
            )

    def __str__(self) -> str:
        legend = [
            f"# {p.name}: {p.tensor}'s {p.bits}-bit elements in {p.block[0]}x{p.block[1]} "
            f"blocks, {int(p.mask.sum())} elements, {p.format.name}"
            for p in self.parts
        ]
        return "\n".join(self.steps + legend)

    def __repr__(self) -> str:
        head = (
            f"Plan({len(self.steps)} steps over {len(self.parts)} parts; "
            f"outputs {', '.join(self.outputs)})"
        )
        return "\n".join([head, *(f"  {line}" for line in str(self).splitlines())])

    @boundary
    def compile(
        self,
        target: str = "llvm",
        dtype: Any = "float32",
        static: Mapping[str, Any] | None = None,
        dismantle: bool = False,
    ) -> Callable[..., dict[str, np.ndarray]]:
        """Compile every step. The callable takes the program's inputs by name and
        returns its outputs as a dict of numpy arrays. Inputs given in ``static`` (the
        weights, say) are split into their parts once, here, and the callable takes
        only the others. With ``dismantle``, a step over one part of a static input is
        specialized to the part's pattern (``dismantle`` over its blocks, see
        docs/tesa.md); a step that cannot be (too many live blocks, say) is compiled
        as usual, and the callable's ``notes`` say why."""
        from ucf.exec.kernel import Kernel

        self._check_inputs(static or {})
        formats = {p.name: p.format for p in self.parts}
        fixed = {n: self._masked(n, np.asarray(v, dtype=dtype)) for n, v in (static or {}).items()}
        fixed.update(self._split(fixed))
        kernels = []
        notes: list[str] = []
        refused = Refused()  # a step's kernel with its blocks outside, where refused
        parts = {p.name: p for p in self.parts}
        for step in self.steps:
            stmt = parse_statement(step)
            names = {a.tensor for a in stmt.rhs._accesses}
            used = {n: f for n, f in formats.items() if n in names}
            kernel = None
            if dismantle:
                kernel = self._dismantled(step, used, fixed, target, dtype, notes)
            if kernel is None and len(used) == 1 and target != "cuda":
                outside = _blocks_outside(stmt, used, parts[next(iter(used))])
                kernel = first_passing(
                    [outside] if outside is not None else [],
                    lambda s, step=step, used=used: Kernel(step, used, s, target, dtype),
                    refused,
                    shown=spelled,
                )
            if kernel is None:
                schedule = self.schedules.get(step) if target != "cuda" else None
                kernel = Kernel(step, used, schedule, target=target, dtype=dtype)
            kernels.append((stmt.lhs.tensor, names, stmt.op == "+=", kernel))

        held = _Held()

        @boundary
        def run(**operands: Any) -> dict[str, np.ndarray]:
            self._check_inputs(operands)
            values = {n: self._masked(n, np.asarray(v, dtype=dtype)) for n, v in operands.items()}
            values.update(self._split(values))
            shapes = tuple(sorted((n, np.shape(v)) for n, v in values.items()))
            reused = held.arrays if held.shapes == shapes else {}
            values.update(fixed)
            made = {}
            for out, names, adds, kernel in kernels:
                missing = sorted(names - set(values))
                if missing:
                    raise OperandError(f"missing operand {missing[0]}")
                given = {n: values[n] for n in names}
                if adds:  # into the output an earlier step made here, in place
                    given["out"] = values[out]
                elif out in reused:
                    given["out"] = reused[out]
                result = kernel(**given)
                if adds:
                    continue
                if out in self.outputs:
                    values[out] = np.asarray(result)
                else:
                    # The intermediate itself, not a view of it, so that the steps
                    # reading it, given the very arrays of the last call, replay it.
                    values[out] = made[out] = given["out"] if "out" in given else np.asarray(result)
            held.shapes, held.arrays = shapes, made
            return {n: self._masked(n, np.asarray(values[n])) for n in self.outputs}

        run.notes = [*notes, *refused]
        return run

    def _dismantled(
        self,
        step: str,
        formats: dict[str, Format],
        fixed: Mapping[str, Any],
        target: str,
        dtype: Any,
        notes: list[str],
    ) -> Any:
        """The step's kernel dismantled over its one static part, or None (with a
        note saying why) when the step reads no single static part or the kernel
        cannot be dismantled."""
        from ucf.exec.kernel import Kernel

        stmt = parse_statement(step)
        static = [n for n in formats if n in fixed]
        if len(static) != 1:
            return None
        schedule = _dismantle_schedule(stmt, formats, static[0])
        if schedule is None:
            notes.append(f"{stmt.lhs.tensor}: not dismantled ({static[0]} has an affine index)")
            return None
        refused = Refused()
        kernel = first_passing(
            [schedule],
            lambda s: Kernel(step, formats, s, target, dtype, static={static[0]: fixed[static[0]]}),
            refused,
        )
        if kernel is None:
            notes.append(f"{stmt.lhs.tensor}: not dismantled ({refused.errors[0]})")
            return None
        notes.append(f"{stmt.lhs.tensor}: dismantled over {static[0]} ({spelled(schedule)})")
        return kernel

    @boundary
    def stored(self, name: str, value: Any, dtype: Any = "float32") -> np.ndarray:
        """``value`` of input ``name`` as the plan computes with it: its kept elements,
        with each part's values as stored (8- and 4-bit parts quantized, 16-bit ones
        in half precision), for checking a plan's result against a dense reference."""
        self._check_inputs([name])
        value = np.asarray(value, dtype=dtype)
        parts = [p for p in self.parts if p.tensor == name]
        if not parts:
            return self._masked(name, value)
        split = self._split({name: value})
        # dequantized in dtype, as a kernel computes
        return sum(split[p.name].astype(dtype).to_numpy() for p in parts)

    def _masked(self, name: str, value: np.ndarray) -> np.ndarray:
        if name not in self.masks:
            return value
        mask = self.masks[name]
        if value.shape != mask.shape:
            raise OperandError(
                f"{name} has shape {value.shape}, but its attribute, which prunes some of "
                f"its elements, is of shape {mask.shape}"
            )
        return np.where(mask, value, 0)

    def _split(self, values: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """The parts of the operands in ``values``, each in its part's format."""
        from ucf.format.construction import from_numpy

        return {
            p.name: from_numpy(np.where(p.mask, values[p.tensor], 0), format=p.format)
            for p in self.parts
            if p.tensor in values
        }


class _Held(threading.local):
    """A compiled plan's intermediates from its last call in this thread, kept for the
    next call with operands of the same shapes, which writes into them again. Fresh
    arrays each call cost their allocation and the page faults of first writing them,
    and steps reading new arrays cannot replay their last call (``ucf.exec.replay``):
    the BERT MLP plan of bench/tesa_program.py took 4.7 ms a call with fresh arrays and
    3.6 ms with kept ones, on one thread. The outputs are never kept: the caller owns
    them."""

    def __init__(self) -> None:
        self.shapes: tuple = ()
        self.arrays: dict[str, np.ndarray] = {}


def _part_loops(
    stmt: Statement, formats: Mapping[str, Format], part: str
) -> tuple[list[str], list[str]] | None:
    """The loop variables of ``part``'s levels in storage order (the split ones for a
    blocked part: blocks, then places) and every loop variable of the statement; None
    where the part is read through an affine or repeated index."""
    access = next(a for a in stmt.rhs._accesses if a.tensor == part)
    rows, cols = (i.single_variable for i in access.indices)
    if rows is None or cols is None or rows == cols:
        return None
    fmts = {
        a.tensor: formats.get(a.tensor) or Format.dense(len(a.indices))
        for a in (stmt.lhs, *stmt.rhs._accesses)
    }
    blocking = unblock(stmt, fmts)
    if blocking is None:
        own = [access.indices[m].single_variable for m in fmts[part].mode_order]
        return own, index_variables(stmt.rhs)
    split = next(a for a in blocking.statement.rhs._accesses if a.tensor == part)
    own = [split.indices[m].single_variable for m in blocking.formats[part].mode_order]
    return own, index_variables(blocking.statement.rhs)


def _dismantle_schedule(
    stmt: Statement, formats: Mapping[str, Format], part: str
) -> list[Command] | None:
    """``reorder`` putting the part's levels outermost (block loops, then the places in
    a block), and ``dismantle`` of its second level's loop (the last block loop, or the
    columns); None where the part is read through an affine index."""
    found = _part_loops(stmt, formats, part)
    if found is None:
        return None
    own, loops = found
    order = own + [v for v in loops if v not in own]
    return [Reorder(tuple(order)), DismantleCommand(Dismantle(own[1], values=False))]


def _blocks_outside(
    stmt: Statement, formats: Mapping[str, Format], part: Part
) -> list[Command] | None:
    """For a part stored in column blocks whose columns run along the output's rows
    (``T(t,h) = X(t,d) * P(d,h)``): its block loops outermost, the first in parallel,
    then the other factor's loops, then the places in a block, so each block is read
    once and applied to every row of the other factor (register tiles over the places);
    None for any other part, and for the transposed product ``T_t(h,t) = P(d,h) *
    X_t(d,t)``, a plain blocked SpMM whose default keeps ``t`` innermost in vectors."""
    access = next(a for a in stmt.rhs._accesses if a.tensor == part.name)
    column_blocks = part.columns and part.block != (1, 1) and not part.transposed
    if not column_blocks or access.indices[-1] != stmt.lhs.indices[-1]:
        return None
    found = _part_loops(stmt, formats, part.name)
    if found is None:
        return None
    own, loops = found
    order = own[:2] + [v for v in loops if v not in own] + own[2:]
    return [Reorder(tuple(order)), Parallelize(own[0], Parallel("CPUThread", "NoRaces"))]
