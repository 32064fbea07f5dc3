"""The default schedules of target cuda, best first: the rows of the output over GPU
blocks and threads, a blocked operand's blocks over the grid, the output's variables
moved outermost where the outermost loop sums. The pipeline tries them in turn and
keeps the first that schedules and maps onto the grid; ``k.cin`` says why.
"""

from __future__ import annotations

from collections.abc import Callable

from ucf.cin.notation import CIN
from ucf.schedule.commands import Command, Parallelize, Reorder, SplitCommand
from ucf.schedule.cpu_model import integer_order
from ucf.schedule.records import Parallel

#: Loops over GPU blocks and over a block's threads, each iteration independent.
BLOCKS = Parallel("GPUBlock", "NoRaces")
THREADS = Parallel("GPUThread", "NoRaces")


def propose_gpu(cin: CIN) -> list[tuple[list[Command], list[str], bool]]:
    """The default GPU schedules of ``cin``, best first, each as its commands, the notes
    that explain it, and whether it may fail (only the plain rows over threads may
    not): the reduction of quantized products inside the output's loops first, as on
    the CPU (``ucf.schedule.cpu_model``), then a blocked operand's blocks over the
    grid, then rows over threads in the plain order, then the output's variables
    moved outermost."""

    def rows(prefix: list[Command], v: str) -> list[Command]:
        return [
            *prefix,
            SplitCommand(v, f"{v}_blk", f"{v}_thr", DEFAULT_GPU_THREADS),
            Parallelize(f"{v}_blk", BLOCKS),
            Parallelize(f"{v}_thr", THREADS),
        ]

    order, exact, why = integer_order(cin, list(cin.order))
    tries = [(rows(exact, order[0]), why, True)] if exact else []
    tries += [(commands, [note], True) for commands, note in _block_tiles(cin)]
    tries.append((rows([], cin.order[0]), [], False))
    return tries + _output_first(cin, rows)


#: Threads per block of the default GPU schedule.
DEFAULT_GPU_THREADS = 128
#: Most threads of a GPU block (CUDA's limit).
MAX_GPU_THREADS = 1024


def _output_first(
    cin: CIN, rows: Callable[[list[Command], str], list[Command]]
) -> list[tuple[list[Command], list[str], bool]]:
    """Where the outermost loop sums (a ``bcsc`` or ``csc`` operand's columns), the
    output's variables moved outermost, last first (neighbouring threads then touch
    neighbouring elements of a row-major output), each split over GPU blocks and
    threads: a thread per slice of the output, walking the whole operand. A storage
    order that keeps the variable under the sum makes the ``reorder`` fail and the
    try drop out. Last, the summing loop itself over blocks and threads adding
    atomically (CSC SpMV): the order of the additions then varies from run to run,
    which beats one GPU thread. Empty when the outermost loop is the output's."""
    out = [i.single_variable for i in cin.statement.lhs.indices]
    if not cin.order or cin.order[0] in out:
        return []
    tries = []
    for x in reversed(out):
        if x is None or x not in cin.order:
            continue
        order = (x, *(v for v in cin.order if v != x))
        note = (
            f"default: {x} moved outermost and split over GPU blocks and threads, since the "
            f"outermost loop {cin.order[0]} sums into the output (a thread per {x})"
        )
        tries.append((rows([Reorder(order)], x), [note], True))
    v = cin.order[0]
    atomic = [
        SplitCommand(v, f"{v}_blk", f"{v}_thr", DEFAULT_GPU_THREADS),
        Parallelize(f"{v}_blk", Parallel("GPUBlock", "Atomics")),
        Parallelize(f"{v}_thr", Parallel("GPUThread", "Atomics")),
    ]
    note = (
        f"default: {v} over GPU blocks and threads adding atomically, since it sums into the "
        "output and no output variable can run outside it"
    )
    return [*tries, (atomic, [note], True)]


def _block_tiles(cin: CIN) -> list[tuple[list[Command], str]]:
    """The default GPU mappings of a kernel whose outermost loop runs over the blocks
    of a blocked output mode (a ``bcsr`` operand's block rows), best first, each with
    the note that explains it: a GPU block per block of the output, a thread per
    place in it, and the output's last dense variable split over more threads, a
    grid axis of its own, so that neighbouring threads load and store neighbouring
    elements along it (a thread tile per output block). Then the same without that
    split. Empty when the outermost loop is not over blocks."""
    v = cin.order[0]
    out = [i.single_variable for i in cin.statement.lhs.indices]
    places = [inner for inner, (_, outer, _) in cin.blocks.items() if outer == v]
    if not places or places[0] not in out or places[0] not in cin.order:
        return []
    place, size = places[0], cin.blocks[places[0]][2]
    if size > MAX_GPU_THREADS:
        return []
    blocks = [Parallelize(v, BLOCKS), Parallelize(place, THREADS)]
    plain = (blocks, f"default: {v} over GPU blocks and {place} over their threads")
    lanes = min(32, MAX_GPU_THREADS // size)
    split = set(cin.blocks) | {outer for _, outer, _ in cin.blocks.values()}
    dense = [x for x in out if x not in split]
    if not dense or lanes < 2:
        return [plain]
    j = dense[-1]
    rest = [x for x in cin.order[1:] if x != j]
    order = [v, f"{j}_blk", *rest]
    order.insert(order.index(place) + 1, f"{j}_thr")
    tiled = [
        SplitCommand(j, f"{j}_blk", f"{j}_thr", lanes),
        Reorder(tuple(order)),
        *blocks,
        Parallelize(f"{j}_blk", BLOCKS),
        Parallelize(f"{j}_thr", THREADS),
    ]
    why = (
        f"default: {v} and {j}_blk over GPU blocks, {place} and {j}_thr ({lanes} of {j}) "
        f"over their threads: a thread per element of a tile of the output"
    )
    return [(tiled, why), plain]
