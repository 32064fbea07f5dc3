"""The default schedule's innermost loop on the CPU: ``bound`` to its extent at the call,
and the register tiles of a bounded output loop under reductions.

Split out of ``ucf.schedule.cpu_model``, which asks this for every loop order it
proposes: a constant trip count lets the compiler unroll and vectorize the innermost
loop, and a tile of the output row held in registers across the reductions spares
loading and storing the whole row at every step (``ucf.passes.registers``).
"""

from __future__ import annotations

from ucf.cin.notation import CIN
from ucf.lang.ast import accesses
from ucf.schedule.commands import BoundCommand, Command, Reorder, SplitCommand
from ucf.schedule.stats import Stats

#: The innermost dense loop is bounded (a constant trip count the compiler can unroll and
#: vectorize) up to this extent.
MAX_BOUND = 256
#: A bounded output loop wider than the largest of these runs in register tiles of the
#: largest that divides its extent, each tile's outer loop moved above the reductions, so
#: the output's tile stays in registers across them (SpMM with N = 128: 41.7 ms a call
#: untiled, 18.5 ms in tiles of 32, on one Zen 5 thread; N = 48: 11.7 ms, 6.9 in tiles
#: of 16). A row of 32 float64 fits the registers whole.
TILES = (32, 16)
#: Under two or more reductions (MTTKRP's k, l) the tiles hold 16 from 32 on: each step
#: also holds a tile of the inner product (B*C), and tiles of 32 ran no faster than the
#: untiled row (MTTKRP R = 64 on the headroom suite's tensors, 2 threads: tiles of 16
#: 1.3-2.3x faster than the untiled row on three of four, 5 % slower on the fourth).
NESTED_TILE = 16
#: Entries per row of a fixed-width operand (``ell(w)``, ``nm(n,m)``) from which the
#: bounded loop takes no register tiles and its rows run in groups instead
#: (``ucf.passes.row_groups``, which needs the plain order): a tile of one row adds
#: the row's entries in one chain of dependent multiply-adds per vector, which the core
#: overlaps with the next tile's only while the chain is short. One Zen 5 thread,
#: float32: N:M SpMM 2000 x 512 (256 entries a row) by 32 to 256 columns ran 5-6x
#: faster in groups (N = 256: 18.5 ms in tiles, 3.6 in groups); ELL(16) by 64 to 256
#: columns 1.3x faster in groups, but 1.4x slower in float64 at 256 columns.
LONG_ROW = 64


def plan(
    cin: CIN, order: list[str], stats: Stats | None, parallel: str | None
) -> list[tuple[Command, str]]:
    """``bound`` on the innermost loop when it is dense over every operand and its
    extent is small and known: a constant trip count unrolls and vectorizes. Then the
    bounded loop's register tiles, if it takes them. Each command with its reason for
    ``k.cin`` (empty for a command that needs none); empty when nothing is bounded."""
    if stats is None or not order:
        return []
    v = order[-1]
    n = stats.extents.get(v, 0)
    # A block's places have a constant extent already, clipped at a partial block; a
    # bound would run them over the padding.
    if v == parallel or v in cin.nested_vars or v in cin.blocks or not 1 <= n <= MAX_BOUND:
        return []
    # A sum over the innermost loop runs in partial sums (``ucf.passes.partial_sums``),
    # which a constant trip count would keep in one chain: SDDMM's dot over k ran 2.5x
    # slower bounded. A loop of one step has no chain to keep, and bounded it is gone
    # (the gradient of an SDDMM's B at K = 1: 7.37 ms bounded, 7.97 not, 100k rows).
    if n > 1 and not any(v in idx.variables for idx in cin.statement.lhs.indices):
        return []
    for k, a in enumerate(accesses(cin.statement.rhs)):
        fmt = cin.slots[k].format
        for m, idx in enumerate(a.indices):
            if v in idx.variables and (
                idx.single_variable != v or not fmt.levels[fmt.level_of_mode(m)].full
            ):
                return []
    return [
        (
            BoundCommand(v, f"{v}_b", n),
            f"default: bound({v}) to {n}, the innermost loop's extent at this call, so its "
            "trip count is a constant",
        ),
        *([] if _long_fixed_rows(cin, stats) else _register_tile(cin, order, f"{v}_b", n)),
    ]


def _long_fixed_rows(cin: CIN, stats: Stats) -> bool:
    """Whether a fixed-width operand stores at least ``LONG_ROW`` entries a row (its
    entries over the extent of its first stored mode's variable)."""
    for k, a in enumerate(accesses(cin.statement.rhs)):
        slot = cin.slots[k]
        if not slot.format.fixed_width:
            continue
        row = a.indices[slot.format.mode_order[0]].single_variable
        rows = stats.extents.get(row, 0) if row else 0
        if rows and stats.nnz.get(slot.tensor, 0) >= LONG_ROW * rows:
            return True
    return False


def _register_tile(cin: CIN, order: list[str], vb: str, n: int) -> list[tuple[Command, str]]:
    """Register tiles of the bounded innermost output loop ``vb`` (extent ``n``) where the
    order is output loops, then reductions, then it (SpMM's i, j, k; MTTKRP's i, k, l, j):
    each tile's outer loop runs above the reductions, so the reductions add into one
    tile of the output held in registers instead of loading and storing a whole row of
    it at every step."""
    outs = set(cin.output_vars)
    first = next((k for k, w in enumerate(order) if w not in outs), None)
    if first in (None, 0) or any(w in outs for w in order[first:-1]):
        return []
    if len(order) - 1 - first > 1:
        tile = NESTED_TILE if n % NESTED_TILE == 0 and n >= 2 * NESTED_TILE else None
    else:
        tile = next((t for t in TILES if n % t == 0), None) if n > TILES[0] else None
    if tile is None:
        return []
    t, r = f"{vb}_t", f"{vb}_r"
    new = (*order[:first], t, *order[first:-1], r)
    return [
        (
            SplitCommand(vb, t, r, tile),
            f"default: {order[-1]} runs in register tiles of {tile} ({t} above the "
            f"reductions over {', '.join(order[first:-1])}), so each tile of the output "
            "stays in registers while they add into it",
        ),
        (Reorder(new), ""),
    ]
