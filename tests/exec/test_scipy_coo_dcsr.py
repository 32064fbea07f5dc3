"""A scipy COO read in place by a COO kernel, and a scipy CSR read as a DCSR
(``ucf.exec.scipy_operands``), and the compiled checks every call runs on a scipy
operand (``ucf.exec.array_checks``). References are scipy's own products and numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from ucf.exec import array_checks, scipy_operands
from ucf.exec.order_free import order_free, tail_free

EXPRS = ["y(i) = A(i,j) * x(j)", "y(j) = A(i,j) * x(i)", "C(i,k) = A(i,j) * B(j,k)"]


def shuffled_coo(seed: int, n: int = 30, m: int = 25, idt=np.int32) -> sp.coo_array:
    """A COO whose rows are sorted, its columns shuffled within each row and one entry
    of each row of two or more repeated: what ``tocoo()`` of an unsorted CSR gives."""
    rng = np.random.default_rng(seed)
    a = sp.random(n, m, density=0.3, format="csr", random_state=rng)
    indices = a.indices.copy()
    for r in range(n):
        lo, hi = a.indptr[r], a.indptr[r + 1]
        if hi - lo >= 2:
            indices[hi - 1] = indices[lo]
        indices[lo:hi] = rng.permutation(indices[lo:hi])
    rows = np.repeat(np.arange(n), np.diff(a.indptr)).astype(idt)
    return sp.coo_array((a.data.copy(), (rows, indices.astype(idt))), shape=(n, m))


def shuffled_csr(seed: int, n: int = 30, m: int = 25, empty: int = 5) -> sp.csr_array:
    """A CSR with ``empty`` empty rows, its rows shuffled and holding repeats."""
    coo = shuffled_coo(seed, n, m)
    keep = coo.row >= empty
    rows, cols, data = coo.row[keep], coo.col[keep], coo.data[keep]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))]).astype(np.int32)
    out = sp.csr_array((data, cols, indptr), shape=(n, m))
    assert empty >= n or not out.has_canonical_format
    return out


def operands(expr: str, a, rng) -> dict:
    n, m = a.shape
    x = rng.random(n if "x(i)" in expr else m)
    return {"A": a, "x": x} if "x(" in expr else {"A": a, "B": rng.random((m, 4))}


def scipy_answer(expr: str, ops: dict) -> np.ndarray:
    a = ops["A"].toarray()  # scipy sums repeated entries
    if expr.startswith("y(i)"):
        return a @ ops["x"]
    if expr.startswith("y(j)"):
        return a.T @ ops["x"]
    return a @ ops["B"]


@pytest.fixture
def no_packing(monkeypatch):
    """Fail a call that packs a scipy operand instead of reading it in place."""

    def refuse(value, name=None, **_):
        raise AssertionError(f"operand {name} was packed")

    monkeypatch.setattr(scipy_operands, "as_tensor", refuse)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("expr", EXPRS)
@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_sorted_coo_is_read_in_place_with_scipy_answer(target, expr, fmt, no_packing):
    """A COO kernel walking A's rows relies on their order and on nothing past it, and
    a CSR one on nothing: a scipy COO with sorted rows, shuffled and repeated columns,
    is read on its own arrays (by the CSR kernel with an indptr found from its rows),
    call after call, and the answer is scipy's."""
    a = shuffled_coo(1)
    ops = operands(expr, a, np.random.default_rng(2))
    k = ucf.compile(expr, formats={"A": fmt}, target=target)
    assert "A" in (tail_free if fmt == "coo" else order_free)(k._plan), k.cin
    for _ in range(3):
        np.testing.assert_allclose(k(**ops).to_numpy(), scipy_answer(expr, ops), rtol=1e-12)


@pytest.mark.parametrize("idt", [np.int32, np.int64])
@pytest.mark.parametrize("shape,nnz", [((30, 25), None), ((6, 4), 0), ((0, 3), 0)])
def test_coo_in_any_order_gives_scipy_answer(idt, shape, nnz):
    """Rows unsorted (packed, as before), sorted, or no entries at all, int32 or int64:
    scipy's answer on a COO kernel and on a CSR one."""
    rng = np.random.default_rng(3)
    if nnz == 0:
        e = np.zeros(0, dtype=idt)
        variants = [sp.coo_array((np.zeros(0), (e, e)), shape=shape)]
    else:
        a = shuffled_coo(4, *shape, idt=idt)
        order = rng.permutation(a.nnz)
        unsorted = sp.coo_array((a.data[order], (a.row[order], a.col[order])), shape=shape)
        variants = [a, unsorted]
    for fmt in ("coo", "csr"):
        k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": fmt})
        for m in variants:
            x = rng.random(shape[1])
            got = k(A=m, x=x).to_numpy()
            np.testing.assert_allclose(got, m.toarray() @ x, rtol=1e-12, atol=1e-12)


def test_coo_kernel_relying_on_column_order_gets_a_packed_operand():
    """Multiplying A by B entry by entry merges A's columns with B's: a shuffled COO is
    packed for it (sorted, repeats summed), and the answer is scipy's."""
    a = shuffled_coo(5)
    b = sp.random(*a.shape, density=0.4, format="csr", random_state=6)
    k = ucf.compile("y(i) = A(i,j) * B(i,j)", formats={"A": "coo", "B": "csr"})
    assert "A" not in tail_free(k._plan), k.cin
    want = (a.toarray() * b.toarray()).sum(axis=1)
    np.testing.assert_allclose(k(A=a, B=b).to_numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("canonical", [True, False])
def test_csr_kernel_relying_on_order_checks_a_coo_read_as_csr(canonical):
    """A CSR kernel merging A's columns with B's takes a canonical COO (sorted rows,
    sorted unique columns) as a CSR on its own arrays and packs a shuffled one: either
    answer is scipy's."""
    a = shuffled_coo(17)
    if canonical:
        a = a.tocsr().tocoo()
    b = sp.random(*a.shape, density=0.4, format="csr", random_state=18)
    k = ucf.compile("y(i) = A(i,j) * B(i,j)", formats={"A": "csr", "B": "csr"})
    assert "A" not in order_free(k._plan), k.cin
    want = (a.toarray() * b.toarray()).sum(axis=1)
    np.testing.assert_allclose(k(A=a, B=b).to_numpy(), want, rtol=1e-12)


def coo_corruptions() -> dict:
    def make(change):
        a = shuffled_coo(7, 8, 6)
        change(a)
        return a

    def set_at(which, q, v):
        return lambda a: getattr(a, which).__setitem__(q, v)

    def shorter(a):
        a.coords = (a.row, a.col[:-1])

    return {
        "row out of range": (make(set_at("row", 3, 8)), "mode 0.*out of range"),
        "negative row": (make(set_at("row", 0, -1)), "mode 0.*out of range"),
        "column out of range": (make(set_at("col", 2, 6)), "mode 1.*out of range"),
        "negative column": (make(set_at("col", 5, -2)), "mode 1.*out of range"),
        "arrays of two lengths": (make(shorter), "columns"),
    }


@pytest.mark.parametrize("case", list(coo_corruptions()))
@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_a_corrupt_coo_is_refused_naming_it(case, fmt):
    m, why = coo_corruptions()[case]
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": fmt})
    with pytest.raises(ucf.FormatError, match=f"operand A.*{why}"):
        k(A=m, x=np.ones(6))


def test_a_coo_changed_in_place_is_checked_again():
    """Replayed calls on one COO still check it: a column made out of range in place is
    refused, and rows made unsorted are packed (scipy's answer)."""
    a = shuffled_coo(8)
    x, y = np.random.default_rng(9).random(a.shape[1]), np.zeros(a.shape[0])
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "coo"})
    for _ in range(20):  # replayed, and the replay's arguments packed
        k(A=a, x=x, out=y)
    np.testing.assert_allclose(y, a.toarray() @ x, rtol=1e-12)
    a.row[[0, -1]] = a.row[[-1, 0]]
    k(A=a, x=x, out=y)
    np.testing.assert_allclose(y, a.toarray() @ x, rtol=1e-12)
    a.col[4] = a.shape[1]
    with pytest.raises(ucf.FormatError, match="operand A.*out of range"):
        k(A=a, x=x, out=y)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("expr", EXPRS)
def test_csr_read_as_dcsr_in_place_with_scipy_answer(target, expr, no_packing):
    """A DCSR kernel walking A's rows is handed a non-canonical scipy CSR as a DCSR on
    its own indices and values (its non-empty rows found from indptr), and the
    answer is scipy's."""
    a = shuffled_csr(10)
    ops = operands(expr, a, np.random.default_rng(11))
    k = ucf.compile(expr, formats={"A": "dcsr"}, target=target)
    assert "A" in tail_free(k._plan), k.cin
    np.testing.assert_allclose(k(**ops).to_numpy(), scipy_answer(expr, ops), rtol=1e-12)


@pytest.mark.parametrize("canonical", [True, False])
def test_dcsr_kernel_relying_on_column_order(canonical):
    """A DCSR kernel merging A's columns with B's takes a canonical CSR as a DCSR view
    and packs a shuffled one; either answer is scipy's."""
    a = shuffled_csr(12)
    if canonical:
        a = a.copy()
        a.sum_duplicates()
    b = sp.random(*a.shape, density=0.4, format="csr", random_state=13)
    k = ucf.compile("y(i) = A(i,j) * B(i,j)", formats={"A": "dcsr", "B": "csr"})
    assert "A" not in tail_free(k._plan), k.cin
    want = (a.toarray() * b.toarray()).sum(axis=1)
    np.testing.assert_allclose(k(A=a, B=b).to_numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("empty", [0, 30])
def test_dcsr_view_of_empty_rows(empty):
    """No empty row, or every row empty: the view's rows are exactly the CSR's
    non-empty ones."""
    a = shuffled_csr(14, empty=empty)
    t = scipy_operands.hypersparse(scipy_operands.in_place(a, "A"))
    np.testing.assert_array_equal(t.levels[0]["crd"], np.flatnonzero(np.diff(a.indptr)))
    x = np.random.default_rng(15).random(a.shape[1])
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "dcsr"})
    np.testing.assert_allclose(k(A=a, x=x).to_numpy(), a.toarray() @ x, rtol=1e-12)


def _indptr(draw, major: int, bad: bool) -> list[int]:
    counts = draw(st.lists(st.integers(0, 3), min_size=major, max_size=major))
    pos = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
    if bad and major:
        q = draw(st.integers(0, major))
        pos[q] += draw(st.sampled_from([-2, -1, 1, 5]))
    return pos


@settings(max_examples=150)
@given(data=st.data(), wide=st.booleans(), major=st.integers(0, 40), minor=st.integers(0, 7))
def test_compiled_checks_agree_with_numpy(data, wide, major, minor):
    """``compressed``, ``coordinates`` and ``nonempty`` against numpy on random arrays,
    broken ones included (indptr not from 0, decreasing, too long; indices negative or
    out of range; rows unsorted)."""
    idt = np.dtype(np.int64 if wide else np.int32)
    pos = np.array(_indptr(data.draw, major, data.draw(st.booleans())), dtype=idt)
    spare = data.draw(st.integers(-2, 2))
    size = max(0, int(pos[-1]) + spare)
    crd = np.array(data.draw(st.lists(st.integers(-1, minor), min_size=size, max_size=size)), idt)
    crd = crd.reshape(-1)
    cap = len(crd)
    if pos[0] != 0 or (pos[1:] < pos[:-1]).any():
        want = array_checks.BAD_POSITIONS
    elif pos[-1] > cap:
        want = array_checks.BAD_END
    elif ((crd[: pos[-1]] < 0) | (crd[: pos[-1]] >= minor)).any():
        want = array_checks.BAD_INDEX
    else:
        want = array_checks.OK
    code, falls = array_checks.compressed(pos, crd, cap, minor, pos.ctypes.data, crd.ctypes.data)
    assert code == want
    if want == array_checks.OK:
        n = int(pos[-1])  # the falling neighbours counted in the same pass, and the order
        assert falls == int((crd[1:n] <= crd[: max(n - 1, 0)]).sum())
        sorted_ = all((np.diff(crd[a:b]) > 0).all() for a, b in zip(pos[:-1], pos[1:], strict=True))
        at = (pos, pos.ctypes.data, crd.ctypes.data)
        assert array_checks.increasing(*at, falls) == array_checks.increasing(*at) == sorted_
        rows = array_checks.nonempty(pos, pos.ctypes.data)
        np.testing.assert_array_equal(rows, np.flatnonzero(np.diff(pos)))
    row = np.array(data.draw(st.lists(st.integers(-1, 5), max_size=30)), dtype=idt).reshape(-1)
    col = np.array(data.draw(st.lists(st.integers(-1, 5), min_size=len(row), max_size=len(row))))
    col = col.astype(idt).reshape(-1)
    bits = (
        array_checks.ROW_OUT * bool(((row < 0) | (row >= 5)).any())
        | array_checks.COL_OUT * bool(((col < 0) | (col >= 4)).any())
        | array_checks.ROWS_DECREASE * bool((row[1:] < row[:-1]).any())
    )
    got = array_checks.coordinates(row, row.ctypes.data, col.ctypes.data, len(row), 5, 4)
    assert got == bits
    if not bits:
        starts = array_checks.row_starts(row, row.ctypes.data, 5)
        np.testing.assert_array_equal(starts, np.searchsorted(row, np.arange(6)))


def test_coo_errors_say_where():
    """The message names the operand and what is wrong, as for a CSR."""
    a = shuffled_coo(16, 8, 6)
    a.col[0] = 99
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "coo"})
    with pytest.raises(ucf.FormatError, match=re.escape("operand A: scipy coo input (mode 1)")):
        k(A=a, x=np.ones(6))


GUARDED = r'''
import ctypes, mmap, numpy as np
from ucf.exec import array_checks as ac

libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PAGE = mmap.PAGESIZE
kept = []

def at_end(values, dtype):
    """``values`` in an array whose last byte ends a page followed by an unreadable one."""
    buf = mmap.mmap(-1, 2 * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(base + PAGE, PAGE, 0) == 0
    values = np.asarray(values, dtype=dtype)
    arr = np.frombuffer(buf, dtype=dtype, count=len(values), offset=PAGE - values.nbytes)
    arr[:] = values
    kept.append(buf)
    return arr

for dt in (np.int32, np.int64):
    crd = at_end([0, 1, 2], dt)
    for pos in ([0, 2, 9], [0, 2, 3], [0, 3, 1], [1, 2, 3], [0, -5, 3]):
        p = at_end(pos, dt)
        ac.compressed(p, crd, len(crd), 3, p.ctypes.data, crd.ctypes.data)
    for pos in ([0, 2, 3], [0, 0, 3], [0, 3, 3]):  # the order, at segment starts only
        p = at_end(pos, dt)
        assert ac.increasing(p, p.ctypes.data, crd.ctypes.data, 0)
    p = at_end([0] * 40 + [1, 2, 2, 3], dt)
    rows = ac.nonempty(p, p.ctypes.data)
    assert rows.tolist() == [39, 40, 42], rows
    row, col = at_end([0, 1, 1, 7], dt), at_end([3, 0, -1, 2], dt)
    assert ac.coordinates(row, row.ctypes.data, col.ctypes.data, 4, 5, 4) == ac.ROW_OUT | ac.COL_OUT
    row = at_end([0, 0, 2, 4], dt)
    assert ac.row_starts(row, row.ctypes.data, 6).tolist() == [0, 2, 2, 3, 3, 4, 4]
print("read in bounds")
'''


def test_compiled_checks_read_only_their_arrays(tmp_path):
    """The compiled checks run outside ASan's sight (JIT code), so each array is put
    against an unreadable page: a read past any of them, whatever indptr says, faults
    the child process."""
    import subprocess
    import sys

    script = tmp_path / "guarded.py"
    script.write_text(GUARDED)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "read in bounds" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("case", ["column out of range", "indptr decreases", "indices too short"])
def test_a_corrupt_csr_read_as_dcsr_is_refused_naming_it(case):
    """The DCSR view is built only from a CSR whose bounds were checked: a corrupt one
    is refused first, naming the operand."""
    from tests.exec.test_scipy_operands import corruptions

    m = sp.random(6, 5, density=0.5, format="csr", random_state=0)
    indptr, indices, why = corruptions(m)[case]
    bad = m.copy()
    bad.indptr, bad.indices = indptr, indices
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "dcsr"})
    with pytest.raises(ucf.FormatError, match=f"operand A.*{re.escape(why)}"):
        k(A=bad, x=np.ones(5))
