"""One pass for a Gustavson product: the output's rows appended into arrays sized by a
bound, as a sparse add's are (``AssemblyMixin._bound_operands``); rows built in
parallel append in chunks from the bound of the rows before them
(``ucf.lower.row_chunks``).

``C(i,k) = A(i,j) * B(j,k)`` with A and B stored as compressed rows gathers each row
of C in a workspace over k. Two passes (one to count each row's entries, then one to
compute them) walk every product twice; the count pass was about a tenth of the
serial kernel's time on a 100k x 100k matrix with 10 entries a row (issue 38). Each
entry of C is the sum of at least one product, so the number of products,
``sum over A's entries (i, j) of B's row j's length``, bounds C's entries. That
bound costs one walk over A's entries, and the rows, built one after the other, need
no count of their own. The bound can be far above C's entries where rows of B
overlap (a banded matrix's square: 225 products, 29 entries a row); arrays are
allocated at the bound but only their written start is touched, and the call trims
them, copying where they keep at most half. Above ``CAP`` products the bound's
arrays would reserve gigabytes, so the assemble pass counts C's entries exactly
instead: each row's distinct columns, marked in an array over k.
"""

from __future__ import annotations

from typing import Protocol

from ucf.cin.notation import CIN
from ucf.format.format import Format
from ucf.format.levels import LevelKind
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Array, Const, Var
from ucf.lower import row_chunks
from ucf.lower.lattice import Op, Opnd, Term, presence
from ucf.lower.state import Operand
from ucf.schedule import Applied


class Lowering(Protocol):
    """What :func:`operands` reads of a ``ucf.lower.lowerer.Lowerer`` (which imports this
    module, so it is named by what it has)."""

    cin: CIN
    term: Term
    reduces: dict
    applied: Applied | None
    operands: dict[int, Operand]
    out_fmt: Format
    out_level_vars: list[str | None]

    def _fill(self, n: int) -> float: ...


#: Above this many products, the assemble pass counts the output exactly (its arrays
#: at the bound would reserve 1.5 GiB of address space with 32-bit indices).
CAP = 1 << 27
#: The output's compressed level: its kind, arrays and index type.
Rows = tuple[LevelKind, dict, str]
#: How ``k.cin`` says the output is built.
NOTE = (
    "arrays that hold one entry per product of the operands' entries (no pass counts "
    "its entries first; above {cap} products, the assemble pass does)"
)


def operands(lowerer: Lowering) -> tuple[int, int] | None:
    """(A, B), the operand numbers of ``C(i,k) = A(i,j) * B(j,k)`` where a kernel
    gathers C's rows in a workspace and A, B and C are stored as rows (a dense level,
    then a compressed one): the shape whose output a bound of products allows in one
    pass. None otherwise."""
    a = lowerer.applied
    term = lowerer.term
    if a is None or len(a.precompute) != 1:
        return None
    if a.fused or a.pos or a.assemble is not None or lowerer.cin.blocks:
        return None
    if not row_chunks.shares_rows(a, lowerer.out_level_vars, lowerer.out_fmt):
        return None
    if lowerer.out_fmt.fill or lowerer.reduces or len(lowerer.cin.reduction_vars) != 1:
        return None
    if not isinstance(term, Op) or term.op != "*":
        return None
    if not (isinstance(term.left, Opnd) and isinstance(term.right, Opnd)):
        return None
    if not _rows(lowerer.out_fmt.levels):
        return None
    (j,) = lowerer.cin.reduction_vars
    i, k = lowerer.out_level_vars
    first, second = lowerer.operands[term.left.n], lowerer.operands[term.right.n]
    for x, y in ((first, second), (second, first)):
        if _indexed(x, [i, j]) and _indexed(y, [j, k]):
            fills = lowerer._fill
            if presence(term, {x.n: False}, fills) is not False:
                return None
            if presence(term, {y.n: False}, fills) is not False:
                return None
            return x.n, y.n
    return None


def _rows(levels) -> bool:
    """A dense level, then a compressed one (CSR's or CSC's shape)."""
    return (
        len(levels) == 2
        and levels[0].full
        and not levels[1].full
        and levels[1].segment_array is not None
        and levels[1].coordinate_array is not None
    )


def _indexed(op: Operand, variables: list[str]) -> bool:
    """Whether operand ``op`` is stored as rows whose levels run over ``variables``."""
    return _rows(op.fmt.levels) and [ix.single_variable for ix in op.level_idx] == variables


def assemble(a: Operand, b: Operand, n_k: ir.Expr, counts: Array) -> list[ir.Stmt]:
    """The assemble pass: ``counts`` gets the bound of the output's entries (level 1) or,
    above ``CAP``, their exact count."""
    total, zero = Var("bound", I64), Const(0, I64)
    return [
        *_bound(a, b, n_k, total, None),
        ir.Store(counts, zero, zero),
        ir.Store(counts, Const(1, I64), total),
    ]


def rows(a: Operand, b: Operand, n_k: ir.Expr, out: Rows, shared: ir.For) -> list[ir.Stmt]:
    """For the parallel plan (``ucf.lower.row_chunks``): the output's positions get the
    bound of the entries before each row, the products of the rows before it (each
    row's counted on the threads of ``shared``, the loop over rows), or above ``CAP``
    (as the assemble pass sized the arrays) their exact count. ``out`` is the output's
    compressed level: its kind, arrays and index type."""
    return _bound(a, b, n_k, Var("bound", I64), out, shared)


def _bound(
    a: Operand,
    b: Operand,
    n_k: ir.Expr,
    total: Var,
    out: Rows | None,
    shared: ir.For | None = None,
) -> list[ir.Stmt]:
    """``total`` = the products of the operands' entries, or above ``CAP`` the exact
    count of the output's entries; with ``out``, each row's segment closes at the
    running total. The exact count's array over k is allocated either way (to a
    single element below ``CAP``): the llvm target hands every array to a parallel
    loop after it, so none may be allocated in a branch."""
    seen, over = Array("bound_seen", I64, True), ir.Cmp(">", total, Const(CAP, I64))
    one = Const(1, I64)
    return [
        ir.Decl(total, Const(0, I64)),
        *_products(a, b, total, out, shared),
        ir.Alloc(seen, ir.Select(over, ir.Bin("max", n_k, one), one)),
        ir.If(over, _exact(a, b, seen, total, out)),
        ir.Free(seen),
    ]


def _products(
    a: Operand, b: Operand, total: Var, out: Rows | None, shared: ir.For | None
) -> list[ir.Stmt]:
    """``total`` += the products of A's entries with B's rows, row by row of A; with
    ``out``, each row's products first close its segment (on the threads of ``shared``;
    at most ``CAP + 1``, so they fit the index type), and then a running sum of them."""
    a_rows, b_rows = a.fmt.levels[1], b.fmt.levels[1]
    a_arrays, b_arrays = a.params.levels[1], b.params.levels[1]
    i, p, j, mine = (Var(v, I64) for v in ("ib", "pb", "jb", "rowb"))
    a_begin, a_end = (ir.cast(e, I64) for e in a_rows.bounds(a_arrays, i, None, a.dim(1)))
    b_begin, b_end = (ir.cast(e, I64) for e in b_rows.bounds(b_arrays, j, None, b.dim(1)))
    into = total if out is None else mine
    step = [
        ir.Decl(j, ir.cast(a_rows.coordinate(a_arrays, p), I64)),
        ir.Assign(into, ir.add(into, ir.sub(b_end, b_begin))),
    ]
    if out is None or shared is None:  # the total alone: one walk over A's entries
        assert out is None
        first = ir.cast(a_rows.bounds(a_arrays, Const(0, I64), None, a.dim(1))[0], I64)
        end = ir.cast(a_rows.bounds(a_arrays, a.dim(0), None, a.dim(1))[0], I64)
        return [ir.For(p, first, end, step)]
    row: list[ir.Stmt] = [ir.For(p, a_begin, a_end, step)]
    kind, arrays, it = out
    cap = Const(CAP + 1, I64)
    row = [ir.Decl(mine, Const(0, I64)), *row, *kind.close(arrays, i, ir.minimum(mine, cap), it)]
    count = ir.For(
        i,
        Const(0, I64),
        a.dim(0),
        row,
        parallel=shared.parallel,
        strategy=shared.strategy,
        parallel_if=shared.parallel_if,
    )
    r = Var("rb", I64)
    counted = ir.cast(kind.bounds(arrays, r, None, None)[1], I64)
    running = [
        ir.Assign(total, ir.add(total, counted)),
        *kind.close(arrays, r, ir.minimum(total, cap), it),
    ]
    return [count, ir.For(r, Const(0, I64), a.dim(0), running)]


def _exact(a: Operand, b: Operand, seen: Array, total: Var, out: Rows | None) -> list[ir.Stmt]:
    """``total`` = the count of distinct (i, k) over the products: each row's columns
    marked in ``seen`` with the row's number plus one, so no row clears it; with
    ``out``, each row's end closes its segment at the running count."""
    a_rows, b_rows = a.fmt.levels[1], b.fmt.levels[1]
    a_arrays, b_arrays = a.params.levels[1], b.params.levels[1]
    i, p, q, j, k = (Var(v, I64) for v in ("ie", "pe", "qe", "je", "ke"))
    a_begin, a_end = (ir.cast(e, I64) for e in a_rows.bounds(a_arrays, i, None, a.dim(1)))
    b_begin, b_end = (ir.cast(e, I64) for e in b_rows.bounds(b_arrays, j, None, b.dim(1)))
    mark = ir.add(i, Const(1, I64))
    inner = [
        ir.Decl(k, ir.cast(b_rows.coordinate(b_arrays, q), I64)),
        ir.If(
            ir.Cmp("!=", ir.Load(seen, k), mark),
            [ir.Store(seen, k, mark), ir.Assign(total, ir.add(total, Const(1, I64)))],
        ),
    ]
    entry = [
        ir.Decl(j, ir.cast(a_rows.coordinate(a_arrays, p), I64)),
        ir.For(q, b_begin, b_end, inner),
    ]
    row: list[ir.Stmt] = [ir.For(p, a_begin, a_end, entry)]
    if out is not None:
        kind, arrays, it = out
        row += kind.close(arrays, i, total, it)
    return [ir.Assign(total, Const(0, I64)), ir.For(i, Const(0, I64), a.dim(0), row)]
