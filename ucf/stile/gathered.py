"""Dynamic kernels run as gathered dense compute tiles (``ucf.stile.kernels``).

Two shapes of statement run here instead of through the generic rewrite
(``ucf.stile.dynamic``), with every operand dense, a float dtype and micro-tiles of
1 along the batch variables b:

- a matmul over the dynamic operand's last variable, ``C(b..,i,n) = A(b..,i,k) *
  B(b..,k,n)`` (B with all of A's batch variables or none): each block of rows
  gathers its live k's, ``depth`` at a time;
- MoE's product, ``C(b..,t,n) = R(b..,t) * X(t,d) * W(b..,d,n)`` with R dynamic:
  the live t's of each b are gathered, ``depth`` at a time, as rows of X scaled by
  R, and multiplied by W.

``condense(k, A, depth)`` (k the dynamic operand's last variable) as the whole
schedule sets the depth, else ``ucf.stile.gather_step.DEPTH`` (``ROWS_DEPTH`` for MoE's
product). Any other statement,
or a schedule with other commands, keeps the generic kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ucf.errors import (
    ConversionWarning,
    OperandError,
    ScheduleError,
    UnsupportedError,
    warn_user,
)
from ucf.exec import recycled
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.ir import nodes as ir
from ucf.lang import ast
from ucf.lower import work
from ucf.schedule.commands import Command, Condense
from ucf.stile import gather_step, kernels
from ucf.stile.index_kernel import compiled_function

#: The compute types the micro-kernel has.
DTYPES = ("float32", "float64")
#: The most k's a compute tile gathers: deeper tiles leave L2 long before this.
MAX_DEPTH = 1 << 14
#: The most bytes of workspace a condensed kernel's thread may allocate when it starts
#: (its gathered tile and packed slab); micro-tiles too large for it even one per step
#: run the generic kernel.
MAX_WORKSPACE = 1 << 26


@dataclass(frozen=True)
class Shape:
    """A statement a condensed kernel computes: its kind (``matmul`` or ``rows``), the
    dense operands in the kernel's order, whether the last has the batch variables
    (a matmul's B may not), and the depth of a compute tile."""

    kind: str
    dense: tuple[str, ...]
    batched: bool
    depth: int


def match(
    stmt: ast.Statement,
    name: str,
    granularity: tuple[int, ...],
    formats: dict[str, Any],
    dtype: np.dtype,
    commands: list[Command] | None,
) -> Shape | None:
    """The condensed form of ``stmt`` with dynamic operand ``name``, or None when the
    generic kernel runs it. A schedule of ``condense(k, A, depth)`` alone sets the
    depth; one that cannot be honoured is refused, any other schedule is the generic
    kernel's. Without one the depth is the kind's default (``ucf.stile.gather_step.DEPTH``
    or ``ROWS_DEPTH``), or the largest below it whose workspace fits (None when not
    even one micro-tile per step does)."""
    commands = commands or []
    asked = [c for c in commands if isinstance(c, Condense)]
    if commands and not asked:
        return None
    shape = None
    if dtype.name in DTYPES and all(g == 1 for g in granularity[:-2]):
        shape = _matmul(stmt, name, formats) or _rows(stmt, name, granularity, formats)
    if not asked:
        if shape is None:
            return None
        depth = largest_depth(shape.kind, dtype, granularity, shape.depth)
        return None if depth is None else replace(shape, depth=depth)
    if len(commands) > 1:
        raise UnsupportedError(
            f"schedule {'; '.join(map(str, commands))}: condense(...) is the whole schedule "
            "of a kernel that gathers compute tiles"
        )
    (cmd,) = asked
    if shape is None:
        raise UnsupportedError(
            f"{cmd}: gathered compute tiles are built for C(b.., i, n) = {name}(b.., i, k) * "
            f"B(b.., k, n) and C(b.., t, n) = {name}(b.., t) * X(t, d) * W(b.., d, n), with "
            f"dense operands, tiles of 1 along b and a float dtype, not {stmt} in {dtype}"
        )
    access = next(a for a in ast.accesses(stmt.rhs) if a.tensor == name)
    k = access.indices[-1].single_variable
    if cmd.tensor != name or cmd.var != k:
        raise ScheduleError(
            f"{cmd}: the compute tiles gather the dynamic operand {name} along its last "
            f"variable; write condense({k}, {name}, depth)"
        )
    depth = cmd.depth
    if depth > MAX_DEPTH:
        raise ScheduleError(
            f"{cmd}: a compute tile gathers at most {MAX_DEPTH} {k}'s; write a depth from 1 "
            f"to {MAX_DEPTH}"
        )
    if not fits(shape.kind, dtype, granularity, depth):
        need = workspace(shape.kind, dtype, granularity, depth)
        largest = largest_depth(shape.kind, dtype, granularity, depth)
        tiles = "x".join(map(str, granularity))
        what = (
            f"use a depth of at most {largest}"
            if largest is not None
            else f"no depth fits micro-tiles of {tiles}: use smaller ones, or no condense(...) "
            "(the generic kernel runs them)"
        )
        raise UnsupportedError(
            f"{cmd}: {name}'s micro-tiles of {tiles} gathered {depth} {k}'s deep need {need} "
            f"bytes of workspace per thread, more than the {MAX_WORKSPACE} a kernel "
            f"allocates; {what}"
        )
    return replace(shape, depth=depth)


def workspace(kind: str, dtype: np.dtype, granularity: tuple[int, ...], depth: int) -> int:
    """The bytes of workspace each thread of a ``kind`` kernel allocates for micro-tiles
    ``granularity`` gathered ``depth`` deep."""
    elem = ir.NUMPY_TO_IR[np.dtype(dtype).name]
    if kind == "matmul":
        return gather_step.matmul_bytes(elem, *granularity[-2:], depth)
    return gather_step.rows_bytes(elem, granularity[-1], depth)


def fits(kind: str, dtype: np.dtype, granularity: tuple[int, ...], depth: int) -> bool:
    """Whether micro-tiles ``granularity`` gathered ``depth`` deep fit a kernel's
    workspace."""
    return workspace(kind, dtype, granularity, depth) <= MAX_WORKSPACE


def largest_depth(
    kind: str, dtype: np.dtype, granularity: tuple[int, ...], limit: int
) -> int | None:
    """The largest depth up to ``limit`` whose workspace fits, or None (the workspace
    grows with the depth: a bisection)."""
    if not fits(kind, dtype, granularity, 1):
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(kind, dtype, granularity, mid) else (lo, mid - 1)
    return lo


def _factors(stmt: ast.Statement) -> tuple[list[ast.Access], tuple[str, ...]] | None:
    """The accesses multiplied on the right (each tensor once, each index a variable,
    none repeated in an access) and the variables summed, or None."""
    rhs, summed = stmt.rhs, ()
    if isinstance(rhs, ast.Sum):
        if rhs.op != "sum":
            return None
        rhs, summed = rhs.body, rhs.vars
    factors, todo = [], [rhs]
    while todo:
        e = todo.pop()
        if isinstance(e, ast.Binary) and e.op == "*":
            todo += [e.right, e.left]
        elif isinstance(e, ast.Access):
            factors.append(e)
        else:
            return None
    for x in (stmt.lhs, *factors):
        v = ast.index_variables(x)
        if len(v) != len(x.indices) or len(set(v)) != len(v):
            return None  # an affine index or a repeated variable
    if len({x.tensor for x in factors}) != len(factors):
        return None
    return factors, summed


def _dense(formats: dict[str, Any], *accesses: ast.Access) -> bool:
    return all(
        a.tensor not in formats or formats[a.tensor] == Format.dense(len(a.indices))
        for a in accesses
    )


def _matmul(stmt: ast.Statement, name: str, formats: dict[str, Any]) -> Shape | None:
    """``C(b..,i,n) = A(b..,i,k) * B(b..,k,n)``, A dynamic."""
    found = _factors(stmt)
    if found is None or len(found[0]) != 2:
        return None
    (a, b), summed = found
    a, b = (a, b) if a.tensor == name else (b, a)
    av, bv, out = (ast.index_variables(x) for x in (a, b, stmt.lhs))
    if len(av) < 2 or len(bv) < 2:
        return None
    *lead, i, k = av
    n = bv[-1]
    if summed != (k,) or bv[:-1] not in ([k], [*lead, k]) or n in av or out != [*lead, i, n]:
        return None
    if not _dense(formats, stmt.lhs, b):
        return None
    return Shape("matmul", (b.tensor,), len(bv) > 2, gather_step.DEPTH)


def _rows(
    stmt: ast.Statement, name: str, granularity: tuple[int, ...], formats: dict[str, Any]
) -> Shape | None:
    """``C(b..,t,n) = R(b..,t) * X(t,d) * W(b..,d,n)``, R dynamic."""
    found = _factors(stmt)
    if found is None or len(found[0]) != 3 or name not in {f.tensor for f in found[0]}:
        return None
    factors, summed = found
    r = next(f for f in factors if f.tensor == name)
    rv, out = ast.index_variables(r), ast.index_variables(stmt.lhs)
    *lead, t = rv
    rest = [f for f in factors if f is not r]
    x = next((f for f in rest if ast.index_variables(f)[:1] == [t]), None)
    if x is None or len(x.indices) != 2:
        return None
    w = next(f for f in rest if f is not x)
    d = ast.index_variables(x)[1]
    wv = ast.index_variables(w)
    if any(g != 1 for g in granularity[:-1]) or len(wv) != len(lead) + 2:
        return None
    n = wv[-1]
    if summed != (d,) or wv[:-1] != [*lead, d] or out != [*lead, t, n] or n in (d, t):
        return None
    if not _dense(formats, stmt.lhs, x, w):
        return None
    return Shape("rows", (x.tensor, w.tensor), True, gather_step.ROWS_DEPTH)


class Condensed:
    """The compiled condensed kernel of one dynamic statement."""

    def __init__(
        self,
        stmt: ast.Statement,
        name: str,
        shape: Shape,
        granularity: tuple[int, ...],
        target: str,
        dtype: np.dtype,
        index_dtype: np.dtype,
    ):
        self.statement, self.name, self.shape = stmt, name, shape
        self.dtype, self.target, self.granularity = dtype, target, granularity
        elem, idx = ir.NUMPY_TO_IR[dtype.name], ir.NUMPY_TO_IR[index_dtype.name]
        threshold = work.threshold()
        if shape.kind == "matmul":
            bh, bw = granularity[-2:]
            self.function = kernels.function(elem, idx, bh, bw, shape.depth, threshold)
        else:
            self.function = kernels.rows_function(
                elem, idx, granularity[-1], shape.depth, threshold
            )
        self._call, self._library = compiled_function(target, self.function)
        self._warned: set[str] = set()

    @property
    def source(self) -> str:
        if self.target == "c":
            from ucf.codegen import c as cgen

            return cgen.source([self.function])
        from ucf.codegen import llvm as llvmgen

        return str(llvmgen.module([self.function]))

    @property
    def asm(self) -> str:
        """The host assembly of the kernel: what the JIT runs (llvm), or what the C
        compiler emits with the kernel's flags (c)."""
        if self.target == "c":
            from ucf.toolchain import cc

            return cc.assembly(self.source)
        from ucf.toolchain import jit

        return jit.assembly(self.source)

    def notes(self) -> list[str]:
        """What ``k.cin`` says of the kernel."""
        lanes = gather_step.VECTOR_BYTES // np.dtype(self.dtype).itemsize
        c = self.statement.lhs.tensor
        if self.shape.kind == "rows":
            (x, w), bt = self.shape.dense, self.granularity[-1]
            rows = gather_step.depth_tiles(self.shape.depth, bt) * bt
            return [
                f"condensed: each step gathers up to {rows} live t's of {self.name} "
                f"({self.shape.depth} asked; whole tiles of {bt}) as rows of {x} scaled by "
                f"{self.name}, {gather_step.ROWS_D} of d at a time, with {w}'s rows at them "
                "packed by panels",
                f"registers: tiles of {gather_step.GATHERED_ROWS} rows x "
                f"{gather_step.VECTORS * lanes} columns of {c} held across the gathered d's",
            ]
        bh, bw = self.granularity[-2:]
        if bh >= gather_step.ROWS:
            tile = f"{gather_step.ROWS} rows x {gather_step.VECTORS * lanes}"
            packed = f", and the rows of {self.shape.dense[0]} at them packed by panels"
        else:
            tile, packed = f"1 row x {gather_step.SINGLE * lanes}", ""
        depth = gather_step.depth_tiles(self.shape.depth, bw) * bw
        return [
            f"condensed: each block of {bh} rows of {self.name} gathers up to {depth} of its "
            f"live k's ({self.shape.depth} asked; whole {bh}x{bw} tiles) into a dense tile, "
            f"masked{packed}",
            f"registers: tiles of {tile} columns of {c} held across the gathered k's",
        ]

    def _held(self, name: str, value: np.ndarray) -> np.ndarray:
        """``value`` in the kernel's dtype, saying once if that rounds it, as the other
        kernels do."""
        if not np.can_cast(value.dtype, self.dtype, "safe") and name not in self._warned:
            self._warned.add(name)
            warn_user(
                f"ucf: operand {name} has {value.dtype} values, rounded to the {self.dtype} "
                "the kernel reads",
                ConversionWarning,
            )
        return np.ascontiguousarray(value, dtype=self.dtype)

    def __call__(
        self, a: np.ndarray, mask: np.ndarray, index: Tensor, tensors: dict[str, Tensor], out: Any
    ) -> Tensor:
        a = self._held(self.name, a)
        dense = [self._held(n, np.asarray(tensors[n])) for n in self.shape.dense]
        pos, crd = index.levels[-1]["pos"], index.levels[-1]["crd"]
        setting = self.statement.op == "="
        if self.shape.kind == "matmul":
            (b,) = dense
            *lead, m, kd = a.shape
            n = b.shape[-1]
            sizes = (math.prod(lead), m, kd, n, kd * n if self.shape.batched else 0)
            c = self._output(out, (*lead, m, n))
            if setting and out is not None:
                c[...] = 0
        else:
            x, w = dense
            *lead, t = a.shape
            d, n = w.shape[-2:]
            # With =, the kernel sets the live rows (when it has d's to sum), so only
            # the others need zeros: a new C has them already, a used one (out=, or a
            # recycled C) has them zeroed by the kernel (SET 2).
            if setting and out is None:
                c, fresh = recycled.array((*lead, t, n), self.dtype)
            else:
                c, fresh = self._output(out, (*lead, t, n)), False
            if setting and d == 0:
                c[...] = 0
            sizes = (math.prod(lead), t, d, n, 0 if not setting else 1 if fresh else 2)
        arrays = (a, mask, pos, crd, *dense, c)
        self._call(*(x.ctypes.data for x in arrays), *sizes)
        return out if isinstance(out, Tensor) else Tensor.from_numpy(c)

    def _output(self, out: Any, shape: tuple[int, ...]) -> np.ndarray:
        """The array the kernel writes: new zeros, or ``out`` as it is."""
        lhs = self.statement.lhs
        fmt = Format.dense(len(shape))
        if out is None:
            if self.statement.op == "+=":
                raise OperandError(f"'+=' needs the output: pass out= for {lhs}")
            return np.zeros(shape, dtype=self.dtype)
        if isinstance(out, Tensor):
            if out.format != fmt or out.dtype != self.dtype:
                raise OperandError(
                    f"out= for {lhs.tensor} must have format '{fmt}' and dtype {self.dtype}, "
                    f"got '{out.format}' and {out.dtype}"
                )
            c = out.vals.reshape(shape)
        else:
            c = np.asarray(out)
            if c.dtype != self.dtype or not c.flags.c_contiguous or not c.flags.writeable:
                wrong = [
                    what
                    for what, bad in (
                        (f"its dtype is {c.dtype}", c.dtype != self.dtype),
                        ("it is not C-contiguous", not c.flags.c_contiguous),
                        ("it is read-only", not c.flags.writeable),
                    )
                    if bad
                ]
                raise OperandError(
                    f"out= for {lhs.tensor} must be a writable C-contiguous {self.dtype} numpy "
                    f"array (or a ucf.Tensor in format '{fmt}'): {'; '.join(wrong)}"
                )
        return c
