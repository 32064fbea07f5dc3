"""Converting a sparse tensor to another format in time linear in its entries.

A tensor's stored entries come out of its levels already sorted (and unique) in its
own level order, so a conversion need not sort them as if they came in any order,
as packing user coordinates must (``storage.sort_sum``). The target's level
coordinates are computed from the mode coordinates, and then only the levels the
source order does not already sort are sorted: least significant first, each by a
stable counting sort (scipy's CSR-to-CSC transpose, the same linear pass scipy's
own ``tocsc`` makes). CSR to COO or DCSR sorts nothing; CSR to CSC or DCSC sorts
one level; blocked targets sort at most two keys, the levels below a block's row
merged into one.

Kernels that read an operand in another format than it is stored in convert it on
every call (the ConversionWarning of ``ucf.exec``), so this is on their hot path.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ucf.format.format import Format, parse_format
from ucf.format.levels import checks
from ucf.format.storage import describe_level, pack_levels

if TYPE_CHECKING:
    import scipy.sparse as sp

#: A tensor (``ucf.format.tensor.Tensor``, the module above this one, which calls it).
Tensor = Any
Levels = list[dict[str, np.ndarray]]


#: The value types scipy's sparse arrays hold (numpy's type characters).
SCIPY_VALUES = frozenset(np.typecodes["AllInteger"] + "?fdgFDG")

#: The matrix formats built straight from scipy's compressed rows or columns, by how
#: the rows or columns of the compressed matrix become their levels.
COMPRESSED_TARGETS = {
    parse_format(name, order=2): name for name in ("csr", "csc", "dcsr", "dcsc", "coo")
}


def relevel(
    t: Tensor, fmt: Format, dt: np.dtype, idt: np.dtype, keep_zeros: bool = False
) -> tuple[Levels, np.ndarray]:
    """The levels and values of ``t`` (plain values, not dense) in format ``fmt`` (plain,
    same fill) with values of ``dt`` and indices of ``idt``; stored fill values are
    dropped unless ``keep_zeros`` (a kernel's output keeps the entries it computed,
    whatever format it is converted to). They may be ``t``'s own arrays where these
    come out unchanged (as scipy's ``tocoo`` shares CSR's)."""
    found = via_scipy(t, fmt, idt, keep_zeros) if t.order == 2 and not fmt.fill else None
    if found is not None:
        levels, vals = found
        return levels, vals.astype(dt, copy=False)
    src = t.format
    cols, count = t.columns()
    vals = t.numbers()
    modes = mode_columns(src, cols, count)
    keep = np.full(vals.shape, True) if keep_zeros else vals != fmt.fill
    if src.blocked:  # the padding of partial blocks lies outside the shape
        for mode, d in enumerate(t.shape):
            keep &= modes[mode] < d
    if not keep.all():
        modes = [c[keep] for c in modes]
        vals = vals[keep]
    lcols = [modes[m.mode] if m.plain else m.coordinate(modes[m.mode]) for m in fmt.maps]
    dims = fmt.level_dims(t.shape)
    perm = lexicographic_order(lcols, dims)
    lc = np.empty((len(vals), len(lcols)), dtype=np.int64, order="F")
    for j, c in enumerate(lcols):
        if perm is None:
            lc[:, j] = c
        else:
            np.take(c, perm, out=lc[:, j])
    vals = vals.astype(dt, copy=True) if perm is None else vals[perm].astype(dt, copy=False)
    return pack_levels(t.shape, fmt, lc, vals, idt, sorted_unique=True)


def via_scipy(
    t: Tensor, fmt: Format, idt: np.dtype, keep_zeros: bool = False
) -> tuple[Levels, np.ndarray] | None:
    """The levels and values of matrix ``t`` in ``fmt`` when scipy converts to it (csr,
    csc, dcsr, dcsc, coo, and blocks bcsr, bcsc); None for other formats, and for values
    scipy's sparse arrays cannot hold (float16). scipy converts between its layouts in
    linear time, and every level of these formats is indptr, indices, or the rows
    (columns) that hold entries; arrays scipy leaves alone (``t``'s own, for CSR to COO)
    are shared."""
    source = {"csr": False, "csc": True}.get(COMPRESSED_TARGETS.get(t.format.structure, ""))
    by_columns = scipy_target(fmt, t.shape, t.nnz, t.vals.dtype, source)
    if by_columns is None:
        return None
    if source is (not by_columns) and COMPRESSED_TARGETS.get(fmt.structure) in ("csr", "csc"):
        found = flipped(t, fmt, idt)
        if found is not None:
            return found
    return scipy_levels(canonical(t, by_columns, keep_zeros), fmt, idt)


def flipped(t: Tensor, fmt: Format, idt: np.dtype) -> tuple[Levels, np.ndarray] | None:
    """CSR ``t`` as CSC ``fmt``, or CSC as CSR: scipy's ``csr_tocsc`` pass (what its
    ``tocsc`` and ``tocsr`` run) called on ``t``'s own arrays, which were checked when
    ``t`` was made. A transposed operand is converted on every call, and at thousands
    of rows the wrappers around that pass (a scipy matrix built and checked, its
    result another) cost as much as the pass. None where the wrappers' path is needed:
    stored zeros to drop, arrays that do not hold exactly the entries from position 0,
    an index dtype the pass does not take, or a scipy without the pass."""
    try:
        from scipy.sparse._sparsetools import csr_tocsc
    except ImportError:  # a scipy that moved it: the wrappers' path
        return None
    pos, crd, vals = t.levels[1]["pos"], t.levels[1]["crd"], t.vals
    if pos.dtype != crd.dtype or pos.dtype not in (np.int32, np.int64) or not vals.all():
        return None
    if pos[0] != 0 or not pos[-1] == crd.size == vals.size:
        return None  # the pass reads pos[-1] entries from position 0 and writes as many
    if not all(a.flags.c_contiguous for a in (pos, crd, vals)):
        return None
    outer, inner = fmt.level_dims(t.shape)
    if np.dtype(idt).itemsize < pos.dtype.itemsize:  # else t's own index dtype holds them
        for lvl, dim in enumerate((outer, inner)):
            checks.fits(describe_level(fmt, lvl), "dimension", dim - 1, idt)
        checks.fits(describe_level(fmt, 1), "position count", vals.size, idt)
    indptr = np.empty(outer + 1, dtype=pos.dtype)
    indices = np.empty(vals.size, dtype=crd.dtype)
    data = np.empty_like(vals)
    csr_tocsc(inner, outer, pos, crd, vals, indptr, indices, data)
    levels = [{}, {"pos": indptr.astype(idt, copy=False), "crd": indices.astype(idt, copy=False)}]
    return levels, data


def scipy_target(
    fmt: Format, shape: tuple[int, ...], nnz: int, dt: np.dtype, source: bool | None = None
) -> bool | None:
    """Whether matrix format ``fmt`` is built from scipy's compressed columns (True) or
    rows (False) by :func:`scipy_levels`; None where it is not (another format, values
    scipy cannot hold, or a hypersparse shape whose compressed layout would cost more
    than the entries, unless the source is compressed the same way already, ``source``
    saying which as the result does: then its own ``indptr`` costs as much)."""
    if np.dtype(dt).char not in SCIPY_VALUES or len(shape) != 2:
        return None
    name = COMPRESSED_TARGETS.get(fmt.structure)
    block = block_shape(fmt)
    if name is None and block is None:
        return None
    by_columns = name in ("csc", "dcsc") or (block is not None and block[2])
    hyper = shape[by_columns] > 4 * nnz + (1 << 16)
    if name in ("coo", "dcsr", "dcsc") and hyper and source is not by_columns:
        return None
    return by_columns


def scipy_levels(
    m: sp.csr_array | sp.csc_array, fmt: Format, idt: np.dtype
) -> tuple[Levels, np.ndarray]:
    """The levels and values of ``fmt`` (a :func:`scipy_target`) from ``m``, scipy's
    canonical compressed rows (columns where the target says): indices sorted, no
    repeats. Stored zeros stay (the caller drops them or not)."""
    dims = fmt.level_dims(m.shape)
    for lvl, kind in enumerate(fmt.levels):
        if kind.arrays:
            checks.fits(describe_level(fmt, lvl), "dimension", dims[lvl] - 1, idt)
    block = block_shape(fmt)
    if block is not None:
        return blocks(m, block, fmt, idt)
    name = COMPRESSED_TARGETS[fmt.structure]
    indptr, nnz = m.indptr, m.nnz
    checks.fits(describe_level(fmt, len(dims) - 1), "position count", nnz, idt)
    crd = m.indices.astype(idt, copy=False)
    if name in ("csr", "csc"):
        return [{}, {"pos": indptr.astype(idt, copy=False), "crd": crd}], m.data
    if name == "coo":
        rows = expanded(indptr).astype(idt, copy=False)
        return [{"pos": np.array([0, nnz], dtype=idt), "crd": rows}, {"crd": crd}], m.data
    held = np.flatnonzero(np.diff(indptr))  # the rows (columns) with entries
    outer = {"pos": np.array([0, len(held)], dtype=idt), "crd": held.astype(idt)}
    pos = np.empty(len(held) + 1, dtype=idt)
    pos[0] = 0
    pos[1:] = indptr[held + 1]
    return [outer, {"pos": pos, "crd": crd}], m.data


def canonical(t: Tensor, by_columns: bool, keep_zeros: bool = False) -> sp.csr_array | sp.csc_array:
    """Matrix ``t`` as scipy's compressed rows (``by_columns``: columns), indices sorted
    and no stored zeros (unless ``keep_zeros``); ``t``'s own arrays when they are that
    already (never written)."""
    m = t.to_scipy()
    if all(kind.ordered for kind in t.format.levels):
        m.has_canonical_format = True  # as validation found it: sorted, no repeats
    m = m.tocsc() if by_columns else m.tocsr()
    if not m.has_sorted_indices:  # an unordered (Q) source's
        m = m.sorted_indices()
    if not keep_zeros and not m.data.all():  # stored zeros dropped; never from t's own
        m = m.copy()
        m.eliminate_zeros()
    return m


def block_shape(fmt: Format) -> tuple[int, int, bool] | None:
    """``(bh, bw, by_columns)`` of a ``bcsr(bh,bw)`` or ``bcsc(bh,bw)`` format, else None."""
    maps = fmt.maps
    if len(maps) != 4 or not (maps[2].mod and maps[3].mod) or maps[2].mode != 0:
        return None
    bh, bw = maps[2].mod, maps[3].mod
    if fmt.structure == Format.blocked_rows(bh, bw):
        return bh, bw, False
    if fmt.structure == Format.blocked_rows(bh, bw, columns=True, places_by_column=False):
        return bh, bw, True
    return None


def blocks(
    m: sp.csr_array | sp.csc_array, block: tuple[int, int, bool], fmt: Format, idt: np.dtype
) -> tuple[Levels, np.ndarray]:
    """The levels and values of ``bcsr(bh,bw)`` from canonical CSR ``m``, or of
    ``bcsc(bh,bw)`` from canonical CSC: the entries of a row (column) of blocks are
    sorted by their block's column (row) in scipy's per-row sort of the block pattern,
    each entry's place in its block is computed, and the values are scattered into
    zeroed blocks (a partial edge block's padding stays zero, as packing pads it)."""
    import scipy.sparse as sp

    bh, bw, by_columns = block
    major, minor = expanded(m.indptr), m.indices  # in m's order, sorted by major
    row, col = (minor, major) if by_columns else (major, minor)
    bmajor, bminor = (bw, bh) if by_columns else (bh, bw)
    outer = -(-m.shape[1 if by_columns else 0] // bmajor)
    inner = -(-m.shape[0 if by_columns else 1] // bminor)
    starts = m.indptr[np.minimum(np.arange(outer + 1) * bmajor, len(m.indptr) - 1)]
    pattern = sp.csr_array(
        (np.arange(len(major), dtype=starts.dtype), minor // bminor, starts), shape=(outer, inner)
    )  # entry numbers fit the dtype of m's positions
    pattern.has_sorted_indices = False
    # within a block row, by block column (not stable: entries of one block may come in
    # any order, and each finds its place in its block from its own row and column)
    pattern.sort_indices()
    perm, bcol, rows_at = pattern.data, pattern.indices, pattern.indptr
    new = np.empty(len(perm), dtype=bool)  # an entry that starts a block
    new[1:] = bcol[1:] != bcol[:-1]
    new[rows_at[:-1][np.diff(rows_at) > 0]] = True  # each row of blocks starts one
    first = np.flatnonzero(new)
    size = bh * bw
    checks.fits(describe_level(fmt, 3), "position count", len(first) * size, idt)
    before = np.zeros(len(perm) + 1, dtype=np.int64)  # blocks started before each entry
    np.cumsum(new, out=before[1:])
    pos = before[rows_at].astype(idt)
    place = row % bh
    place *= bw
    place += col % bw  # each entry's place in its block, in m's order
    slot = before[1:]
    slot -= 1
    slot *= size
    slot += place[perm]
    vals = np.zeros(len(first) * size, dtype=m.dtype)
    vals[slot] = m.data[perm]
    return [{}, {"pos": pos, "crd": bcol[first].astype(idt)}, {}, {}], vals


def expanded(indptr: np.ndarray) -> np.ndarray:
    """Each entry's row of a compressed-row matrix (column of a compressed-column one)."""
    return np.repeat(np.arange(len(indptr) - 1, dtype=indptr.dtype), np.diff(indptr))


def mode_columns(fmt: Format, cols: list[np.ndarray], count: int) -> list[np.ndarray]:
    """Level coordinate columns as one column per mode (the level's own column where a
    level stores a mode whole): the sum of its levels' coordinates times their ``div``."""
    modes: list[np.ndarray | None] = [None] * fmt.order
    for col, m in zip(cols, fmt.maps, strict=True):
        part = col * m.div if m.div != 1 else col
        modes[m.mode] = part if modes[m.mode] is None else modes[m.mode] + part
    return [np.zeros(count, dtype=np.int64) if c is None else c for c in modes]


def lexicographic_order(cols: list[np.ndarray], dims: list[int]) -> np.ndarray | None:
    """The permutation that sorts entries by ``cols`` (one column per level, column
    ``j`` in ``0..dims[j]-1``) lexicographically; None if they are sorted already.

    Least significant levels first, each pass stable; levels the entries are already
    sorted by (a suffix of ``cols``) need no pass, and neighbouring levels whose
    coordinates together span few values share one."""
    n = len(cols[0]) if cols else 0
    if n < 2:
        return None
    k = sorted_suffix(cols, dims)
    bound = max(2 * n, 1 << 16)  # a counting sort's cost is linear in n plus its key range
    perm: np.ndarray | None = None
    while k > 0:
        lo, size = k - 1, dims[k - 1]
        while lo > 0 and size * dims[lo - 1] <= bound:
            lo -= 1
            size *= dims[lo]
        part = cols[lo:k] if perm is None else [c[perm] for c in cols[lo:k]]
        key = linear_key(part, dims[lo:k])
        order = stable_order(key, size, bound)
        perm = order if perm is None else perm[order]
        k = lo
    return perm


def sorted_suffix(cols: list[np.ndarray], dims: list[int]) -> int:
    """The first level ``k`` such that the entries are sorted by levels ``k..`` (their
    coordinates lexicographically non-decreasing), as far as one int64 key holds them:
    0 when they are sorted by all (a target whose levels start as the source's do),
    else the levels the source's order already sorts (CSR's rows, as CSC's last level)."""
    if math.prod(dims) < 2**63 and nondecreasing(linear_key(cols, dims)):
        return 0
    k = len(cols)
    key, span = None, 1
    while k > 1 and span * dims[k - 1] < 2**63:
        col = cols[k - 1]
        key = col if key is None else col * span + key
        if not nondecreasing(key):
            break
        span *= dims[k - 1]
        k -= 1
    return k


def linear_key(cols: list[np.ndarray], dims: list[int]) -> np.ndarray:
    """One int64 per entry ordered as its coordinates are lexicographically."""
    key = cols[0].astype(np.int64, copy=True)
    for col, d in zip(cols[1:], dims[1:], strict=True):
        key *= d
        key += col
    return key


def nondecreasing(key: np.ndarray) -> bool:
    return not bool(np.any(key[1:] < key[:-1]))


def stable_order(key: np.ndarray, size: int, bound: int) -> np.ndarray:
    """The stable sorting permutation of ``key`` (values in ``0..size-1``): a counting
    sort, scipy's transpose of the one-row matrix whose entry ``e`` lies in column
    ``key[e]`` and holds ``e``; a general stable sort where the range is too wide."""
    import scipy.sparse as sp

    n = len(key)
    if size > bound or max(n, size) >= 2**31:
        return np.argsort(key, kind="stable")
    idx = np.int32
    row = sp.csr_array(
        (np.arange(n, dtype=idx), key.astype(idx), np.array([0, n], dtype=idx)),
        shape=(1, size),
    )
    return row.tocsc().data.astype(np.int64)
