"""scipy matrices as kernel operands (``ucf.exec.scipy_operands``): read in place, their
bounds checked on every call, their order only where the kernel relies on it
(``ucf.exec.order_free``). References are scipy's own products."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import TARGETS
from ucf.exec.order_free import order_free
from ucf.format.levels.checks import increasing


def unsorted(seed: int, n: int = 30, m: int = 25, repeats: bool = True) -> sp.csr_array:
    """A CSR whose rows are shuffled, and (``repeats``) hold some column twice: valid
    scipy (``A @ x`` sums the repeats), in bounds, not canonical."""
    rng = np.random.default_rng(seed)
    a = sp.random(n, m, density=0.3, format="csr", random_state=rng)
    indptr, indices, data = a.indptr.copy(), a.indices.copy(), a.data.copy()
    for r in range(n):
        lo, hi = indptr[r], indptr[r + 1]
        if repeats and hi - lo >= 2:
            indices[hi - 1] = indices[lo]  # the row's first column again
        indices[lo:hi] = rng.permutation(indices[lo:hi])
    out = sp.csr_array((data, indices, indptr), shape=(n, m))
    assert not out.has_canonical_format
    return out


def reference(m: sp.csr_array) -> np.ndarray:
    return m.toarray()  # scipy sums repeated entries


FREE = ["y(i) = A(i,j) * x(j)", "y(j) = A(i,j) * x(i)", "s = A(i,j) * x(i) * z(j)"]
FREE += ["C(i,k) = A(i,j) * B(j,k)"]


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("repeats", [False, True])
@pytest.mark.parametrize("expr", FREE)
def test_unsorted_scipy_operand_is_read_in_place_with_scipy_answer(target, repeats, expr):
    """SpMV, A^T x, x'Az and SpMM only walk A's rows: an unsorted scipy CSR (with
    repeated columns) is read as it is, and the answer is scipy's own."""
    m = unsorted(3, repeats=repeats)
    rng = np.random.default_rng(4)
    x, z, b = rng.random(m.shape[0]), rng.random(m.shape[1]), rng.random((m.shape[1], 5))
    x_in = {"y(i) = A(i,j) * x(j)": rng.random(m.shape[1])}.get(expr, x)
    k = ucf.compile(expr, formats={"A": "csr"}, target=target)
    ops = {"A": m, "x": x_in, "z": z, "B": b}
    ops = {n: v for n, v in ops.items() if f"{n}(" in expr}
    got = k(**ops)
    assert "A" in order_free(k._plan), k.cin
    want = {
        "y(i) = A(i,j) * x(j)": lambda: m @ x_in,
        "y(j) = A(i,j) * x(i)": lambda: m.T @ x,
        "s = A(i,j) * x(i) * z(j)": lambda: x @ (m @ z),
        "C(i,k) = A(i,j) * B(j,k)": lambda: m @ b,
    }[expr]()
    np.testing.assert_allclose(np.asarray(got.to_numpy()), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "expr,formats,schedule",
    [
        ("y(i) = A(i,j) * x(j)", {}, "split(j,j0,j1,4)"),
        ("y(i) = A(i,j) * x(j)", {}, "pos(j,jp,A); split(jp,j0,j1,2)"),
        ("y(i) = A(i,j) * x(j)", {}, "precompute(A(i,j)*x(j), j, j, w)"),
        ("y(j) = A(i,j) * x(i)", {}, "parallelize(i, CPUThread, Atomics)"),
        ("C(i,k) = A(i,j) * B(j,k)", {"B": "csr", "C": "csr"}, None),  # Gustavson's left
    ],
)
def test_scheduled_kernels_read_an_unsorted_operand_in_place(threads, expr, formats, schedule):
    """Splits, position splits, a workspace, atomics and a sparse product's left
    operand all leave A's order free, on one thread and two; the answer is scipy's."""
    m = unsorted(11, n=60, m=50)
    rng = np.random.default_rng(12)
    b = sp.random(50, 40, density=0.2, format="csr", random_state=rng)
    x = rng.random(60 if expr.startswith("y(j)") else 50)
    ucf.set_num_threads(threads)
    k = ucf.compile(expr, formats={"A": "csr", **formats}, schedule=schedule)
    ops = {"A": m, "x": x} if "x(" in expr else {"A": m, "B": b}
    got = k(**ops)
    assert "A" in order_free(k._plan), k.cin
    want = {"y(i)": lambda: m @ x, "y(j)": lambda: m.T @ x, "C(i,": lambda: (m @ b).toarray()}
    np.testing.assert_allclose(got.to_numpy(), want[expr[:4]](), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "expr,formats",
    [
        ("y(i) = A(i,j) * B(i,j)", {"B": "csr"}),  # a merge with B's columns
        ("C(i,j) = A(i,j) + B(i,j)", {"B": "csr", "C": "csr"}),  # a union into CSR
        ("C(i,j) = A(i,j) * D(i,j)", {}),  # assigned (not added) where A's columns say
        ("y(i) = A(i,j) * A(i,j) * x(j)", {}),  # not linear in A: repeats must be summed first
        ("y(i) = max(j, A(i,j) * x(j))", {}),
    ],
)
def test_a_kernel_relying_on_order_gets_a_canonical_operand(expr, formats):
    """A kernel whose code compares or stores A's columns, or is not linear in A,
    never reads an unsorted scipy CSR as it is: the call repacks it (sorted, repeats
    summed, as ucf.from_scipy does) and the answer is scipy's."""
    m = unsorted(5)
    n, c = m.shape
    rng = np.random.default_rng(6)
    b = sp.random(n, c, density=0.3, format="csr", random_state=rng)
    d, x = rng.random((n, c)), rng.random(c)
    k = ucf.compile(expr, formats={"A": "csr", **formats})
    ops = {n_: v for n_, v in {"A": m, "B": b, "D": d, "x": x}.items() if f"{n_}(" in expr}
    got = k(**ops)
    assert "A" not in order_free(k._plan), k.cin
    a = reference(m)
    want = {
        "y(i) = A(i,j) * B(i,j)": (a * b.toarray()).sum(axis=1),
        "C(i,j) = A(i,j) + B(i,j)": a + b.toarray(),
        "C(i,j) = A(i,j) * D(i,j)": a * d,
        "y(i) = A(i,j) * A(i,j) * x(j)": (a * a) @ x,
        "y(i) = max(j, A(i,j) * x(j))": np.max(a * x, axis=1),  # absent entries read 0
    }[expr]
    np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-12, atol=1e-12)
    if expr.startswith("C(i,j) = A(i,j) + B"):
        got.validate()  # the output's rows are sorted and unique


def corruptions(m: sp.csr_array) -> dict[str, tuple]:
    """(indptr, indices) of ``m`` broken one way each, with what the error says."""
    n, c = m.shape
    p, i = m.indptr, m.indices

    def with_index(q, v):
        out = i.copy()
        out[q] = v
        return p, out

    def with_pointer(q, v):
        out = p.copy()
        out[q] = v
        return out, i

    return {
        "column out of range": (*with_index(2, c), "out of range"),
        "negative column": (*with_index(1, -1), "out of range"),
        "indptr decreases": (*with_pointer(3, p[4] + 1), "decreases"),
        "indptr does not start at 0": (*with_pointer(0, 1), "pos[0]"),
        "indices too short": (p, i[: len(i) - 2], "indptr[-1]"),
        "indptr too short": (p[:-1], i, "length"),
    }


CASES = list(corruptions(sp.random(6, 5, density=0.5, format="csr", random_state=0)))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("expr", ["y(i) = A(i,j) * x(j)", "y(i) = A(i,j) * B(i,j)"])
def test_a_corrupt_scipy_operand_is_refused_naming_it(case, expr):
    """Whatever the kernel relies on, what would make it read out of bounds is refused
    before it runs, with a FormatError naming the operand."""
    m = sp.random(6, 5, density=0.5, format="csr", random_state=0)
    indptr, indices, why = corruptions(m)[case]
    bad = m.copy()
    bad.indptr, bad.indices = indptr, indices  # past scipy's constructor's own checks
    k = ucf.compile(expr, formats={"A": "csr", **({"B": "csr"} if "B" in expr else {})})
    ops = {"A": bad, "x": np.ones(5), "B": m}
    with pytest.raises(ucf.FormatError, match=f"operand A.*{re.escape(why)}"):
        k(**{n: v for n, v in ops.items() if f"{n}(" in expr})


@pytest.mark.parametrize("expr", ["y(i) = A(i,j) * x(j)", "y(j) = A(i,j) * x(i)"])
def test_a_scipy_matrix_changed_in_place_is_checked_again(expr):
    """A call repeated on the same matrix object replays, and still checks it: an index
    made out of range in place is refused (no out-of-bounds read), and one made
    unsorted is still read right."""
    m = sp.random(40, 40, density=0.2, format="csr", random_state=1)
    x, y = np.random.default_rng(2).random(40), np.zeros(40)
    k = ucf.compile(expr, formats={"A": "csr"})
    want = (lambda a: a @ x) if expr.startswith("y(i)") else (lambda a: a.T @ x)
    for _ in range(20):  # enough to replay, and to pack the replay's arguments
        k(A=m, x=x, out=y)
    np.testing.assert_allclose(y, want(m))
    lo, hi = m.indptr[3], m.indptr[4]
    m.indices[lo:hi] = m.indices[lo:hi][::-1].copy()  # row 3 reversed, in place
    k(A=m, x=x, out=y)
    np.testing.assert_allclose(y, want(m.toarray()), rtol=1e-12)
    saved = m.indices[lo]
    m.indices[lo] = 40
    with pytest.raises(ucf.FormatError, match="operand A.*out of range"):
        k(A=m, x=x, out=y)
    m.indices[lo] = saved
    m.indptr[5] = m.indptr[6] + 1
    with pytest.raises(ucf.FormatError, match="operand A.*decreases"):
        k(A=m, x=x, out=y)


def test_an_order_relying_kernel_checks_a_replayed_matrix_order():
    """Merging A with B relies on A's order: a matrix made unsorted in place after
    replayed calls is repacked on the next, and the answer stays scipy's."""
    a = sp.random(30, 30, density=0.3, format="csr", random_state=3)
    b = sp.random(30, 30, density=0.3, format="csr", random_state=4)
    k = ucf.compile("y(i) = A(i,j) * B(i,j)", formats={"A": "csr", "B": "csr"})
    y = np.zeros(30)
    for _ in range(20):
        k(A=a, B=b, out=y)
    lo, hi = a.indptr[2], a.indptr[3]
    a.indices[lo:hi] = a.indices[lo:hi][::-1].copy()
    a.data[lo:hi] = a.data[lo:hi][::-1].copy()
    k(A=a, B=b, out=y)
    np.testing.assert_allclose(y, (a.toarray() * b.toarray()).sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("kernel_format", ["csc", "csr"])
def test_unsorted_csc_read_in_place_or_converted(kernel_format):
    """A CSC with shuffled, repeated row indices (the transpose of an unsorted CSR) is
    read in place by a CSC kernel; a CSR kernel converts it (after checking its order,
    as conversions may rely on it). COO and BSR still convert. Every answer is scipy's."""
    a = unsorted(8).T  # csc_array on the CSR's own arrays
    assert a.format == "csc" and not a.has_canonical_format
    x = np.random.default_rng(9).random(a.shape[1])
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": kernel_format})
    for m in (a, a.tocoo(), sp.bsr_array(a.toarray())):
        np.testing.assert_allclose(k(A=m, x=x).to_numpy(), a @ x, rtol=1e-12, atol=1e-12)


@settings(max_examples=200)
@given(
    rows=st.lists(st.lists(st.integers(0, 6), max_size=5), min_size=1, max_size=6),
    wide=st.booleans(),
)
def test_increasing_agrees_with_each_row(rows, wide):
    """checks.increasing against a row-by-row reference, empty rows included."""
    idt = np.int64 if wide else np.int32
    pos = np.concatenate(([0], np.cumsum([len(r) for r in rows]))).astype(idt)
    crd = np.array([c for r in rows for c in r], dtype=idt)
    want = all(all(b > a for a, b in zip(r, r[1:], strict=False)) for r in rows)
    assert increasing(pos, crd) == want


@pytest.mark.parametrize("idt", [np.int32, np.int64])
def test_the_compiled_order_check_agrees_with_numpys(idt):
    """``array_checks.increasing`` against ``checks.increasing`` on segments sorted or
    not, with repeats, empty ones (first, last, runs of them) and none at all."""
    from ucf.exec import array_checks

    rng = np.random.default_rng(12)
    for _ in range(400):
        lens = rng.integers(0, 5, rng.integers(0, 9))
        pos = np.concatenate([[0], np.cumsum(lens)]).astype(idt)
        crd = rng.integers(0, 7, int(pos[-1]) + rng.integers(0, 3)).astype(idt)
        if rng.random() < 0.6:  # every segment sorted and unique
            for k in range(len(lens)):
                crd[pos[k] : pos[k + 1]] = np.sort(rng.choice(12, lens[k], replace=False))
            if rng.random() < 0.5 and pos[-1] > 1:  # but one pair that falls inside one
                q = rng.integers(1, int(pos[-1]))
                crd[q] = crd[q - 1]
        got = array_checks.increasing(pos, pos.ctypes.data, crd.ctypes.data)
        assert got == increasing(pos, crd[: int(pos[-1])]), (pos, crd)


@pytest.mark.parametrize("target", TARGETS)
def test_an_output_of_the_operands_structure_stores_every_value(target, monkeypatch):
    """``2*A`` takes A's positions and is allocated unzeroed: every value is stored,
    explicit zeros of A's included (the call's unzeroed arrays start as NaN here)."""
    from ucf.exec import recycled

    given = []

    def garbage(shape, dtype):
        given.append((tuple(shape), np.dtype(dtype)))
        return np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1, dtype=dtype)

    monkeypatch.setattr(recycled, "uninitialized", garbage)
    n = 300
    a = sp.random(n, n, density=0.05, format="csr", random_state=3)
    a.data[::7] = 0.0  # stored zeros stay stored
    k = ucf.compile("C(i,j) = 2*A(i,j)", formats={"A": "csr", "C": "csr"}, target=target)
    got = k(A=a)
    assert got.levels[1]["crd"].tolist() == a.indices.tolist()
    np.testing.assert_array_equal(got.vals, 2 * a.data)
    assert ((len(a.data),), np.dtype(float)) in given  # the values, from the patched allocation
