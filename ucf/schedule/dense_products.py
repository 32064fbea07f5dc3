"""The default schedule of a product of dense operands into a dense output, the way BLAS
runs a GEMM: ``C(i,j) = A(i,k)*B(k,j)`` with every tensor dense.

The plain order ``i, k, j`` walks all of ``k`` for each row of ``C``, a reduction too
long for the register tiles of ``ucf.passes.registers`` (``MAX_REDUCTION``): every
multiply-add loads and stores ``C``, and 1000^3 float32 ran at 20 GFLOP/s on one Zen 5
core, 2.5x numpy's (OpenBLAS) time. Split into blocks of ``k`` of ``DEPTH`` steps
(``k1``, a constant trip count), with the rows in blocks of ``ROWS_PER_BLOCK`` (``i1``)
above it, the nest ``i0, k0, i1, k1, j`` is the blocked nest the tiles were built for
(a bcsr block row's ``i_in, k_in, j``): each group of rows holds a tile of ``C`` in
registers over a block of ``k``, and the ``DEPTH`` rows of ``B`` the block reads are
packed into a panel once per block of rows, as BLAS packs its B panel. Rows and columns
past the last whole tile run in the plain nest, so any shape is computed.

Every output element still sums its terms in ``k``'s order, one fused multiply-add each,
as the plain nest does: the split changes no result, bit for bit.
"""

from __future__ import annotations

from ucf.cin.notation import CIN
from ucf.lang.ast import accesses, fresh
from ucf.lang.reductions import peel
from ucf.schedule.commands import Command, Parallelize, Reorder, SplitCommand
from ucf.schedule.gathering import is_product
from ucf.schedule.parallel_loops import THREADS

#: Steps of ``k`` a tile adds before its ``C`` goes back to memory: ``DEPTH`` rows of
#: ``B`` (256 KB of float32 at 1000 columns) make the panel, which stays in the L2 cache
#: while every group of rows reads it. Within ``register_nests.MAX_REDUCTION``.
DEPTH = 64
#: Rows of ``C`` per block (``i1``): the groups of rows that share one packed panel.
#: 1000^3 float32 on one thread: 53 GFLOP/s with blocks of 64 rows (the panel packed 16
#: times as often), 81 with 256.
ROWS_PER_BLOCK = 256
#: A parallel block of rows keeps at least this many rows, so its panel serves enough
#: groups of rows to pay for its packing.
MIN_ROWS = 32
#: The fewest columns (``j``) the plan is for: the widest tile (``registers``: 2 vectors
#: of 16 float32 with AVX-512). Narrower outputs fill no tile, and the blocked nest
#: without tiles ran 2.5-5x slower than the plain one (20000 x 128 x 8, one thread).
MIN_COLUMNS = 32
#: ... and rows: a group of the tiles (``register_nests.ROWS``).
MIN_TILE_ROWS = 4


def plan(cin: CIN, extents: dict[str, int] | None, threads: int) -> tuple[list[Command], list[str]]:
    """The blocked GEMM schedule for ``cin`` and its reasons for ``k.cin``, or ``([], [])``
    when ``cin`` is not a product of two dense operands whose loop order ends in the
    reduction ``k`` and the output's unit-stride variable ``j``, under a row variable
    ``i`` of the output (batch variables may come first), or when the call's ``extents``
    (None before any call) leave no whole tile; they also size the blocks of rows of a
    parallel plan."""
    stmt = cin.statement
    summed, body = peel(stmt.rhs)
    order = list(cin.order)
    if (
        len(summed) != 1
        or not is_product(body)
        or len(accesses(body)) != 2
        or cin.nested_vars
        or cin.blocks
        or not cin.output_format.is_dense
        or not all(slot.format.is_dense for slot in cin.slots.values())
        or len(order) < 3
    ):
        return [], []
    (k,) = summed
    i, red, j = order[-3:]
    outs = cin.output_vars
    if red != k or i not in outs or not outs or outs[-1] != j:
        return [], []
    if cin.output_format.mode_order[-1] != len(outs) - 1:
        return [], []  # j must be the output's unit stride too: the tiles store rows of it
    for n, a in enumerate(accesses(body)):
        fmt = cin.slots[n].format
        if j in {v for idx in a.indices for v in idx.variables} and (
            a.indices[-1].single_variable != j or fmt.mode_order[-1] != len(a.indices) - 1
        ):
            return [], []  # j must be every operand's unit stride, as the tiles read it
    if extents and (
        extents.get(j, MIN_COLUMNS) < MIN_COLUMNS or extents.get(i, MIN_TILE_ROWS) < MIN_TILE_ROWS
    ):
        return [], []  # no whole tile: the plain nest is faster
    rows = ROWS_PER_BLOCK
    if threads > 1 and extents and i in extents:
        per_thread = -(-extents[i] // threads)
        rows = max(MIN_ROWS, min(rows, -(-per_thread // 8) * 8))
    i0, i1, k0, k1 = f"{i}0", f"{i}1", f"{k}0", f"{k}1"
    taken = set(order)
    i0, i1, k0, k1 = (fresh(v, taken) for v in (i0, i1, k0, k1))
    commands: list[Command] = [
        SplitCommand(k, k0, k1, DEPTH),
        SplitCommand(i, i0, i1, rows),
        Reorder((*order[:-3], i0, k0, i1, k1, j)),
    ]
    why = [
        f"default: dense product blocked as a GEMM: {k} in blocks of {DEPTH} ({k1}) inside "
        f"blocks of {rows} rows ({i1}), so each group of rows keeps a tile of "
        f"{stmt.lhs.tensor} in registers over a block of {k}, reading a panel of the "
        f"block's rows packed once per block of rows"
    ]
    if threads > 1:
        commands.append(Parallelize(i0, THREADS))
        why.append(f"default: parallel loop {i0}, the blocks of rows, shared out statically")
    return commands, why
