"""A dense tensor copied into another mode order (a transposition), by blocks of its
outermost stored mode, on several threads.

A kernel that reads a dense operand against its storage (SDDMM's row-major ``D(k,j)``
under loops ``i, j, k``: each step of the dot product over k a cache line apart) reads a
copy stored in the order its loops walk (``convert(D)``, ``ucf.schedule.strided_operands``).
The copy is made before every call, so it must cost about one pass over the operand:
numpy's copy of a transposed view, cut into blocks of destination rows so each block's
reads stay in cache, and the blocks shared out over the kernel's threads (numpy
releases the GIL while it copies). Going through ``to_numpy`` and ``from_numpy``
instead copies twice.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np

from ucf.format.format import Format

#: Each block copies about this many bytes: its reads (one short run of each source row)
#: stay in L2 while the block's destination rows fill.
BLOCK_BYTES = 1 << 18
#: Below this many bytes the copy runs on the calling thread: handing blocks to others
#: would cost more than it saves.
PARALLEL_BYTES = 1 << 21


def relayable(stored: Format, fmt: Format) -> bool:
    """Whether ``relaid`` converts ``stored`` to ``fmt``: both dense, unblocked, plain
    values, with other mode orders."""
    return (
        stored.is_dense
        and fmt.is_dense
        and not (stored.blocked or fmt.blocked)
        and stored.values is None
        and fmt.values is None
        and stored.mode_order != fmt.mode_order
    )


def same_layout(stored: Format, fmt: Format, shape: tuple[int, ...]) -> bool:
    """Whether a ``relayable`` pair lays a tensor of ``shape`` out alike: their mode
    orders agree once the modes of extent 1 are dropped, which no order places apart
    (SDDMM's D of K = 1 rows, ``(1, n)``, is C- and Fortran-ordered at once: read as
    ``UU:1,0`` it was copied on every call, and the call could not be replayed), or
    when it holds nothing."""
    if 0 in shape:
        return True
    moving = [m for m in stored.mode_order if shape[m] > 1]
    return moving == [m for m in fmt.mode_order if shape[m] > 1]


def relaid(
    vals: np.ndarray,
    shape: tuple[int, ...],
    stored: Format,
    fmt: Format,
    dtype: np.dtype,
    threads: int = 1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The values of a dense tensor of ``shape`` stored as ``stored`` (``vals``, flat in
    its level order), laid out as dense ``fmt`` in ``dtype``: a flat array, ``out`` (of
    as many elements, C-contiguous, its contents overwritten) where given, else fresh."""
    src = vals.reshape(stored.level_dims(shape))
    view = src.transpose([stored.mode_order.index(m) for m in fmt.mode_order])
    out = np.empty(view.shape, dtype=dtype) if out is None else out.reshape(view.shape)
    rows = view.shape[0] if view.ndim else 1
    if view.ndim == 0 or rows == 0:
        out[...] = view
        return out.reshape(-1)
    per_row = max(out[0].nbytes, 1)
    block = max(BLOCK_BYTES // per_row, 1)
    cuts = list(range(0, rows, block)) + [rows]
    spans = list(zip(cuts, cuts[1:], strict=False))
    if threads <= 1 or out.nbytes < PARALLEL_BYTES or len(spans) < 2:
        for lo, hi in spans:
            out[lo:hi] = view[lo:hi]
        return out.reshape(-1)
    share = -(-len(spans) // threads)

    def copy(part: list[tuple[int, int]]) -> None:
        for lo, hi in part:
            out[lo:hi] = view[lo:hi]

    parts = [spans[k : k + share] for k in range(0, len(spans), share)]
    list(_pool(threads).map(copy, parts))
    return out.reshape(-1)


@cache
def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per thread count, kept for the process (its threads sleep between calls)."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ucf-relayout")
