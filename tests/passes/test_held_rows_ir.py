"""Two conditions of ``ucf.passes.held_rows`` that no compiled statement reaches today,
on IR built by hand: a row is held only where its loop touches the output nowhere
else (the lowerer puts every access of the output inside loops over its variables, so
the loop that walks a row's entries holds none but the row's; a call, the workspaces'
sort, comes after a row's loops), and it starts from zeros only where the zeroing loop
before it reaches every place the row adds into (``bound(k, kb, 8, MaxExact)``'s row
is zeroed to the output's extent, which each call checks is 8). Both keep the pass
right if the code before it changes."""

from __future__ import annotations

import pytest

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import nodes, statements
from ucf.passes.held_rows import hold_rows

N_I, C_DIM0, C_DIM1 = (Var(n, I64) for n in ("n_i", "C_dim0", "C_dim1"))
I, P, K, Q = (Var(n, I64) for n in "ipkq")
C, A = ir.Array("C_vals", "f64", output=True), ir.Array("A_vals", "f64")
ROW = ir.mul(I, C_DIM1)  # C's row i


def kernel(before: list[ir.Stmt], beside: list[ir.Stmt]) -> ir.Function:
    """``C(i,k) += A(p,k)`` for ``p`` of 3 and ``k`` of 8: ``before`` the loop over
    ``p``, ``beside`` the loop over ``k`` in its body."""
    term = ir.Load(A, ir.add(ir.mul(P, Const(8, I64)), K))
    add = ir.For(K, Const(0, I64), Const(8, I64), [ir.Store(C, ir.add(ROW, K), term, True)])
    entries = ir.For(P, Const(0, I64), Const(3, I64), [*beside, add])
    params = [ir.Param(v.name, I64, False) for v in (N_I, C_DIM0, C_DIM1)]
    params += [ir.Param("A_vals", "f64", True), ir.Param("C_vals", "f64", True, output=True)]
    return ir.Function("kernel", params, [ir.For(I, Const(0, I64), N_I, [*before, entries])])


def zeroing(end: ir.Expr) -> ir.For:
    """Zeros stored in C's row ``i`` from 0 to ``end``."""
    return ir.For(Q, Const(0, I64), end, [ir.Store(C, ir.add(ROW, Q), Const(0.0, "f64"))])


@pytest.mark.parametrize(
    "end, zeros",
    [
        (Const(8, I64), True),  # the row's 8 places
        (Const(16, I64), True),
        (C_DIM1, True),  # the whole row: C's rows are C_dim1 apart
        (Const(4, I64), False),  # half the row: its other half keeps what it held
        (N_I, False),  # not the distance between C's rows
        (C_DIM0, False),
    ],
    ids=["8", "16", "C_dim1", "4", "n_i", "C_dim0"],
)
def test_a_row_starts_from_zeros_only_where_they_reach_it(end, zeros):
    """The row is held in either case; its registers start from zeros where the zeroing
    covers the row, else from C's row (loaded under the loop's entry test)."""
    held, notes = hold_rows(kernel([zeroing(end)], []))
    assert notes, "the row is held"
    starts = [
        s.init for s in statements(held.body) if isinstance(s, ir.Decl) and s.var.name[:3] == "row"
    ]
    assert starts
    loaded = [any(isinstance(n, ir.Load | ir.VLoad) for n in nodes(e)) for e in starts]
    assert loaded == [not zeros] * len(starts), starts


@pytest.mark.parametrize(
    "beside",
    [
        [],
        [ir.Store(C, ROW, Const(1.0, "f64"))],  # C(i,0) = 1 at each entry
        [ir.Decl(Var("first", "f64"), ir.Load(C, ROW))],  # C(i,0) read at each entry
        [ir.Call("sort", [C, ROW])],  # a call, which may reach any array
    ],
    ids=["nothing", "store", "load", "call"],
)
def test_a_loop_that_touches_the_output_elsewhere_holds_no_row(beside):
    """Held in registers, the row would miss that store (its registers overwrite it
    after the loop) or that load (it would read the row as it was before the loop)."""
    fn = kernel([zeroing(C_DIM1)], beside)
    held, notes = hold_rows(fn)
    assert (held, bool(notes)) == ((fn, False) if beside else (held, True))
