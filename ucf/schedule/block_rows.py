"""Block rows that keep a static split on CPU threads: where a bcsr product reads the
dense factor's rows in place (``ucf.passes.panels.IN_PLACE_USES``), its tiles prefetch
the next stored block's rows of that factor across block rows (``TileState.across``),
which only pays when a thread's block rows follow each other: a static split (on the
llvm target, ``CHUNKS_PER_THREAD`` runs of consecutive block rows a thread, handed out
from one counter) rather than the dynamic chunks of one block row that heavy block rows
otherwise get (``cpu_model._parallel``), where each row's first block finds its rows of
B cold and packs its panel from them.

bcsr(32,32) SpMM 1024^3 float32, 90 % zero blocks (3.3 blocks a block column), two
threads, ucf's llvm kernels alternated in one process, B evicted before each call,
passive waits (so the CPU time is the work): the static plan took 0.90x the CPU time of
dynamic chunks of one block row, 0.82x straight after itself; at 50 % zero blocks (16
blocks a block column, every panel packed) both the same (bench/README.md, h89).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ucf.cin.notation import CIN

if TYPE_CHECKING:
    from ucf.schedule.cpu_model import Stats


def reads_in_place(cin: CIN, rows: str, stats: Stats, tensor: str, work: float) -> bool:
    """Whether a product whose ``rows`` are the block rows of the sparse ``tensor``,
    ``work`` multiply-adds in all, reads the dense factor in place: at most
    ``IN_PLACE_USES`` blocks a block column, and the factor's panels (its rows for every
    block column) over ``NEAR_BYTES``, as ``ucf.passes.panels.packed`` tests at the call."""
    from ucf.passes import panels  # the tile passes load llvmlite: not at import

    sizes = {outer: size for _, outer, size in cin.blocks.values()}
    stored = stats.nnz.get(tensor, 0)
    if rows not in sizes or len(sizes) != 2 or stored <= 0:
        return False
    (columns,) = (o for o in sizes if o != rows)
    blocks = stored / (sizes[rows] * sizes[columns])
    across = stats.extents.get(columns, 0)
    width = work / stored  # the dense factor's columns: a stored value's multiply-adds
    value = max((b for t, b in stats.itemsize.items() if t != tensor), default=4)
    panel_bytes = across * sizes[columns] * width * value
    return blocks <= panels.IN_PLACE_USES * across and panel_bytes > panels.NEAR_BYTES
