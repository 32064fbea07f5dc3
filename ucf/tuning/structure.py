"""Which storage can pay on a given matrix, from cheap statistics of its nonzeros.

A format search that offered every blocked and fixed-width format on every input
would spend most of its trials on storage that cannot win: ``bcsr(8,8)`` on a
matrix with scattered nonzeros stores about 64 values per nonzero, and ``ell(w)``
on a power-law matrix pads every row to the longest. What decides is how much
of the stored values would be padding, and that is cheap to count on the
coordinates (one merge sort per block shape):

- the *block fill* of ``bh x bw`` blocks: nonzeros over the values the live
  blocks store, ``nnz / (live blocks * bh * bw)``;
- the *row fill* of ELL: nonzeros over ``rows * longest row``.

A format is offered when its fill is at least ``BLOCK_FILL_MIN`` (blocks) or
``ROW_FILL_MIN`` (ELL). The bars are set from ``bench/autoschedule.py``'s suite at
50k rows, one thread: ``bcsr(8,8)`` on 32x32 blocks at fill 0.39 still ran SpMM
1.08x faster than CSR, and at the 0.25 fill of 2x2 blocks on a uniform random
matrix every block shape lost 2-3x; ``ell`` at row fill 0.53 won SpMV and lost
SpMM, and at fill 1.0 (even rows) it won both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ucf.format.format import Format
from ucf.format.tensor import Tensor

#: Block shapes tried (rows x columns): square ones for 2-D structure, thin ones for
#: runs along a row or down a column.
BLOCKS = ((2, 2), (4, 4), (8, 8), (1, 4), (4, 1))
#: The least block fill at which a ``bcsr`` format is offered.
BLOCK_FILL_MIN = 1 / 3
#: The least row fill at which ``ell`` is offered.
ROW_FILL_MIN = 1 / 2
#: Rows taken together when a large matrix is sampled (a multiple of every block height).
SAMPLE_ROWS = 64
#: Nonzeros past which the block fill is estimated on evenly spaced runs of rows.
MAX_SAMPLE = 1 << 20


@dataclass(frozen=True)
class Offer:
    """A format worth a trial on a matrix, and the statistic that says so."""

    format: Format
    fill: float  # nonzeros over the values the format would store


def _csr(t: Tensor) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Row pointers and column indices of a matrix, in whatever format it is stored."""
    m = t.to_scipy().tocsr()
    return np.asarray(m.indptr, dtype=np.int64), np.asarray(m.indices, dtype=np.int64), m.shape


def _sample(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row and column coordinates of the nonzeros, of evenly spaced runs of
    ``SAMPLE_ROWS`` rows when there are more than ``MAX_SAMPLE`` of them (so a block
    never straddles a run's edge, and fills are ratios that a sample estimates)."""
    n_rows = indptr.size - 1
    lengths = np.diff(indptr)
    if int(indptr[-1]) <= MAX_SAMPLE:
        return np.repeat(np.arange(n_rows), lengths), indices
    starts = np.arange(0, n_rows, SAMPLE_ROWS)
    keep = max(1, int(starts.size * MAX_SAMPLE / int(indptr[-1])))
    starts = starts[np.linspace(0, starts.size - 1, keep).astype(np.int64)]
    rows = (starts[:, None] + np.arange(SAMPLE_ROWS)).ravel()
    rows = rows[rows < n_rows]
    taken = lengths[rows]
    first = np.repeat(indptr[rows] - (np.cumsum(taken) - taken), taken)
    return np.repeat(rows, taken), indices[first + np.arange(int(taken.sum()))]


def block_fill(rows: np.ndarray, cols: np.ndarray, bh: int, bw: int, n_cols: int) -> float:
    """Nonzeros over the values the live ``bh x bw`` blocks store (1.0: no padding)."""
    if rows.size == 0:
        return 0.0
    # Each row's keys are sorted already (CSR order), so a merge sort runs through the
    # block row's few sorted runs: several times faster than np.unique's quicksort.
    keys = np.sort((rows // bh) * (-(-n_cols // bw)) + cols // bw, kind="stable")
    live = 1 + int(np.count_nonzero(keys[1:] != keys[:-1]))
    return rows.size / (live * bh * bw)


def offers(t: Tensor) -> list[Offer]:
    """The blocked and fixed-width formats that can pay on matrix ``t``, best fill first."""
    if t.order != 2 or t.nnz == 0:
        return []
    indptr, indices, (n_rows, n_cols) = _csr(t)
    rows, cols = _sample(indptr, indices)
    found = []
    for bh, bw in BLOCKS:
        if bh <= n_rows and bw <= n_cols:
            fill = block_fill(rows, cols, bh, bw, n_cols)
            if fill >= BLOCK_FILL_MIN:
                found.append(Offer(Format.blocked_rows(bh, bw), fill))
    longest = int(np.diff(indptr).max())
    row_fill = int(indptr[-1]) / (n_rows * longest)
    if row_fill >= ROW_FILL_MIN:
        found.append(Offer(Format.ell(2, longest), row_fill))
    return sorted(found, key=lambda o: -o.fill)
