"""The operand statistics the default schedule reads at a call (``ucf.schedule.cpu_model``):
what they hold, how a call's key reads them, and how they are measured.

They must cost next to nothing: extents and stored-entry counts are already at
hand, and the statistics that read an array, how unevenly rows are filled, are
kept per ``pos`` array, so calling a kernel again on the same operand does
not read it again. The thresholds of uneven rows live here, beside the key that
buckets the statistics by them: calls the key does not tell apart must get the
same schedule, so the key and the decision (``uneven``) read the same values.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.schedule import block_rows, short_fibers

#: Rows are shared out in chunks only when some row is this many times the mean...
SKEWED = 4.0
#: ... or a static split would give some thread this many times its share of entries...
BALANCED = 1.1
#: ... or this many times, when every row holds a chunk's work
#: (``ucf.schedule.parallel_loops.CHUNK_WORK``; a block row of bcsr SpMM): handing out
#: rows one at a time then costs nothing next to running them.
HEAVY_BALANCED = 1.02
#: The thread counts the imbalance is measured for (2 to this); more threads read this one.
MAX_SHARES = 64


@dataclass(frozen=True)
class Stats:
    """What a call knows about its operands before running: extents per index
    variable, stored entries per operand, and per sparse operand the longest
    row over the mean row (1.0 for even rows) and, for 2, 3, ... ``MAX_SHARES``
    threads, the largest share of its entries a static split of its rows gives
    one thread over the mean share (``segments``). ``fibers``: per
    sparse operand whose last level is segmented, its segments (the fibers a loop over
    that level visits, empty ones included where a level above is dense, none that
    is not stored) where the kernel reads it as stored; ``itemsize``: per operand, the
    bytes of one value as the kernel reads it (``ucf.schedule.short_fibers`` reads both);
    ``gathers``: per matrix read as stored, how far its entries lie from the diagonal
    and over how many columns (``gathers``, read by ``ucf.schedule.far_streams``)."""

    extents: dict[str, int]
    nnz: dict[str, int] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    imbalance: dict[str, tuple[float, ...]] = field(default_factory=dict)
    fibers: dict[str, int] = field(default_factory=dict)
    itemsize: dict[str, int] = field(default_factory=dict)
    gathers: dict[str, tuple[float, float]] = field(default_factory=dict)

    def share(self, tensor: str, threads: int) -> float:
        """The imbalance of ``tensor`` split statically over ``threads`` (1.0 unknown)."""
        shares = self.imbalance.get(tensor, ())
        if threads < 2 or not shares:
            return 1.0
        return shares[min(threads, MAX_SHARES) - 2]

    def key(self, threads: int) -> tuple:
        """The statistics as far as the model looks at them: calls with the same key
        get the same schedule."""
        return (
            threads,
            tuple(sorted(self.extents.items())),
            tuple(sorted((t, max(n, 1).bit_length()) for t, n in self.nnz.items())),
            tuple(sorted((t, skewed(s)) for t, s in self.spread.items())),
            tuple(
                sorted(
                    (t, *(self.share(t, threads) > b for b in (BALANCED, block_rows.SHARE)))
                    for t in self.imbalance
                    if self.share(t, threads) > HEAVY_BALANCED
                )
            ),
            tuple(sorted(self.itemsize.items())),
            tuple(sorted((t, short_fibers.short(self, t)) for t in self.fibers)),
            tuple(sorted((t, *(int(g).bit_length() for g in v)) for t, v in self.gathers.items())),
        )


def skewed(skew: float) -> bool:
    """Whether rows whose longest is ``skew`` times the mean are too uneven for a static
    split, whatever a static split's shares."""
    return skew > SKEWED


def uneven(skew: float, share: float, heavy: bool) -> bool:
    """Whether rows whose longest is ``skew`` times the mean, and whose static split gives
    some thread ``share`` times its share, go in chunks rather than a static split;
    ``heavy``: every row holds a chunk's work."""
    return skewed(skew) or share > (HEAVY_BALANCED if heavy else BALANCED)


# id(pos) -> (a weak reference to pos, (its spread, its imbalance)); the reference tells a
# reused id apart.
_SPREADS: dict[int, tuple[weakref.ref, tuple[float, tuple[float, ...]]]] = {}
# id(crd) -> (a weak reference to crd, where its matrix's entries lie), likewise.
_GATHERS: dict[int, tuple[weakref.ref, tuple[float, float]]] = {}
#: The stored entries sampled for where a matrix's entries lie (``gathers``).
REACH_SAMPLES = 4097


def measure(
    given: dict[str, Tensor],
    extents: dict[str, int],
    formats: Mapping[str, Format],
    dtype: np.dtype,
) -> Stats:
    """Extents per variable, per sparse operand its stored entries, spread, imbalance
    and the segments of its last level, per matrix where its entries lie, and per operand the
    bytes of a value (all read off the arrays' sizes but the spread, imbalance and
    where the entries lie), for a kernel declaring ``formats`` and computing in ``dtype``.

    The segments and entries' places only of an operand the kernel reads as stored (a converted
    copy has other fibers), and a value's bytes as the kernel reads it: a stored value
    type's (``csr@float16``), else the kernel's, to which plain values are cast."""
    sparse = {n: t for n, t in given.items() if not t.format.is_dense}
    filled = {n: segments(t) for n, t in sparse.items()}
    as_stored = {
        n: t
        for n, t in sparse.items()
        if n in formats and formats[n].structure == t.format.structure and "pos" in t.levels[-1]
    }
    lie = {n: gathers(t) for n, t in as_stored.items()}
    return Stats(
        dict(extents),
        {n: int(t.vals.size) for n, t in sparse.items()},
        {n: spread for n, (spread, _) in filled.items()},
        {n: shares for n, (_, shares) in filled.items() if shares},
        {n: t.levels[-1]["pos"].size - 1 for n, t in as_stored.items()},
        {n: t.vals.itemsize if t.format.values else dtype.itemsize for n, t in given.items()},
        {n: g for n, g in lie.items() if g is not None},
    )


def segments(t: Tensor) -> tuple[float, tuple[float, ...]]:
    """How unevenly ``t``'s first segmented level below the top (its rows, for CSR) is
    filled, as (spread, imbalance), kept per ``pos`` array.

    The spread is the longest segment over the mean one: 1.0 for even rows or no such
    level. The imbalance is, for 2, 3, ... ``MAX_SHARES`` threads, the largest share of
    the stored entries (followed down every segmented level below, so a 3-tensor's
    slices weigh their entries, not their fibers) that a static split (equal runs of
    rows, as OpenMP's static schedule deals them out) gives one thread, over the mean
    share; empty without such a level. Rows sorted by length (a triangular factor) or
    heavy rows bunched at one end (R-MAT) leave threads idle even where no row is
    long, which the spread does not see. The spread passes over every row once; the
    imbalance reads ``pos`` at a few thousand places per level."""
    segmented = [lv["pos"] for lv in t.levels[1:] if "pos" in lv]
    if not segmented or segmented[0].size < 2:
        return 1.0, ()
    pos = segmented[0]
    hit = _SPREADS.get(id(pos))
    if hit is not None and hit[0]() is pos:
        return hit[1]
    lengths = np.diff(pos)
    mean = float(lengths.mean())
    value = (float(lengths.max()) / mean if mean > 0 else 1.0), _shares(segmented)
    if len(_SPREADS) > 256:
        _SPREADS.clear()
    _SPREADS[id(pos)] = (weakref.ref(pos), value)
    return value


def _shares(segmented: list[np.ndarray]) -> tuple[float, ...]:
    """The imbalance of ``segments``: ``segmented`` are the ``pos`` arrays from the
    rows' level down. A dense or singleton level between them scales or keeps positions,
    which leaves the shares as they are. Every thread count's cuts are read in one
    gather per level."""
    rows = segmented[0].size - 1
    cuts = np.minimum(_CUTS * -(-rows // _THREADS_OF_CUT), rows)
    for pos in segmented:
        cuts = pos[cuts].astype(np.int64)
    total = int(cuts[-1] - cuts[0])
    if total <= 0:
        return ()
    # The largest share of each thread count: its cuts' differences, within its group.
    largest = np.maximum.reduceat(np.diff(cuts), _GROUPS)[::2]
    return tuple((largest * _SHARE_THREADS / total).tolist())


# The cuts of a static split over 2, 3, ... MAX_SHARES threads, side by side: thread count
# T contributes the multiples 0..T of its step ceil(rows / T).
_SHARE_THREADS = np.arange(2, MAX_SHARES + 1)
_CUTS = np.concatenate([np.arange(t + 1) for t in _SHARE_THREADS])
_THREADS_OF_CUT = np.repeat(_SHARE_THREADS, _SHARE_THREADS + 1)
# Where each thread count's differences start in np.diff(cuts), and where the one
# difference between two groups (across their boundary) starts, to be skipped.
_STARTS = np.concatenate(([0], np.cumsum(_SHARE_THREADS + 1)[:-1]))
_GROUPS = np.ravel(np.column_stack((_STARTS, _STARTS + _SHARE_THREADS)))[:-1]


def gathers(t: Tensor) -> tuple[float, float] | None:
    """Where a matrix's stored entries lie, as (reach, columns), from ``REACH_SAMPLES``
    entries spread evenly over its storage, ``r`` an entry's place in the dense outer
    level (of ``R``) and ``c`` its coordinate in the compressed inner one (of ``C``;
    in columns for CSR, rows for CSC):

    - reach: the median of ``|c - r * C / R|``, how far the entries lie from the
      diagonal (a banded matrix: a few columns; bench/peers.py's uniform one: a
      quarter of them);
    - columns: how many coordinates the entries are spread over, ``1 / sum(p * p)``
      with ``p`` the share of the entries at each coordinate, estimated from the pairs
      of sampled entries at the same one (at most ``C``): all the columns for the
      uniform matrix, about 1 % of them for R-MAT, whose entries crowd into a few.

    A walk of the rows reads the vector gathered at the coordinates near where the
    rows before it did if the reach is short, and from a part small enough to stay in
    the cache if the columns are few; the default's ``streams`` reads both
    (``ucf.schedule.far_streams``). Kept per ``crd`` array; None for a tensor that is
    not one dense level over one compressed level, or stores nothing. It reads ``pos``
    and ``crd`` at ``REACH_SAMPLES`` places."""
    levels = t.levels
    if len(levels) != 2 or levels[0] or set(levels[1]) != {"pos", "crd"}:
        return None
    pos, crd = levels[1]["pos"], levels[1]["crd"]
    hit = _GATHERS.get(id(crd))
    if hit is not None and hit[0]() is crd:
        return hit[1]
    stored = int(pos[-1]) if pos.size else 0
    if stored <= 0:
        return None
    outer, inner = (t.shape[m] for m in t.format.mode_order)
    at = np.linspace(0, stored - 1, min(REACH_SAMPLES, stored)).astype(np.int64)
    rows = np.searchsorted(pos, at, side="right") - 1
    coords = crd[at].astype(np.int64)
    reach = float(np.median(np.abs(coords - rows * (inner / max(outer, 1)))))
    _, counts = np.unique(coords, return_counts=True)
    same = float(np.sum(counts * (counts - 1)))
    columns = min(at.size * (at.size - 1) / same, float(inner)) if same else float(inner)
    if len(_GATHERS) > 256:
        _GATHERS.clear()
    _GATHERS[id(crd)] = (weakref.ref(crd), (reach, columns))
    return reach, columns
