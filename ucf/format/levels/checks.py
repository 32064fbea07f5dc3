"""Vectorized checks of user-supplied level arrays, shared by the level kinds.

Kernels never bounds-check, so every array a user hands in is checked here
first; each failure names the level and the offending position.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import FormatError


def first_true(mask: np.ndarray) -> int | None:
    """Index of the first True, without materializing all of them."""
    if mask.size == 0:
        return None
    i = int(np.argmax(mask))
    return i if mask[i] else None


def index_array(where: str, name: str, arr: Any, idt: np.dtype) -> None:
    if arr is None:
        raise FormatError(f"{where}: missing array '{name}'")
    if not isinstance(arr, np.ndarray):
        raise FormatError(
            f"{where}: array '{name}' must be a numpy array, got {type(arr).__name__}"
        )
    if arr.ndim != 1:
        raise FormatError(f"{where}: array '{name}' must be 1-D, got shape {arr.shape}")
    if arr.dtype != idt:
        raise FormatError(
            f"{where}: array '{name}' has dtype {arr.dtype} but the tensor's index dtype is {idt}"
        )
    if not arr.flags.c_contiguous:
        raise FormatError(f"{where}: array '{name}' is not C-contiguous")


def positions(where: str, pos: np.ndarray, parent_count: int) -> int:
    """Check a pos array against its parent's position count; returns the child count."""
    if len(pos) != parent_count + 1:
        raise FormatError(
            f"{where}: pos has length {len(pos)}, expected parent position count + 1 = "
            f"{parent_count + 1}"
        )
    if pos[0] != 0:
        raise FormatError(f"{where}: pos[0] is {int(pos[0])}, expected 0")
    p = first_true(pos[1:] < pos[:-1])
    if p is not None:
        raise FormatError(
            f"{where}: pos decreases at parent position {p} "
            f"(pos[{p}] = {int(pos[p])} > pos[{p + 1}] = {int(pos[p + 1])})"
        )
    return int(pos[-1])


def in_range(where: str, crd: np.ndarray, dim: int, what: str = "crd") -> None:
    """Refuse a coordinate outside ``[0, dim)``. Integers are read once, as unsigned
    (a negative one is then above any dimension): one pass over memory instead of a
    pass each for the least and the largest, which a call that checks a user's
    arrays every time (``ucf.exec.scipy_operands``) pays."""
    if crd.size == 0:
        return
    if crd.dtype.kind in "iu":
        if int(crd.view(crd.dtype.str.replace("i", "u")).max()) < dim:
            return
    elif int(crd.min()) >= 0 and int(crd.max()) < dim:
        return
    q = first_true((crd < 0) | (crd >= dim))
    assert q is not None
    raise FormatError(f"{where}: {what} {int(crd[q])} at position {q} is out of range [0, {dim})")


def same_segment(pos: np.ndarray, n: int) -> np.ndarray:
    """For each neighbouring pair (q-1, q) of n children: do they share a parent?

    Only sortedness *within* a segment is required, so every check of
    neighbouring coordinates is masked with this.
    """
    start = np.zeros(n, dtype=bool)
    starts = pos[:-1]
    start[starts[starts < n]] = True
    return ~start[1:]


def increasing(pos: np.ndarray, crd: np.ndarray) -> bool:
    """Whether ``crd`` strictly increases within every segment of ``pos`` (sorted and
    unique: scipy's canonical format), for ``crd`` cut to ``pos[-1]`` and a ``pos``
    that starts at 0 and never decreases. Neighbours are compared once, and the
    places where a segment starts cleared: cheaper than masking every pair with
    ``same_segment``, and than scipy's own check of the same (a scalar loop)."""
    n = len(crd)
    if n < 2:
        return True
    # bad[q]: crd[q] does not exceed crd[q - 1]; bad[0] and bad[n] stand outside crd,
    # where pos[0] and pos[-1] clear them.
    bad = np.zeros(n + 1, dtype=bool)
    np.less_equal(crd[1:], crd[:-1], out=bad[1:n])
    bad[pos.astype(np.intp)] = False  # an index of numpy's own width: 3x faster
    return not bad.any()


def repeat(pos: np.ndarray, crd: np.ndarray, dim: int) -> tuple[int, int] | None:
    """The positions of the first coordinate found twice in one segment of a compressed
    level in any order (``pos`` bounds, ``crd`` below ``dim``), or None."""
    n = int(pos[-1]) if len(pos) else 0
    if n < 2:
        return None
    parent = np.repeat(np.arange(len(pos) - 1, dtype=np.int64), np.diff(pos))
    key = parent * dim + crd[:n].astype(np.int64)
    order = np.argsort(key, kind="stable")
    q = first_true(key[order[1:]] == key[order[:-1]])
    return None if q is None else (int(order[q]), int(order[q + 1]))


def parent_of(pos: np.ndarray, q: int) -> int:
    return int(np.searchsorted(pos, q, side="right")) - 1


def fits(where: str, what: str, value: int, idt: np.dtype) -> None:
    """Refuse a size or coordinate the index dtype cannot hold."""
    if value > np.iinfo(idt).max:
        raise FormatError(
            f"{where}: {what} {value} does not fit index dtype {idt}; use index_dtype=np.int64"
        )
