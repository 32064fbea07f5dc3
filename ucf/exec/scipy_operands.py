"""scipy matrices passed to a kernel call: checked on every call, for what the kernel
relies on, and read in place.

A scipy CSR, CSC or COO matrix is how most users hand ucf a sparse operand, and
nothing stops its arrays changing between two calls (``A.indices[3] = 7`` in place).
So a call checks it every time, and checks only what the kernel relies on:

- always, what keeps every read in memory: ``indptr`` starts at 0, never decreases
  and ends within ``indices`` and ``data``, and every index it covers is below the
  other dimension; a COO's rows and columns below their dimensions. One compiled
  pass over each array (``ucf.exec.array_checks``), reading indices as unsigned;
- only where the kernel relies on it, that each row's indices are sorted and unique
  (:func:`canonical`). A kernel that walks a row's entries, loads at their
  columns and adds what it computes (SpMV, ``A^T x``, SpMM, ``x' A y``, a Gustavson
  product's left operand) gives scipy's answer in any order, repeats summed as
  scipy sums them: ``ucf.exec.order_free`` reads that off the kernel's code. A matrix
  a kernel needs canonical and that is not is repacked (sorted, repeats summed) for
  the call, as ``ucf.from_scipy`` does.

Two more layouts are read without packing where the kernel allows it
(``ucf.exec.order_free.tail_free``): a COO whose rows are sorted, read by a COO
kernel that relies on the rows' order only (its columns in any order, repeats
summed: scipy's ``tocoo()`` of a CSR is such a COO); and a CSR read by a DCSR kernel,
whose rows are then the CSR's non-empty ones, found from ``indptr`` in one pass, and
whose columns are the CSR's own ``indices`` (in any order where the kernel allows it,
else checked). A COO with sorted rows read by a CSR kernel is handed over as a CSR
on its own columns and values, its ``indptr`` found from the rows in one pass. A COO
whose rows are not sorted is packed through scipy's CSR on every call.

scipy's own ``has_sorted_indices`` and ``has_canonical_format`` are neither read nor
set: they are flags cached on the object, which an in-place change leaves stale, and
the check of :func:`canonical` (a vectorized compare of neighbours) costs less
than scipy's scalar loop computing them. Nothing is cached between calls: a call
that repeats with the very same matrix (``ucf.exec.replay``) runs the same checks.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ucf.errors import FormatError
from ucf.exec import array_checks
from ucf.exec.binding import address
from ucf.format.construction import trusted
from ucf.format.format import CSC, CSR, DCSR, Format
from ucf.format.interop import as_tensor
from ucf.format.levels import checks
from ucf.format.scipy_layouts import COO_ROWS, is_scipy
from ucf.format.tensor import Tensor
from ucf.format.values import INDEX_DTYPES, VALUE_DTYPES

#: The structure of a scipy COO bound in place (a CSR may also be bound as a DCSR).
COO = COO_ROWS.structure
#: What the checks read per call, looked up once.
_INDEX_MAX = {dt: int(np.iinfo(dt).max) for dt in INDEX_DTYPES}


def bind(value: Any, name: str, falls: dict[str, int] | None = None) -> Tensor | None:
    """A scipy CSR, CSC or COO operand as a Tensor on its own arrays, its bounds
    checked and its order not (see :func:`settle`); None for anything else, and for a
    COO whose rows are not sorted, which ``as_tensor`` packs. For a CSR or CSC,
    ``falls[name]`` is set to the count of falling neighbours among its indices, found
    by the same pass as their bounds: :func:`settle` takes it for their order."""
    if not is_scipy(value):
        return None
    kind = value.format
    if kind == "csr" or kind == "csc":
        return in_place(value, f"operand {name}", falls, name)
    if kind == "coo":
        return _coordinates(value, f"operand {name}")
    return None


def in_place(
    m: Any, where: str, falls: dict[str, int] | None = None, name: str = ""
) -> Tensor | None:
    """A scipy CSR or CSC matrix as a CSR or CSC Tensor on its own three arrays, checked
    for what keeps a kernel's reads in bounds and nothing more (:func:`_checked`). None
    where ``from_scipy`` would convert: another layout, index arrays of two dtypes,
    values of a dtype ucf does not hold. ``where`` names the matrix in errors; the
    count of its falling neighbours goes to ``falls[name]`` when ``falls`` is given."""
    found = _checked(m, where)
    if found is None:
        return None
    indptr, indices, data, count = found
    if falls is not None:
        falls[name] = count
    levels = [{}, {"pos": indptr, "crd": indices}]
    fmt = CSR if m.format == "csr" else CSC
    return trusted((int(m.shape[0]), int(m.shape[1])), fmt, levels, data, indptr.dtype)


def _plain(first: Any, second: Any, data: Any) -> bool:
    """Whether two index arrays and a value array are as a kernel reads them in place:
    numpy arrays, one-dimensional and contiguous, the indices of one dtype a kernel
    takes and the values of one it computes in; else the call packs the matrix. Every
    call runs it, so it is written out rather than looped."""
    return (
        type(first) is np.ndarray
        and type(second) is np.ndarray
        and type(data) is np.ndarray
        and first.dtype in _INDEX_MAX
        and second.dtype == first.dtype
        and data.dtype in VALUE_DTYPES
        and first.ndim == second.ndim == data.ndim == 1
        and first.flags.c_contiguous
        and second.flags.c_contiguous
        and data.flags.c_contiguous
    )


def _checked(m: Any, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """A CSR or CSC matrix's ``indptr``, and its indices and values cut to ``indptr[-1]``,
    once ``indptr`` is found to start at 0, never decrease and end within ``indices``
    and ``data``, and every index it covers below the other dimension, with the count
    of neighbouring indices that fall (for ``array_checks.increasing``); None as for
    :func:`in_place`. A call on the same matrix runs this every time, so it is one
    compiled pass over each array (``array_checks.compressed``), and the messages of
    ``checks`` only where one fails."""
    kind = m.format
    if kind != "csr" and kind != "csc":
        return None
    indptr, indices, data = m.indptr, m.indices, m.data
    idt = indptr.dtype
    if not (_plain(indptr, indices, data) and len(m.shape) == 2):
        return None
    rows, cols = m.shape
    major, minor = (rows, cols) if kind == "csr" else (cols, rows)
    if minor - 1 > _INDEX_MAX[idt]:
        return None  # from_scipy says why
    whole = f"{where}: scipy {kind} input"
    if len(indptr) != major + 1:
        checks.positions(f"{whole} (indptr)", indptr, major)  # raises, saying so
    cap = min(len(indices), len(data))
    found, falls = array_checks.compressed(
        indptr, indices, cap, minor, address(indptr), address(indices)
    )
    if found == array_checks.BAD_POSITIONS:
        checks.positions(f"{whole} (indptr)", indptr, major)
    nnz = int(indptr[-1])
    if found == array_checks.BAD_END:
        raise FormatError(
            f"{whole}: indptr[-1] = {nnz} but indices has {len(indices)} and data "
            f"{len(data)} entries"
        )
    if len(indices) > nnz:
        indices = indices[:nnz]
    if len(data) > nnz:
        data = data[:nnz]
    if found == array_checks.BAD_INDEX:
        checks.in_range(whole, indices, minor, what="index")
    if found != array_checks.OK:  # the matrix changed while it was checked
        raise FormatError(f"{whole}: its arrays changed while they were checked")
    return indptr, indices, data, falls


def _coordinates(m: Any, where: str) -> Tensor | None:
    """A scipy COO matrix as a COO Tensor on its own ``row``, ``col`` and ``data``, once
    every row and column is found below its dimension; None where its rows are not
    sorted (the Tensor's format says they are: ``as_tensor`` packs it) or its arrays
    are not as a kernel reads them (dtypes, layout). The columns' order is not checked:
    :func:`settle` does where the kernel relies on it."""
    if len(m.shape) != 2:
        return None
    row, col, data = m.row, m.col, m.data
    idt = row.dtype
    if not _plain(row, col, data):
        return None
    rows, cols = int(m.shape[0]), int(m.shape[1])
    n = len(data)
    if len(row) != n or len(col) != n:
        raise FormatError(
            f"{where}: scipy coo input has {len(row)} rows, {len(col)} columns and {n} values"
        )
    if max(rows, cols, n) - 1 > _INDEX_MAX[idt]:
        return None  # from_scipy widens or says why
    bits = array_checks.coordinates(row, address(row), address(col), n, rows, cols)
    if bits & array_checks.ROW_OUT:
        checks.in_range(f"{where}: scipy coo input (mode 0)", row, rows, what="index")
    if bits & array_checks.COL_OUT:
        checks.in_range(f"{where}: scipy coo input (mode 1)", col, cols, what="index")
    if bits & (array_checks.ROW_OUT | array_checks.COL_OUT):  # changed while checked
        raise FormatError(f"{where}: scipy coo input changed while it was checked")
    if bits & array_checks.ROWS_DECREASE:
        return None
    levels = [{"pos": starts(row), "crd": row}, {"crd": col}]
    return trusted((rows, cols), COO_ROWS, levels, data, idt)


def starts(row: np.ndarray) -> np.ndarray:
    """The positions of a COO's one segment, ``[0, len(row)]``, kept for as long as
    ``row`` lives: a replayed call (``ucf.exec.replay``) reads them by address, and
    vouches for them through ``row`` (whose length cannot change: numpy refuses to
    resize an array with a weak reference)."""
    key = id(row)
    hit = _STARTS.get(key)
    if hit is not None and hit[0]() is row:
        return hit[1]
    pos = np.array([0, len(row)], dtype=row.dtype)
    pos.flags.writeable = False
    _STARTS[key] = (weakref.ref(row, lambda _, key=key: _STARTS.pop(key, None)), pos)
    return pos


#: ``starts`` by the id of the rows they belong to.
_STARTS: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def arrays(m: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three arrays a scipy CSR or CSC (``indptr``, ``indices``, ``data``) or COO
    (``row``, ``col``, ``data``) holds, which a call bound in place reads."""
    if m.format == "coo":
        return m.row, m.col, m.data
    return m.indptr, m.indices, m.data


def canonical(t: Tensor, falls: int | None = None) -> bool:
    """Whether a CSR or CSC Tensor from :func:`in_place` has its indices sorted and
    unique within each row (column, for CSC), as its format says. ``falls`` is the
    count of falling neighbours the bounds check of this call found in its indices
    (:func:`bind`), which spares reading them again."""
    level = t.levels[1]
    return _increasing(level["pos"], level["crd"], falls)


def _increasing(pos: np.ndarray, crd: np.ndarray, falls: int | None = None) -> bool:
    """``checks.increasing`` in one compiled pass (``array_checks.increasing``) on the
    arrays a scipy matrix read in place holds (``_plain``, checked by ``compressed``);
    with ``falls`` (see :func:`canonical`), a pass over the segment starts only."""
    compiled = (
        type(pos) is np.ndarray
        and type(crd) is np.ndarray
        and pos.dtype in _INDEX_MAX
        and crd.dtype == pos.dtype
        and pos.ndim == crd.ndim == 1
        and pos.flags.c_contiguous
        and crd.flags.c_contiguous
    )
    if not compiled:
        return checks.increasing(pos, crd)
    return array_checks.increasing(pos, address(pos), address(crd), falls)


def settle(
    given: dict[str, Tensor],
    operands: dict[str, Any],
    bound: list[str],
    falls: Mapping[str, int],
    free: Mapping[str, Format],
    tail: Mapping[str, Format],
    reads: Mapping[str, Format],
) -> frozenset[str]:
    """Check the order of each operand of ``bound`` (bound in place by :func:`bind`)
    unless the kernel reads it correctly in any order, in the structure it comes in
    (``free``: ``ucf.exec.order_free``; a CSC read as CSR is converted first, and a
    conversion may rely on the order), and repack one that is not canonical, as
    ``ucf.from_scipy`` would. A COO (its rows sorted) stays as it is where the kernel
    reads it so and relies on no order past its rows (``tail``: ``tail_free``); a CSR
    the kernel reads as DCSR (``reads``) is handed over as one on its own arrays, and
    a COO it reads as CSR as one on its own columns and values. ``falls`` holds what
    :func:`bind` counted for each CSR and CSC (see :func:`canonical`).
    The operands left unchecked are returned: a replay of the call leaves them so."""
    unchecked = []
    for name in bound:
        t = given[name]
        structure = t.format.structure
        if free.get(name) == structure:
            unchecked.append(name)
        elif structure == COO:
            if tail.get(name) == COO:
                continue
            if reads.get(name) == CSR:
                t = compressed_rows(t)
                if free.get(name) == CSR or canonical(t):
                    given[name] = t
                    continue
            given[name] = as_tensor(operands[name], name=name)
        elif structure == CSR and reads.get(name) == DCSR:
            if tail.get(name) == DCSR or canonical(t, falls.get(name)):
                given[name] = hypersparse(t)
            else:
                given[name] = as_tensor(operands[name], name=name)
        elif not canonical(t, falls.get(name)):
            given[name] = as_tensor(operands[name], name=name)
    return frozenset(unchecked)


def compressed_rows(t: Tensor) -> Tensor:
    """A COO Tensor from :func:`bind` (its rows sorted) as a CSR on the same columns and
    values: its ``indptr`` found from the rows in one pass (``array_checks.row_starts``)."""
    row = t.levels[0]["crd"]
    indptr = array_checks.row_starts(row, address(row), t.shape[0])
    levels = [{}, {"pos": indptr, "crd": t.levels[1]["crd"]}]
    return trusted(t.shape, CSR, levels, t.vals, t.index_dtype)


def hypersparse(t: Tensor) -> Tensor:
    """A CSR Tensor from :func:`in_place` as a DCSR on the same indices and values: its
    rows the non-empty ones (``array_checks.nonempty``: one pass over ``indptr``,
    skipping runs of empty rows), each starting where the CSR's does."""
    indptr = t.levels[1]["pos"]
    rows = array_checks.nonempty(indptr, address(indptr))
    starts = np.empty(len(rows) + 1, dtype=indptr.dtype)
    np.take(indptr, rows, out=starts[:-1])
    starts[-1] = indptr[-1]
    levels = [
        {"pos": np.array([0, len(rows)], dtype=indptr.dtype), "crd": rows},
        {"pos": starts, "crd": t.levels[1]["crd"]},
    ]
    return trusted(t.shape, DCSR, levels, t.vals, t.index_dtype)


def recheck(value: Any, name: str, ordered: bool) -> bool:
    """A replayed call's checks of a scipy operand it bound in place: its bounds (an
    error if they fail, as on the first call), and its order where the kernel relies
    on it (``ordered``; a COO's rows always); False when the call must take the whole
    path (an order that the first call found canonical is not now: it is repacked
    there)."""
    if value.format == "coo":
        return _coordinates(value, f"operand {name}") is not None
    found = _checked(value, f"operand {name}")
    if found is None:
        raise FormatError(f"operand {name}: its arrays changed kind since the last call")
    return not ordered or _increasing(found[0], found[1], found[3])
