"""scipy.sparse in and out: CSR, CSC and BSR on their own buffers where the format
matches, everything else through coordinates."""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import FormatError, OperandError, boundary
from ucf.format import convert
from ucf.format.construction import from_numpy, pack, plain_values
from ucf.format.format import CSC, CSR, Format, parse_format
from ucf.format.levels import checks
from ucf.format.storage import as_shape, foreign_type, zero_filled
from ucf.format.tensor import BUILDERS, Tensor, held
from ucf.format.values import INDEX_DTYPES, index_dtype_of

#: A CSR whose rows may be unsorted: scipy's own products leave them so.
_UNSORTED_CSR = parse_format("UQ")


COO_ROWS = parse_format("coo", order=2)


def _bcsr_blocks(fmt: Format) -> tuple[int, int] | None:
    """The block shape of a ``bcsr(bh, bw)`` format, which scipy's BSR stores alike."""
    if len(fmt.maps) != 4 or not (fmt.maps[2].mod and fmt.maps[3].mod):
        return None
    block = (fmt.maps[2].mod, fmt.maps[3].mod)
    return block if fmt.structure == parse_format("bcsr({}, {})".format(*block)) else None


def _scipy_index_dtype(*arrays: np.ndarray) -> np.dtype:
    dts = {a.dtype for a in arrays}
    if len(dts) == 1 and next(iter(dts)) in INDEX_DTYPES:
        return next(iter(dts))
    return np.dtype(np.int64) if any(d.itemsize > 4 for d in dts) else np.dtype(np.int32)


@boundary
def from_scipy(m: Any, format: Any = None, dtype: Any = None, index_dtype: Any = None) -> Tensor:
    """Pack a scipy.sparse matrix or array, sharing its buffers when it is already canonical.

    CSR (CSC) input packed as CSR (CSC) with matching dtypes keeps
    ``indptr``/``indices``/``data`` as the tensor's own arrays.  Anything
    else is repacked on fresh arrays (in linear time through scipy's compressed
    layouts where the target is one of ``ucf.format.convert.scipy_target``'s: a kernel
    call packs so a COO operand whose rows are not sorted); the input is never modified.
    Repeated entries are summed and stored zeros kept.  The index dtype defaults to
    that of the input, and the format to
    CSC for a CSC matrix, CSR for any other matrix, COO beyond two dimensions.
    """
    import scipy.sparse as sp

    if not sp.issparse(m):
        raise OperandError(f"expected a scipy.sparse matrix or array, got {foreign_type(m)}")
    shape = as_shape(m.shape)
    if format is None and m.format == "bsr":
        format = "bcsr({}, {})".format(*m.blocksize)
    if format is None:
        format = ("csc" if m.format == "csc" else "csr") if len(shape) == 2 else "coo"
    fmt = parse_format(format, order=len(shape))
    if not plain_values(fmt, dtype):  # bfloat16, int4, quantized: from the numbers
        return held(from_scipy(m, fmt.structure, None, index_dtype), fmt)
    if fmt.fill:  # scipy's absent entries are zeros, which this format stores
        idt = np.int32 if index_dtype is None else index_dtype
        return from_numpy(m.toarray(), fmt, dtype, idt)
    dt = fmt.stored_dtype(dtype, m.dtype)
    kind = m.format
    if kind == "bsr" and fmt.structure == parse_format("bcsr({}, {})".format(*m.blocksize)):
        shared = _shared_bsr(m, fmt, dt, index_dtype)
        if shared is not None:
            return shared
    if kind in ("csr", "csc") and len(shape) == 2:
        where = f"scipy {kind} input"
        if not (isinstance(m.indptr, np.ndarray) and m.indptr.ndim == 1):
            raise FormatError(f"{where}: indptr is not a 1-D array")
        return from_compressed(
            where, kind, shape, m.indptr, m.indices, m.data, fmt, dt, index_dtype
        )
    try:
        c = m.tocoo()
    except (ValueError, IndexError, TypeError) as e:
        raise FormatError(f"scipy {kind} input cannot be read: {e}") from None
    for mode, d in enumerate(shape):
        where = f"scipy {kind} input (mode {mode})"
        checks.in_range(where, np.asarray(c.coords[mode]), d, what="index")
    if convert.scipy_target(fmt, shape, c.nnz, dt) is not None:
        # in bounds now, so scipy may compress it: rows sorted and repeats summed in
        # linear time (a kernel call packs so a COO operand whose rows are not sorted)
        return from_scipy(c.tocsr(), fmt, dtype, index_dtype_of(index_dtype))
    coords = np.stack([np.asarray(x, dtype=np.int64) for x in c.coords], axis=1)
    coords = coords.reshape(-1, len(shape))
    vals = np.asarray(c.data).astype(dt)
    return pack(shape, fmt, fmt.level_coords(coords), vals, index_dtype_of(index_dtype))


def _segments(
    where: str,
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    major: int,
    minor: int,
    index_dtype: Any,
    what: str,
) -> tuple[np.ndarray, np.ndarray, np.dtype, bool]:
    """Check scipy-style compressed arrays (``major`` segments of ``what`` below
    ``minor``): the indices and data cut to ``indptr[-1]``, the index dtype (the input's
    unless one is asked for), and whether every segment is strictly sorted."""
    nnz = checks.positions(f"{where} (indptr)", indptr, major)
    if len(indices) < nnz or len(data) < nnz:
        raise FormatError(
            f"{where}: indptr[-1] = {nnz} but indices has {len(indices)} and data "
            f"{len(data)} entries"
        )
    indices, data = indices[:nnz], data[:nnz]
    checks.in_range(where, indices, minor, what=what)
    idt = (
        _scipy_index_dtype(indptr, indices) if index_dtype is None else index_dtype_of(index_dtype)
    )
    return indices, data, idt, checks.increasing(indptr, indices)


def from_compressed(
    where: str,
    kind: str,
    shape: tuple[int, int],
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    fmt: Format,
    dt: np.dtype,
    index_dtype: Any,
) -> Tensor:
    """Pack a matrix given as ``kind`` ('csr' or 'csc') arrays, as scipy and torch hold it.

    Canonical input (indices sorted and unique within each row or column) packed in
    its own format with matching dtypes keeps the three arrays as the tensor's, and
    so does CSR input packed as ``UQ`` whatever the order in its rows (their
    uniqueness is checked); anything else is repacked from coordinates on fresh
    arrays. The index dtype defaults to that of the input. ``where`` names the
    input in errors.
    """
    major, minor = (shape[0], shape[1]) if kind == "csr" else (shape[1], shape[0])
    if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
        raise FormatError(f"{where}: indptr/indices must be integer arrays")
    indices, data, idt, canonical = _segments(
        where, indptr, indices, data, major, minor, index_dtype, "index"
    )
    nnz = len(indices)
    unsorted = kind == "csr" and fmt.structure == _UNSORTED_CSR
    if unsorted and not canonical and checks.repeat(indptr, indices, minor) is not None:
        unsorted = False  # repacked, which sums the repeats as scipy does
    if unsorted or (canonical and fmt.structure == (CSR if kind == "csr" else CSC)):
        if nnz > np.iinfo(idt).max or minor - 1 > np.iinfo(idt).max:
            raise FormatError(f"{where}: does not fit index dtype {idt}; use np.int64")
        levels = [
            {},
            {
                "pos": np.ascontiguousarray(indptr, dtype=idt),
                "crd": np.ascontiguousarray(indices, dtype=idt),
            },
        ]
        vals = np.ascontiguousarray(data, dtype=dt)
        return Tensor(shape, fmt, levels, vals, idt, check=False)
    by_columns = convert.scipy_target(fmt, shape, nnz, dt, kind == "csc")
    if by_columns is not None:  # scipy sorts and sums in linear time; stored zeros stay
        import scipy.sparse as sp

        cls = sp.csr_array if kind == "csr" else sp.csc_array
        m = cls((data.astype(dt, copy=False), indices, indptr), shape=shape)
        if canonical:
            m.has_canonical_format = True
        else:
            m = m.copy()
            m.sum_duplicates()
        levels, vals = convert.scipy_levels(m.tocsc() if by_columns else m.tocsr(), fmt, idt)

        def fresh(a: np.ndarray) -> np.ndarray:  # another format never shares the input's
            return a.copy() if any(np.may_share_memory(a, b) for b in given) else a

        given = (indptr, indices, data)
        levels = [{k: fresh(a) for k, a in lv.items()} for lv in levels]
        return Tensor(shape, fmt, levels, fresh(vals), idt, check=False)
    majors = np.repeat(np.arange(major, dtype=np.int64), np.diff(indptr))
    mins = indices.astype(np.int64)
    coords = np.stack([majors, mins] if kind == "csr" else [mins, majors], axis=1)
    return pack(shape, fmt, fmt.level_coords(coords), data.astype(dt), idt)


def _shared_bsr(m: Any, fmt: Format, dt: np.dtype, index_dtype: Any) -> Tensor | None:
    """A canonical scipy BSR matrix as a ``bcsr`` tensor on its own buffers: its
    ``indptr`` and ``indices`` are the block level's pos and crd, and ``data`` (blocks
    of bh x bw, row-major) is the values; None when it is not canonical."""
    where = "scipy bsr input"
    bh, bw = m.blocksize
    rows, cols = m.shape[0] // bh, m.shape[1] // bw
    indptr = m.indptr
    indices, data, idt, canonical = _segments(
        where, indptr, m.indices, m.data, rows, cols, index_dtype, "block index"
    )
    if not canonical:
        return None
    levels = [
        {},
        {
            "pos": np.ascontiguousarray(indptr, dtype=idt),
            "crd": np.ascontiguousarray(indices, dtype=idt),
        },
        {},
        {},
    ]
    vals = np.ascontiguousarray(data, dtype=dt).reshape(-1)
    return Tensor(as_shape(m.shape), fmt, levels, vals, idt, check=False)


# --------------------------------------------------------------------------- as_tensor


def to_scipy(t: Tensor, matrix: bool = False) -> Any:
    """A scipy sparse array (``matrix=True``: matrix) sharing buffers where scipy allows.

    CSR and CSC tensors map onto scipy's own layout directly, and so does ``UQ``
    (a CSR whose rows are unsorted, as scipy's own products leave them); ``bcsr``
    maps onto BSR when its blocks divide the shape; scipy may still copy int64
    indices it narrows.
    """
    zero_filled(t.format, "scipy")
    import scipy.sparse as sp

    if t.order != 2:
        raise FormatError(
            f"only order-2 tensors convert to scipy.sparse; this tensor has order {t.order}"
        )
    fmt = t.format.structure
    csr = sp.csr_matrix if matrix else sp.csr_array
    csc = sp.csc_matrix if matrix else sp.csc_array
    if fmt in (CSR, CSC, _UNSORTED_CSR):
        build = csc if fmt == CSC else csr
        lv = t.levels[1]
        out = build((t.vals, lv["crd"], lv["pos"]), shape=t.shape, copy=False)
        if fmt == _UNSORTED_CSR:
            out.has_sorted_indices = False  # scipy would otherwise assume what it checked
        return out
    block = _bcsr_blocks(fmt)
    if block is not None and all(n % b == 0 for n, b in zip(t.shape, block, strict=True)):
        bsr = sp.bsr_matrix if matrix else sp.bsr_array
        lv = t.levels[1]
        data = t.vals.reshape(-1, *block)
        return bsr((data, lv["crd"], lv["pos"]), shape=t.shape, blocksize=block, copy=False)
    coo = sp.coo_matrix if matrix else sp.coo_array
    if fmt == COO_ROWS:  # its levels hold every entry's row and column already
        rows, cols = t.levels[0]["crd"], t.levels[1]["crd"]
        return coo((t.vals, (rows, cols)), shape=t.shape).tocsr()
    coords, vals = t.to_coo()
    return coo((vals, (coords[:, 0], coords[:, 1])), shape=t.shape).tocsr()


def has_scipy_layout(t: Tensor) -> bool:
    """Whether scipy stores ``t`` alike (CSR, CSC, unsorted CSR, or BSR with whole
    blocks), so :func:`to_scipy` hands scipy the tensor's own arrays."""
    if t.order != 2:
        return False
    fmt = t.format.structure
    if fmt in (CSR, CSC, _UNSORTED_CSR):
        return True
    block = _bcsr_blocks(fmt)
    return block is not None and all(n % b == 0 for n, b in zip(t.shape, block, strict=True))


def is_scipy(obj: Any) -> bool:
    """Whether ``obj`` is a scipy.sparse matrix or array (without importing scipy for
    objects from elsewhere). Asked of every operand of every kernel call, so the
    answer is kept per type."""
    kind = type(obj)
    found = _SCIPY_TYPES.get(kind)
    if found is None:
        found = False
        if (kind.__module__ or "").startswith("scipy"):
            import scipy.sparse as sp

            found = bool(sp.issparse(obj))
        if len(_SCIPY_TYPES) < 256:
            _SCIPY_TYPES[kind] = found
    return found


#: ``is_scipy`` by type.
_SCIPY_TYPES: dict[type, bool] = {}


BUILDERS["from_scipy"] = from_scipy
BUILDERS["to_scipy"] = to_scipy
