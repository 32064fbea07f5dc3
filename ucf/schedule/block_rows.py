"""Where bcsr products read the dense factor's rows in place, and the split of their
block rows on CPU threads that goes with it: what the default plan
(``ucf.schedule.parallel_loops``) and the panels pass (``ucf.passes.panels``) both decide by.

Where a call stores few blocks a block column (``IN_PLACE_USES``) and B's panels would
exceed a thread's L2 (``NEAR_BYTES``), the tiles read B's rows in place instead of
packing panels, and each block prefetches the next stored block's rows of B across block
rows (``TileState.across``). That needs a thread's block rows to follow each other: a
static split (on the llvm target ``llvm_openmp.CHUNKS_PER_THREAD`` runs of consecutive block rows a
thread, handed out from one counter; on c one run a thread), not the dynamic chunks of
one block row that heavy block rows otherwise get (``parallel_loops.shared_out``), where no
thread knows its next row: each row's first block then packs its panel from B's rows
cold. bcsr(32,32) SpMM 1024^3 float32, 90 % zero blocks (3.3 blocks a block column), two
threads, ucf's llvm kernels alternated in one process with passive waits (so CPU time is
work): the static plan took 0.90-0.91x the CPU time of chunks of one block row with B
evicted before each call, 0.82-0.88x straight after itself (three runs); at 50 % zero
blocks (16 blocks a block column: every panel packed) both the same (bench/README.md, h89).
"""

from __future__ import annotations

from typing import Protocol

from ucf.cin.notation import CIN

#: Blocks per panel of the call at most (the blocks stored over the block columns) for
#: which the tiles read B's rows in place instead of packing the panels, where those
#: panels exceed ``NEAR_BYTES``: packing a panel read by few blocks costs more than
#: the panel saves. bcsr(32,32) SpMM 1024^3 float32 (bench/block_variants.py, ucf's C
#: kernel, B and C evicted before each call, one Zen 4 thread, process CPU time):
#: 3.3 blocks a block column (90 % zero blocks) read in place 0.90x the time where B's
#: and C's rows lie apart in the 4 KB an L1 way spans, 1.0x where they share it; 15.7
#: (50 %) 0.99x apart and 1.10x sharing, so those pack. Without the prefetch of the
#: next block's B rows it needs, in place took 1.14-1.24x.
IN_PLACE_USES = 4
#: A thread's panels up to this many bytes stay in its L2 (1 MB a core on Zen 5), and
#: the next block's panel is not prefetched.
NEAR_BYTES = 1 << 20
#: The most a static split may give one thread over its share of the stored blocks and
#: still be kept (``static_rows``): on c a static loop is one run of rows a thread, and
#: chunks of one block row cost 1.11x (B cold) to 1.22x (warm) the work at 90 % zero
#: blocks. In ``Stats.key``, so calls either side of it get plans of their own.
SHARE = 1.25
#: What ``k.cin`` adds to the static split's reason where ``static_rows`` kept it.
WHY = (
    ": a thread's block rows follow each other, so its tiles read B in place, or pack it,"
    " with the next stored block's rows prefetched across rows (block_rows)"
)


class Stats(Protocol):
    """What ``static_rows`` reads of ``ucf.schedule.stats.Stats``."""

    extents: dict[str, int]
    nnz: dict[str, int]
    itemsize: dict[str, int]

    def share(self, tensor: str, threads: int) -> float: ...


def static_rows(
    cin: CIN, rows: str, stats: Stats, tensors: list[str], work: float, threads: int
) -> bool:
    """Whether the block rows ``rows`` of one of the sparse ``tensors`` (``work``
    multiply-adds in all) keep a static split on ``threads``: at most ``IN_PLACE_USES``
    blocks a block column and the dense factor's panels (its rows for every block
    column) over ``NEAR_BYTES``, the test ``ucf.passes.panels.packed`` makes at the call
    (where the factor is a computation, TeSA's ``relu(T)``, the tiles pack it, and still
    prefetch the next block's rows of it across rows), and the split within ``SHARE``.
    ``Stats.key`` buckets stored entries by bit length only, so calls on either side of
    the ``IN_PLACE_USES`` threshold within one bucket share the split the first decided:
    a plan that may run slower, never a wrong one, since the panels pass decides in place
    or packed at each call."""
    sizes = {outer: size for _, outer, size in cin.blocks.values()}
    if rows not in sizes or len(sizes) != 2:
        return False
    (columns,) = (o for o in sizes if o != rows)
    across = stats.extents.get(columns, 0)
    for t in tensors:
        stored = stats.nnz.get(t, 0)
        if stored <= 0 or stats.share(t, threads) > SHARE:
            continue
        blocks = stored / (sizes[rows] * sizes[columns])
        width = work / stored  # the dense factor's columns: a stored value's multiply-adds
        value = max((b for u, b in stats.itemsize.items() if u != t), default=4)
        if (
            blocks <= IN_PLACE_USES * across
            and across * sizes[columns] * width * value > NEAR_BYTES
        ):
            return True
    return False
