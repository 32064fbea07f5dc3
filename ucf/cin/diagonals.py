"""Repeated index variables in sparse operands: ``A(i,i)``, ``T(i,j,i)``.

A dense operand reads ``A(i,i)`` by locating both of its levels at ``i``. A sparse
operand's levels are walked one loop per level, outer to inner, and no walk resolves
two levels at one loop. So every later occurrence of a variable among a sparse
operand's levels (in the order the levels store them) is offset by a fresh variable
of extent 1: ``A(i,i)`` becomes ``A(i, i + i_d)`` with ``i_d`` in ``[0, 1)``. The
lowering already reads that as an affine index at the loop over ``i_d``: a compressed
level is searched for the one stored coordinate ``i`` (a window of width 1, so the
stored coordinates off the diagonal are never visited), a dense level is located
under a guard, and a level that can do neither is read from a converted copy, as
any operand no loop order can walk.

``i_d`` is summed where the access is (joining the innermost sum around it, else the
whole right-hand side): a sum over one value is that value, so the statement means
what it meant, whatever the expression around the access. Under a ``max`` or ``min``
it is summed on its own, inside the reduction: joined to it, the ``i_d`` loop would
skip a diagonal entry that is absent, where the reduction must meet its 0.
"""

from __future__ import annotations

from ucf.format.format import Format
from ucf.lang import ast
from ucf.lang.affine import Affine
from ucf.lang.reductions import sums


def diagonals(stmt: ast.Statement, formats: dict[str, Format]) -> tuple[ast.Statement, dict]:
    """``stmt`` with each repeated variable of a sparse operand offset as above, and
    the offsets made: offset variable -> the variable it repeats (each of extent 1)."""
    taken = set(ast.index_variables(stmt.lhs)) | set(ast.index_variables(stmt.rhs))
    taken |= {v for s in sums(stmt.rhs) for v in s.vars}
    made: dict[str, str] = {}

    def access(a: ast.Access) -> tuple[ast.Access, list[str]]:
        fmt = formats[a.tensor]
        if fmt.is_dense:
            return a, []
        indices = list(a.indices)
        seen: set[str] = set()
        fresh: list[str] = []
        for m in dict.fromkeys(fmt.mode_order):  # each mode once, in level order
            v = indices[m].single_variable
            if v is None:
                continue
            if v in seen:
                d = ast.fresh(f"{v}_d", taken)
                made[d] = v
                fresh.append(d)
                indices[m] = Affine.var(v) + Affine.var(d)
            seen.add(v)
        return (ast.Access(a.tensor, tuple(indices)), fresh) if fresh else (a, [])

    def walk(e: ast.Expr) -> tuple[ast.Expr, list[str]]:
        if isinstance(e, ast.Access):
            return access(e)
        if isinstance(e, ast.Sum):
            body, fresh = walk(e.body)
            if fresh and e.op == "sum":
                return ast.Sum((*e.vars, *fresh), body), []
            if fresh:  # a max or min would skip the offset's absent value: sum it alone
                body = ast.Sum(tuple(fresh), body)
            return ast.Sum(e.vars, body, e.op), []
        kids, fresh = [], []
        for c in ast.children(e):
            k, f = walk(c)
            kids.append(k)
            fresh += f
        return ast.with_children(e, kids), fresh

    rhs, fresh = walk(stmt.rhs)
    if fresh:
        rhs = ast.Sum(tuple(fresh), rhs)
    if not made:
        return stmt, {}
    return ast.Statement(stmt.lhs, stmt.op, rhs, stmt.text), made


def describe(made: dict[str, str]) -> list[str]:
    """For ``k.cin``: what each offset variable stands for."""
    return [
        f"{d} runs over one value, 0: a sparse operand reads its repeated {v} as {v} + {d}, "
        f"so that level is searched (or located) for the coordinate {v}"
        for d, v in made.items()
    ]
