"""Dynamic matmuls run as gathered dense compute tiles (``ucf.lower.condensed``).

A dynamic kernel whose statement is a matmul over the dynamic operand's last
variable, ``C(b..,i,n) = A(b..,i,k) * B(b..,k,n)`` (B's batch variables all of A's
or none, every operand dense, a float dtype) with micro-tiles that are 1 along the
batch variables, runs here instead of through the generic rewrite
(``ucf.exec.dynamic``): each block of rows gathers its live k's, ``depth`` at a time
(``condense(k, A, depth)``, or ``ucf.lower.condensed.DEPTH``), into dense tiles for
a register-blocked micro-kernel. Any other statement, or a schedule with other
commands, keeps the generic kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf import stile
from ucf.errors import OperandError, ScheduleError, UnsupportedError
from ucf.format.format import dense_format, parse_format
from ucf.format.tensor import Tensor
from ucf.ir import nodes as ir
from ucf.lang import ast
from ucf.lower import condensed, parallel
from ucf.schedule.fluent import Schedule
from ucf.schedule.text import parse_schedule

#: The compute types the micro-kernel has.
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Shape:
    """A statement the condensed kernel computes: the dense operand B, whether it has
    the batch variables, and the depth of a compute tile."""

    dense: str
    batched: bool
    depth: int


def match(
    stmt: ast.Statement,
    name: str,
    granularity: tuple[int, ...],
    formats: dict[str, Any],
    dtype: np.dtype,
    schedule: Any,
) -> Shape | None:
    """The condensed form of ``stmt`` with dynamic operand ``name``, or None when the
    generic kernel runs it. A schedule of ``condense(k, A, depth)`` alone sets the
    depth; one that cannot be honoured is refused, any other schedule is the generic
    kernel's."""
    commands = _commands(schedule)
    asked = [c for c in commands if c.name == "condense"]
    if commands and not asked:
        return None
    shape = _shape(stmt, name, granularity, formats, dtype)
    if not asked:
        return shape
    if len(commands) > 1:
        raise UnsupportedError(
            f"schedule {'; '.join(map(str, commands))}: condense(...) is the whole schedule "
            "of a kernel that gathers compute tiles"
        )
    (cmd,) = asked
    access = next(a for a in ast.accesses(stmt.rhs) if a.tensor == name)
    k = access.indices[-1].single_variable
    if cmd.args[1] != name or cmd.args[0] != k:
        raise ScheduleError(
            f"{cmd}: the compute tiles gather the dynamic operand {name} along its last "
            f"variable; write condense({k}, {name}, depth)"
        )
    depth = cmd.positive(cmd.args[2], "the compute-tile depth")
    if shape is None:
        raise UnsupportedError(
            f"{cmd}: gathered compute tiles are built for C(b.., i, n) = {name}(b.., i, k) * "
            f"B(b.., k, n) with dense operands, tiles of 1 along b and a float dtype, "
            f"not {stmt} in {dtype}"
        )
    return Shape(shape.dense, shape.batched, depth)


def _commands(schedule: Any) -> list:
    if schedule is None:
        return []
    if isinstance(schedule, Schedule):
        return list(schedule.commands)
    return parse_schedule(str(schedule))


def _shape(
    stmt: ast.Statement,
    name: str,
    granularity: tuple[int, ...],
    formats: dict[str, Any],
    dtype: np.dtype,
) -> Shape | None:
    rhs = stmt.rhs
    if isinstance(rhs, ast.Sum):  # the sum over k, and only k, made explicit
        if len(rhs.vars) != 1:
            return None
        rhs = rhs.body
    if dtype.name not in DTYPES or not isinstance(rhs, ast.Binary) or rhs.op != "*":
        return None
    pair = (rhs.left, rhs.right)
    if not all(isinstance(x, ast.Access) for x in pair):
        return None
    a, b = pair if pair[0].tensor == name else pair[::-1]
    if a.tensor == b.tensor or len(a.indices) < 2 or len(b.indices) < 2:
        return None
    variables = [ast.index_variables(x) for x in (stmt.lhs, a, b)]
    for v, x in zip(variables, (stmt.lhs, a, b), strict=True):
        if len(v) != len(x.indices) or len(set(v)) != len(v):
            return None  # an affine index or a repeated variable
    out, av, bv = variables
    *lead, i, k = av
    n = bv[-1]
    if isinstance(stmt.rhs, ast.Sum) and stmt.rhs.vars != (k,):
        return None
    if bv[:-1] not in ([k], [*lead, k]) or n in av or out != [*lead, i, n]:
        return None
    if any(g != 1 for g in granularity[:-2]):
        return None
    for t, order in ((stmt.lhs.tensor, len(out)), (b.tensor, len(bv))):
        if t in formats and parse_format(formats[t], order=order, tensor=t) != dense_format(order):
            return None
    return Shape(b.tensor, len(bv) > 2, condensed.DEPTH)


class Condensed:
    """The compiled condensed kernel of one dynamic matmul."""

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
        self.dtype = dtype
        bh, bw = granularity[-2:]
        elem, idx = ir.NUMPY_TO_IR[dtype.name], ir.NUMPY_TO_IR[index_dtype.name]
        self.function = condensed.function(elem, idx, bh, bw, shape.depth, parallel.threshold())
        self._call, self._library = stile.compiled_function(target, self.function)
        self.target = target
        self.granularity = granularity

    @property
    def source(self) -> str:
        from ucf.codegen import c as cgen

        if self.target == "c":
            return cgen.source([self.function])
        from ucf.codegen import llvm as llvmgen

        return str(llvmgen.module([self.function]))

    def notes(self) -> list[str]:
        bh, bw = self.granularity[-2:]
        lanes = condensed.VECTOR_BYTES // np.dtype(self.dtype).itemsize
        if bh >= condensed.ROWS:
            tile = f"{condensed.ROWS} rows x {condensed.VECTORS * lanes}"
            packed = f", and the rows of {self.shape.dense} at them packed by panels"
        else:
            tile, packed = f"1 row x {condensed.SINGLE * lanes}", ""
        depth = condensed.depth_tiles(self.shape.depth, bw) * bw
        return [
            f"condensed: each block of {bh} rows of {self.name} gathers up to {depth} of its "
            f"live k's ({self.shape.depth} asked; whole {bh}x{bw} tiles) into a dense tile, "
            f"masked{packed}",
            f"registers: tiles of {tile} columns of {self.statement.lhs.tensor} held across "
            "the gathered k's",
        ]

    def __call__(
        self, a: np.ndarray, mask: np.ndarray, index: Tensor, dense: Tensor, out: Any
    ) -> Tensor:
        a = np.ascontiguousarray(a, dtype=self.dtype)
        b = np.ascontiguousarray(np.asarray(dense), dtype=self.dtype)
        *lead, m, kd = a.shape
        n = b.shape[-1]
        c = self._output(out, (*lead, m, n))
        pos, crd = index.levels[-1]["pos"], index.levels[-1]["crd"]
        self._call(
            a.ctypes.data,
            mask.ctypes.data,
            pos.ctypes.data,
            crd.ctypes.data,
            b.ctypes.data,
            c.ctypes.data,
            math.prod(lead),
            m,
            kd,
            n,
            kd * n if self.shape.batched else 0,
        )
        return out if isinstance(out, Tensor) else Tensor.from_numpy(c)

    def _output(self, out: Any, shape: tuple[int, ...]) -> np.ndarray:
        """The array the kernel adds into: zeros, or ``out`` (zeroed for ``=``)."""
        lhs = self.statement.lhs
        if out is None:
            if self.statement.op == "+=":
                raise OperandError(f"'+=' needs the output: pass out= for {lhs}")
            return np.zeros(shape, dtype=self.dtype)
        if isinstance(out, Tensor):
            if out.format != dense_format(len(shape)) or out.dtype != self.dtype:
                raise OperandError(
                    f"out must have format '{dense_format(len(shape))}' and dtype {self.dtype}"
                )
            c = out.vals.reshape(shape)
        else:
            c = np.asarray(out)
            if c.dtype != self.dtype or not c.flags.c_contiguous or not c.flags.writeable:
                raise OperandError(
                    f"out must be a writable C-contiguous {self.dtype} numpy array (or a "
                    f"ucf.Tensor in format '{dense_format(len(shape))}'), got {c.dtype}"
                )
        if self.statement.op == "=":
            c[...] = 0
        return c
