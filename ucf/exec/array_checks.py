"""Compiled passes over a scipy operand's index arrays: the checks every kernel call
runs on a matrix it reads in place (``ucf.exec.scipy_operands``).

A call on a scipy matrix checks on every call what keeps the kernel's reads in
memory, since nothing stops the matrix changing in place between calls. In numpy
that is a pass over ``indptr`` comparing neighbours into a temporary and another
reducing it, then a pass over the indices for their largest; in a solver's loop
on a 20,000-row SpMV those passes cost a tenth of the call. Here each check is one
compiled function the optimizer vectorizes, reading each array once and writing
nothing, called through ctypes. The functions only read; what a failed check means
is said by the numpy checks of ``ucf.format.levels.checks``, run only then.

The IR is written with the pieces of ``ucf.exec.array_pass_ir``. The module is
compiled once per machine and kept in the disk cache like a kernel
(``ucf.toolchain.jit.runtime_module``).
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

from ucf.exec.array_pass_ir import (
    count_falls,
    counted_loop,
    each_segment,
    loaded,
    narrowed,
    segment_bounds,
    widened,
)

#: What ``compressed`` returns: the arrays are fine, ``indptr`` does not start at 0 or
#: decreases, it ends beyond the indices or values, an index is out of range.
OK, BAD_POSITIONS, BAD_END, BAD_INDEX = range(4)
#: The bits ``coordinates`` returns: a row out of range, a column out of range, rows
#: that decrease somewhere.
ROW_OUT, COL_OUT, ROWS_DECREASE = 1, 2, 4

_TYPES = {np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}


def _compressed_ir(t: str) -> str:
    """``ucf_compressed_<t>(pos, major, crd, cap, minor)``: ``pos`` (``major + 1``
    entries) starts at 0, never decreases and ends at most at ``cap``, and every index
    ``crd[:pos[major]]`` read as unsigned is below ``minor``; ``OK`` or what fails."""
    decreases = f"""  %lt = icmp slt {t} %b, %a
  %lt8 = zext i1 %lt to i8
  %down1 = or i8 %down, %lt8
"""
    rows = each_segment(
        t, "rows", "0", (("down", "i8", "0", "%down1"),), decreases, "rows_end", "last"
    )
    return (
        f"""
define i64 @ucf_compressed_{t}({t}* noalias nocapture readonly %pos, i64 %major,
                               {t}* noalias nocapture readonly %crd, i64 %cap, i64 %minor) {{
entry:
  %p0 = load {t}, {t}* %pos
  %nonzero = icmp ne {t} %p0, 0
  br i1 %nonzero, label %bad_positions, label %rows
rows:
{rows}rows_end:
  %decreased = icmp ne i8 %down1, 0
  br i1 %decreased, label %bad_positions, label %last
last:
  %end.at = getelementptr inbounds {t}, {t}* %pos, i64 %major
  %end = load {t}, {t}* %end.at
"""
        + widened(t, "%end", "nnz").format(ext="sext")
        + f"""  %beyond = icmp sgt i64 %nnz, %cap
  br i1 %beyond, label %bad_end, label %indices
indices:
  %some = icmp sgt i64 %nnz, 0
  br i1 %some, label %first, label %ok
first:
  %c0 = load {t}, {t}* %crd
"""
        + counted_loop(
            "index",
            "first",
            "q",
            ("1", "%nnz"),
            (("m", t, "%c0", "%m1"), ("f", "i64", "0", "%f1")),
            loaded(t, "crd", "%q", "c")
            + f"""  %gt = icmp ugt {t} %c, %m
  %m1 = select i1 %gt, {t} %c, {t} %m
"""
            + count_falls(t, "f"),
            "indices_end",
            "indices_end",
        )
        + f"""indices_end:
  %largest.t = phi {t} [%c0, %first], [%m1, %index]
  %falls = phi i64 [0, %first], [%f1, %index]
"""
        + widened(t, "%largest.t", "largest").format(ext="zext")
        + f"""  %out = icmp uge i64 %largest, %minor
  br i1 %out, label %bad_index, label %sound
sound:
  %counted = shl i64 %falls, 2
  %code = or i64 %counted, {OK}
  ret i64 %code
ok:
  ret i64 {OK}
bad_positions:
  ret i64 {BAD_POSITIONS}
bad_end:
  ret i64 {BAD_END}
bad_index:
  ret i64 {BAD_INDEX}
}}
"""
    )


def _coordinates_ir(t: str) -> str:
    """``ucf_coordinates_<t>(row, col, n, rows, cols)``: the bits of ``ROW_OUT``,
    ``COL_OUT`` and ``ROWS_DECREASE`` that hold of ``n`` (row, column) pairs, each read
    as unsigned against its dimension; 0 when none does."""
    return (
        f"""
define i64 @ucf_coordinates_{t}({t}* noalias nocapture readonly %row,
                                {t}* noalias nocapture readonly %col, i64 %n, i64 %rows,
                                i64 %cols) {{
entry:
  %some = icmp sgt i64 %n, 0
  br i1 %some, label %first, label %none
none:
  ret i64 0
first:
  %r0 = load {t}, {t}* %row
  br label %pair
"""
        + counted_loop(
            "pair",
            "first",
            "q",
            ("0", "%n"),
            (
                ("prev", t, "%r0", "%r"),
                ("mr", t, "0", "%mr1"),
                ("mc", t, "0", "%mc1"),
                ("down", "i8", "0", "%down1"),
            ),
            loaded(t, "row", "%q", "r")
            + loaded(t, "col", "%q", "c")
            + f"""  %rgt = icmp ugt {t} %r, %mr
  %mr1 = select i1 %rgt, {t} %r, {t} %mr
  %cgt = icmp ugt {t} %c, %mc
  %mc1 = select i1 %cgt, {t} %c, {t} %mc
  %lt = icmp slt {t} %r, %prev
  %lt8 = zext i1 %lt to i8
  %down1 = or i8 %down, %lt8
""",
            "done",
            None,
        )
        + """done:
"""
        + widened(t, "%mr1", "largest_row").format(ext="zext")
        + widened(t, "%mc1", "largest_col").format(ext="zext")
        + f"""  %row_out = icmp uge i64 %largest_row, %rows
  %col_out = icmp uge i64 %largest_col, %cols
  %decreased = icmp ne i8 %down1, 0
  %b0 = select i1 %row_out, i64 {ROW_OUT}, i64 0
  %b1 = select i1 %col_out, i64 {COL_OUT}, i64 0
  %b2 = select i1 %decreased, i64 {ROWS_DECREASE}, i64 0
  %b01 = or i64 %b0, %b1
  %bits = or i64 %b01, %b2
  ret i64 %bits
}}
"""
    )


def _nonempty_ir(t: str) -> str:
    """``ucf_nonempty_<t>(pos, major, rows)``: writes to ``rows`` the segments of ``pos``
    (``major + 1`` entries, never decreasing) that are not empty, in order, and
    returns how many. A hypersparse matrix's ``indptr`` is mostly runs of one value,
    so it is read in blocks of 16 segments, a block with no change skipped at once;
    the segments of a block with one, and those after the last whole block, are
    looked at one by one (``_segments_ir``)."""
    scan = counted_loop(
        "scan",
        "block",
        "j",
        ("0", "16"),
        (("change", t, "0", "%change1"),),
        "  %kj = add nuw nsw i64 %k, %j\n"
        + segment_bounds(t, "%kj", "kj1", "a", "b")
        + f"""  %d = xor {t} %a, %b
  %change1 = or {t} %change, %d
""",
        "scanned",
        None,
        "ult",
    )
    return f"""
define i64 @ucf_nonempty_{t}({t}* noalias nocapture readonly %pos, i64 %major,
                             {t}* noalias nocapture %rows) {{
entry:
  br label %block
block:
  %k = phi i64 [0, %entry], [%k16, %scanned], [%k16, %each.next]
  %n = phi i64 [0, %entry], [%n, %scanned], [%each.m1, %each.next]
  %k16 = add nuw nsw i64 %k, 16
  %whole = icmp sle i64 %k16, %major
  br i1 %whole, label %scan, label %tail
{scan}scanned:
  %none = icmp eq {t} %change1, 0
  br i1 %none, label %block, label %each
{_segments_ir(t, "each", "scanned", "%k16", "block")}
tail:
  %more_tail = icmp slt i64 %k, %major
  br i1 %more_tail, label %last, label %done
{_segments_ir(t, "last", "tail", "%major", "done")}
done:
  %count = phi i64 [%n, %tail], [%last.m1, %last.next]
  ret i64 %count
}}
"""


def _segments_ir(t: str, loop: str, entry: str, end: str, done: str) -> str:
    """The blocks of a loop ``loop`` of ``ucf_nonempty``, entered from block ``entry``:
    each segment ``%k`` up to ``end`` (exclusive) of ``pos`` that is not empty is
    written to ``rows`` at ``%n`` on; it goes on to ``done`` with the count so far in
    ``%<loop>.m1``."""
    bounds = segment_bounds(t, f"%{loop}.e", f"{loop}.e1", f"{loop}.x", f"{loop}.y")
    return f"""{loop}:
  %{loop}.e = phi i64 [%k, %{entry}], [%{loop}.e1, %{loop}.next]
  %{loop}.m = phi i64 [%n, %{entry}], [%{loop}.m1, %{loop}.next]
{bounds}  %{loop}.full = icmp ne {t} %{loop}.x, %{loop}.y
  br i1 %{loop}.full, label %{loop}.keep, label %{loop}.next
{loop}.keep:
  %{loop}.at = getelementptr inbounds {t}, {t}* %rows, i64 %{loop}.m
{narrowed(t, f"%{loop}.e", f"{loop}.et")}  store {t} %{loop}.et, {t}* %{loop}.at
  %{loop}.mk = add nuw nsw i64 %{loop}.m, 1
  br label %{loop}.next
{loop}.next:
  %{loop}.m1 = phi i64 [%{loop}.m, %{loop}], [%{loop}.mk, %{loop}.keep]
  %{loop}.more = icmp ult i64 %{loop}.e1, {end}
  br i1 %{loop}.more, label %{loop}, label %{done}"""


def _row_starts_ir(t: str) -> str:
    """``ucf_row_starts_<t>(row, n, rows, out)``: the ``indptr`` (``rows + 1`` entries, to
    ``out``) of ``n`` coordinates whose rows (``row``, below ``rows``) are sorted: each
    row's first position (entries written from the last, so the first stays), then
    an empty row given the start of the next, from the end: no branch per entry."""
    n_t = narrowed(t, "%n", "n_t")
    q_t = narrowed(t, "%q", "q_t")
    r64 = widened(t, "%r", "r64").format(ext="sext")
    return f"""
define void @ucf_row_starts_{t}({t}* noalias nocapture readonly %row, i64 %n, i64 %rows,
                                {t}* noalias nocapture %out) {{
entry:
{n_t}  br label %fill
fill:
  %f = phi i64 [0, %entry], [%f1, %fill]
  %f.at = getelementptr inbounds {t}, {t}* %out, i64 %f
  store {t} %n_t, {t}* %f.at
  %f1 = add nuw nsw i64 %f, 1
  %fill_more = icmp sle i64 %f1, %rows
  br i1 %fill_more, label %fill, label %scatter_check
scatter_check:
  %some = icmp sgt i64 %n, 0
  br i1 %some, label %scatter, label %suffix_check
scatter:
  %p = phi i64 [%n, %scatter_check], [%q, %scatter]
  %q = add nsw i64 %p, -1
  %r.at = getelementptr inbounds {t}, {t}* %row, i64 %q
  %r = load {t}, {t}* %r.at
{r64}{q_t}  %w.at = getelementptr inbounds {t}, {t}* %out, i64 %r64
  store {t} %q_t, {t}* %w.at
  %scatter_more = icmp sgt i64 %q, 0
  br i1 %scatter_more, label %scatter, label %suffix_check
suffix_check:
  %any_rows = icmp sgt i64 %rows, 0
  br i1 %any_rows, label %suffix, label %done
suffix:
  %s = phi i64 [%rows, %suffix_check], [%s0, %suffix]
  %next = phi {t} [%n_t, %suffix_check], [%low, %suffix]
  %s0 = add nsw i64 %s, -1
  %s.at = getelementptr inbounds {t}, {t}* %out, i64 %s0
  %here = load {t}, {t}* %s.at
  %less = icmp slt {t} %here, %next
  %low = select i1 %less, {t} %here, {t} %next
  store {t} %low, {t}* %s.at
  %suffix_more = icmp sgt i64 %s0, 0
  br i1 %suffix_more, label %suffix, label %done
done:
  ret void
}}
"""


def _increasing_ir(t: str) -> str:
    """``ucf_increasing_<t>(pos, major, crd)``: 1 when ``crd`` strictly increases within
    every segment of ``pos`` (checked by ``compressed``: it starts at 0, never decreases
    and ends within ``crd``), else 0. The neighbours of the whole array that fall are
    counted (one pass over ``crd`` with no branch: it vectorizes), then those at the
    segment starts (``ucf_start_falls``): the order holds when they are the same."""
    return (
        f"""
define i64 @ucf_increasing_{t}({t}* noalias nocapture readonly %pos, i64 %major,
                               {t}* noalias nocapture readonly %crd) {{
entry:
  %end.at = getelementptr inbounds {t}, {t}* %pos, i64 %major
  %end = load {t}, {t}* %end.at
"""
        + widened(t, "%end", "n").format(ext="sext")
        + counted_loop(
            "pairs",
            "entry",
            "q",
            ("1", "%n"),
            (("falls", "i64", "0", "%falls1"),),
            loaded(t, "crd", "%q", "c") + count_falls(t, "falls"),
            "compare",
            "yes",
        )
        + f"""compare:
  %expected = call i64 @ucf_start_falls_{t}({t}* %pos, i64 %major, {t}* %crd)
  %same = icmp eq i64 %falls1, %expected
  %r = zext i1 %same to i64
  ret i64 %r
yes:
  ret i64 1
}}
"""
    )


def _start_falls_ir(t: str) -> str:
    """``ucf_start_falls_<t>(pos, major, crd)``: how many segments of ``pos`` (checked
    by ``compressed``) start with an index at most the one before it, the last of an
    earlier segment. One pass over ``pos`` whose reads are always in bounds (an index
    that is no segment's start reads the pair at 1); with the count of all the
    neighbours in ``crd`` that fall (``compressed`` finds it), it says whether
    every segment strictly increases."""
    starts_falling = (
        f"""  %filled = icmp slt {t} %a, %b
  %inside = icmp sgt {t} %a, 0
  %start = and i1 %filled, %inside
"""
        + widened(t, "%a", "a64").format(ext="sext")
        + "  %at = select i1 %start, i64 %a64, i64 1\n"
        + loaded(t, "crd", "%at", "x")
        + "  %atm = add nsw i64 %at, -1\n"
        + loaded(t, "crd", "%atm", "w")
        + f"""  %drop = icmp sle {t} %x, %w
  %counted = and i1 %start, %drop
  %c64 = zext i1 %counted to i64
  %found1 = add i64 %found, %c64
"""
    )
    rows = each_segment(
        t, "entry", "1", (("found", "i64", "0", "%found1"),), starts_falling, "done", "none"
    )
    return f"""
define i64 @ucf_start_falls_{t}({t}* noalias nocapture readonly %pos, i64 %major,
                                {t}* noalias nocapture readonly %crd) {{
entry:
{rows}done:
  ret i64 %found1
none:
  ret i64 0
}}
"""


def _module_ir() -> str:
    return "".join(
        _compressed_ir(t)
        + _coordinates_ir(t)
        + _nonempty_ir(t)
        + _row_starts_ir(t)
        + _increasing_ir(t)
        + _start_falls_ir(t)
        for t in _TYPES.values()
    )


_SIGNATURE = ctypes.CFUNCTYPE(
    ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64
)
_PAIRS = ctypes.CFUNCTYPE(
    ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64
)


_NONEMPTY = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)


_STARTS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)


@cache
def _functions() -> tuple[object, dict, dict, dict, dict, dict, dict]:
    """The compiled module (held: its functions live as long as it does) and its
    functions by index dtype."""
    from ucf.toolchain.jit import runtime_module

    library = runtime_module("ucf_array_checks", _module_ir)

    def each(kind: Any, name: str) -> dict:
        return {dt: kind(library.address(f"ucf_{name}_{t}")) for dt, t in _TYPES.items()}

    return (
        library,
        each(_SIGNATURE, "compressed"),
        each(_PAIRS, "coordinates"),
        each(_NONEMPTY, "nonempty"),
        each(_STARTS, "row_starts"),
        each(_NONEMPTY, "increasing"),
        each(_NONEMPTY, "start_falls"),
    )


def compressed(
    indptr: np.ndarray, indices: np.ndarray, cap: int, minor: int, pos_at: int, crd_at: int
) -> tuple[int, int]:
    """``OK`` if ``indptr`` (1-D, contiguous, of ``indices``' dtype, int32 or int64,
    at address ``pos_at``) starts at 0, never decreases and ends at most at ``cap``, and
    the indices it covers (at ``crd_at``) are below ``minor``; else what fails first.
    With ``OK``, how many neighbours among those indices fall (are at most the one
    before), counted in the same pass: :func:`increasing` takes it, so a call that
    checks the order too reads the indices once."""
    got = _functions()[1][indptr.dtype](pos_at, len(indptr) - 1, crd_at, cap, minor)
    return got & 3, got >> 2


def coordinates(row: np.ndarray, row_at: int, col_at: int, n: int, rows: int, cols: int) -> int:
    """The bits (``ROW_OUT``, ``COL_OUT``, ``ROWS_DECREASE``) that hold of the first
    ``n`` entries of two index arrays of ``row``'s dtype (int32 or int64) at
    ``row_at`` and ``col_at``; 0 when the pairs are in range and the rows sorted."""
    return _functions()[2][row.dtype](row_at, col_at, n, rows, cols)


def nonempty(indptr: np.ndarray, pos_at: int) -> np.ndarray:
    """The segments of ``indptr`` (int32 or int64, contiguous, at address ``pos_at``,
    starting at 0 and never decreasing: checked by ``compressed``) that hold an entry,
    in order, in ``indptr``'s dtype."""
    major = len(indptr) - 1
    rows = np.empty(min(major, int(indptr[-1])), dtype=indptr.dtype)
    if len(rows):
        rows = rows[: _functions()[3][indptr.dtype](pos_at, major, rows.ctypes.data)]
    return rows


def row_starts(row: np.ndarray, row_at: int, rows: int) -> np.ndarray:
    """The ``indptr`` of a COO's entries, for ``row`` (int32 or int64, contiguous, at
    address ``row_at``) sorted and below ``rows``: checked by ``coordinates``."""
    out = np.empty(rows + 1, dtype=row.dtype)
    _functions()[4][row.dtype](row_at, len(row), rows, out.ctypes.data)
    return out


def increasing(indptr: np.ndarray, pos_at: int, crd_at: int, falls: int | None = None) -> bool:
    """Whether the indices (at ``crd_at``) strictly increase within every segment of
    ``indptr`` (int32 or int64, contiguous, at ``pos_at``, as the indices are; checked
    by ``compressed``): sorted and unique, scipy's canonical format. ``falls``, the
    count ``compressed`` gave for these very arrays in this call, spares the pass over
    the indices: only the segment starts are read."""
    major = len(indptr) - 1
    if falls is None:
        return bool(_functions()[5][indptr.dtype](pos_at, major, crd_at))
    return falls == _functions()[6][indptr.dtype](pos_at, major, crd_at)
