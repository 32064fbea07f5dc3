"""``dismantle``: a kernel specialized to operands whose pattern is known when compiling.

SparTA's ``dismantle`` unrolls a loop and every loop around it over a static sparsity
pattern and drops the dead blocks. Here it is a partial evaluation of the lowered
kernel: the static operands' extents, dimensions and index arrays (``pos``, ``crd``)
become constants; the loops from the outermost down to the dismantled one are
unrolled, each copy with its loop variable a constant, so every load from an index
array folds to the coordinate or position it holds. A block row with no live block
unrolls to nothing, and each live block or nonzero becomes straight-line code with
its coordinates as constants; the loops inside it (a block's dense loops) stay.
Values are still loaded from the ``vals`` array at call time (at constant positions),
so a tensor of the same pattern with new values reuses the kernel, unless ``values``
embeds them as constants too (as SparseRT does).

Code size grows with the pattern: more than ``MAX_UNROLLED`` copies of the dismantled
loop's body are refused with a ScheduleError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

import numpy as np

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.walk import assigned, loops, substitute
from ucf.lang.ast import Statement, accesses

#: The most copies of the dismantled loop's body (one per live block or nonzero, or
#: per live pair with two static operands) one kernel may hold. The JIT takes about a
#: millisecond per copy (4000 nonzeros of a CSR SpMV: 5 s on the llvm target, more on
#: c), so beyond this the compile costs more than reading the index arrays saves.
MAX_UNROLLED = 2048


@dataclass(frozen=True)
class Known:
    """What the static operands fix: scalar parameters (extents, dimensions) and the
    contents of arrays (index arrays; values too when they are embedded)."""

    scalars: dict[str, int]
    arrays: dict[str, np.ndarray]


def fixed_extents(stmt: Statement, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The extents of the index variables that index a static operand plainly."""
    return {
        idx.single_variable: shapes[a.tensor][m]
        for a in accesses(stmt.rhs)
        if a.tensor in shapes
        for m, idx in enumerate(a.indices)
        if idx.single_variable is not None
    }


def known(
    params: list[ir.Param], static: Mapping, extents: Mapping[str, int], values: bool
) -> Known:
    """The parameters of a kernel that ``static`` (operand name -> ``ucf.Tensor`` in the
    kernel's format and shape) fixes, by their ABI roles; ``extents`` are the index
    variables' extents the static operands fix."""
    scalars: dict[str, int] = {}
    arrays: dict[str, np.ndarray] = {}
    for p in params:
        role = p.role
        if role[:1] == ("extent",) and role[1] in extents:
            scalars[p.name] = extents[role[1]]
        elif len(role) == 3 and role[0] == "dim" and role[1] in static:
            scalars[p.name] = static[role[1]].shape[role[2]]
        elif len(role) == 3 and role[1] in static and not p.output:
            arrays[p.name] = static[role[1]].levels[role[2]][role[0]]
        elif values and role[:1] == ("vals",) and role[1] in static and not p.output:
            arrays[p.name] = static[role[1]].vals
    return Known(scalars, arrays)


def specialize(fn: ir.Function, facts: Known, var: str | None, command: str) -> ir.Function:
    """``fn`` with ``facts`` folded in, and (with ``var``) the loop labelled ``var`` and
    every loop around it unrolled; a ScheduleError (naming ``command``) where one of
    those loops has a trip count the facts do not fix, or the code would exceed
    ``MAX_UNROLLED`` copies."""
    env = {n: ir.Const(v, ir.I64) for n, v in facts.scalars.items()}
    s = _Specializer(facts, var, command, assigned(fn.body))
    body = s.block(fn.body, env, above=var is not None)
    if var is not None and not s.found:
        raise ScheduleError(f"{command}: the kernel has no loop over {var} to unroll")
    return replace(fn, body=_distinct(body, {}, set()))


class _Specializer:
    def __init__(self, facts: Known, var: str | None, command: str, mutable: set[str]):
        self.arrays = facts.arrays
        self.var = var
        self.command = command
        self.mutable = mutable  # variables assigned after their declaration: never folded
        self.copies = 0
        self.found = False

    def block(self, stmts: list[ir.Stmt], env: dict[str, ir.Expr], above: bool) -> list[ir.Stmt]:
        """``stmts`` specialized; ``above``: still outside the dismantled loop, so loops
        that enclose it are unrolled."""
        env = dict(env)
        out: list[ir.Stmt] = []
        for s in stmts:
            if isinstance(s, ir.Decl):
                init = self.expr(s.init, env)
                if isinstance(init, ir.Const) and s.var.name not in self.mutable:
                    env[s.var.name] = init
                    continue
                out.append(ir.Decl(s.var, init))
            elif isinstance(s, ir.If):
                cond = self.expr(s.cond, env)
                if isinstance(cond, ir.Const):
                    out += self.block(s.then if cond.value else s.orelse, env, above)
                    continue
                then, orelse = self.block(s.then, env, above), self.block(s.orelse, env, above)
                out.append(ir.If(cond, then, orelse))
            elif above and isinstance(s, ir.For | ir.While) and self._encloses(s):
                out += self.unrolled(s, env)
            else:
                out.append(self.stmt(s, env))
        return out

    def _encloses(self, s: ir.For | ir.While) -> bool:
        if any(loop.label == self.var for _, loop in loops([s])):
            self.found = True
            return True
        return False

    def unrolled(self, s: ir.For | ir.While, env: dict[str, ir.Expr]) -> list[ir.Stmt]:
        """One copy of the loop's body per iteration, its variable a constant."""
        what = f"loop {s.label}" if s.label == self.var else f"loop {s.label} (around {self.var})"
        if isinstance(s, ir.While):
            raise ScheduleError(
                f"{self.command}: {what} co-iterates several operands, so its iterations "
                "are not one static pattern's; dismantle needs the static operand to drive it"
            )
        start, end = self.expr(s.start, env), self.expr(s.end, env)
        if not (isinstance(start, ir.Const) and isinstance(end, ir.Const)):
            raise ScheduleError(
                f"{self.command}: the trip count of {what} is not fixed by the static "
                "operands, so it cannot be unrolled"
            )
        inner = s.label != self.var
        out: list[ir.Stmt] = []
        for k in range(int(start.value), int(end.value)):
            if not inner:
                self.copies += 1
                if self.copies > MAX_UNROLLED:
                    raise ScheduleError(
                        f"{self.command}: unrolling makes more than {MAX_UNROLLED} copies of "
                        f"{what}'s body (ucf.passes.dismantle.MAX_UNROLLED), one per live "
                        "block or nonzero; dismantle an outer loop, store the operand in "
                        "larger blocks, or leave it dynamic"
                    )
            out += self.block(s.body, {**env, s.var.name: ir.Const(k, s.var.type)}, inner)
        return out

    def stmt(self, s: ir.Stmt, env: dict[str, ir.Expr]) -> ir.Stmt:
        """Every expression of ``s`` folded, every nested list specialized (no unrolling
        below a loop that is kept)."""
        changes = {}
        for f in fields(s):
            value = getattr(s, f.name)
            if f.name in s.BLOCKS:
                changes[f.name] = self.block(value, env, above=False)
            elif isinstance(value, ir.Expr) and f.name != "var":
                changes[f.name] = self.expr(value, env)
        return replace(s, **changes)

    def expr(self, e: ir.Expr, env: dict[str, ir.Expr]) -> ir.Expr:
        if isinstance(e, ir.Var):
            return env.get(e.name, e)
        if isinstance(e, ir.Const | ir.Array) or not hasattr(e, "__dataclass_fields__"):
            return e
        changes = {
            f.name: self.expr(getattr(e, f.name), env)
            for f in fields(e)
            if isinstance(getattr(e, f.name), ir.Expr)
        }
        e = replace(e, **changes)
        return _fold(e, self.arrays)


def _distinct(stmts: list[ir.Stmt], names: dict[str, ir.Expr], seen: set[str]) -> list[ir.Stmt]:
    """``stmts`` with every variable declared once in the function: the unrolled copies
    of a body declare the same names side by side. A repeated declaration takes a new
    name (``t0_1``), read until the next declaration of the old one."""
    names = dict(names)
    out: list[ir.Stmt] = []
    for s in stmts:
        changes = {
            f.name: substitute(getattr(s, f.name), names)
            for f in fields(s)
            if f.name not in s.BLOCKS and f.name != "var"
        }
        inner = names
        if isinstance(s, ir.Decl | ir.For):
            var = _fresh(s.var, seen)
            changes["var"] = var
            if isinstance(s, ir.Decl):
                names[s.var.name] = var
            else:
                inner = {**names, s.var.name: var}
        elif isinstance(s, ir.Assign):
            changes["var"] = substitute(s.var, names)
        for b in s.BLOCKS:
            changes[b] = _distinct(getattr(s, b), inner, seen)
        out.append(replace(s, **changes))
    return out


def _fresh(var: ir.Var, seen: set[str]) -> ir.Var:
    name, k = var.name, 0
    while name in seen:
        k += 1
        name = f"{var.name}_{k}"
    seen.add(name)
    return ir.Var(name, var.type)


def _fold(e: ir.Expr, arrays: Mapping[str, np.ndarray]) -> ir.Expr:
    """``e`` as a constant when its operands are (integer arithmetic and comparisons,
    casts, loads from arrays known when compiling); float arithmetic is left to the
    backend compiler, whose rounding is the kernel's."""
    if isinstance(e, ir.Load):
        value = _known_load(e, arrays)
        if value is None or e.array.elem in ir.STORAGE_TYPES:  # folded by its cast
            return e
        return ir.Const(value, e.array.elem)
    if isinstance(e, ir.Cast):
        operand = e.operand
        if isinstance(operand, ir.Load):
            value = _known_load(operand, arrays)
            operand = operand if value is None else ir.Const(value, operand.array.elem)
        if isinstance(operand, ir.Const):
            return ir.Const(_typed(operand.value, e.type), e.type)
        return e
    if isinstance(e, ir.Bin | ir.Cmp) and e.left.type in ir.INT_TYPES:
        a, b = e.left, e.right
        if isinstance(a, ir.Const) and isinstance(b, ir.Const):
            value = _integer(e.op, int(a.value), int(b.value))
            if value is not None:
                return ir.Const(value, e.type)
        if e.op in "+*" and isinstance(a, ir.Const) and a.value == (e.op == "*"):
            return b  # 0 + x, 1 * x: the offsets of a constant block
    if isinstance(e, ir.Select) and isinstance(e.cond, ir.Const):
        return e.if_true if e.cond.value else e.if_false
    return e


def _known_load(e: ir.Load, arrays: Mapping[str, np.ndarray]) -> float | int | None:
    """The element a load reads from an array known when compiling, if its index is a
    constant within the array and the element a finite number (C has no literal for
    NaN or infinity); else None."""
    array = arrays.get(e.array.name)
    if array is None or not isinstance(e.index, ir.Const) or not 0 <= e.index.value < len(array):
        return None
    value = array[int(e.index.value)].item()
    return value if np.isfinite(value) else None


def _typed(value: float | int | bool, type_: str) -> float | int | bool:
    """``value`` converted as C converts it to ``type_``."""
    if type_ == "i1":
        return bool(value)
    numpy = {"i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}[type_]
    return numpy(value).item()


def _integer(op: str, a: int, b: int) -> int | bool | None:
    """C's integer ``a op b``; None where C leaves it undefined or ucf does not fold it."""
    if op in ("/", "%") and b == 0:
        return None
    quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1) if op in "/%" else 0
    table = {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "/": lambda: quotient,
        "%": lambda: a - quotient * b,
        "min": lambda: min(a, b),
        "max": lambda: max(a, b),
        "<<": lambda: a << b,
        ">>": lambda: a >> b,
        "&": lambda: a & b,
        "<": lambda: a < b,
        "<=": lambda: a <= b,
        "==": lambda: a == b,
        "!=": lambda: a != b,
        ">": lambda: a > b,
        ">=": lambda: a >= b,
    }
    return table[op]() if op in table else None
