"""The gradients of an SDDMM, ``A(i,j) = B(i,j) * C(i,k) * D(k,j)`` with A and B in CSR,
for each layout of D and K = 1 (bench/sddmm_gradients.py times them against scipy).

At K = 1 the plan of a call's own moves the output loop of C's gradient, ``grad_C(i,k)
= grad_A(i,j) * D(k,j) * B(i,j)``, outermost, above the sum over j (``ucf.schedule.unit_loops``),
and a ``(1, n)`` D, C- and Fortran-ordered at once, is read in place where the kernel
reads it ``UU:1,0`` (``ucf.format.relayout.same_layout``; it was copied on every call
with a ConversionWarning). Checked against torch autograd in float64 (the pattern as
B's zeros), with ``torch.autograd.gradcheck`` through ``ucf.torch.einsum``, on llvm
and c, one and two threads, with empty rows.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ucf
from ucf import pipeline
from ucf.format.format import parse_format
from ucf.schedule import cpu_model
from ucf.schedule.stats import Stats

torch = pytest.importorskip("torch")
import ucf.torch  # noqa: E402  (after the skip)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's sparse-beta notes

SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
GRAD_C = "grad_C(i,k) = grad_A(i,j) * D(k,j) * B(i,j)"
#: D's layouts: Fortran-ordered or not, and the format it is declared in.
LAYOUTS = {
    "column-major": (True, "UU:1,0"),
    "row-major": (False, "UU"),
    "declared-UU": (True, "UU"),
}


def operands(n=11, m=9, K=1, seed=0, fortran=True):
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((n, m))
    B[rng.random((n, m)) < 0.6] = 0
    B[[2, n - 1]] = 0  # empty rows, the last among them
    C, D = rng.standard_normal((n, K)), rng.standard_normal((K, m))
    return (
        B,
        C,
        np.asfortranarray(D) if fortran else np.ascontiguousarray(D),
        rng.standard_normal((n, m)),
    )


def torch_reference(B, C, D, G):
    """Gradients of sum(G * A) by torch autograd on dense tensors, B's on its pattern."""
    Bt, Ct, Dt = (torch.tensor(np.ascontiguousarray(x), requires_grad=True) for x in (B, C, D))
    A = Bt * (Ct @ Dt)
    gB, gC, gD = torch.autograd.grad((A * torch.tensor(G)).sum(), (Bt, Ct, Dt))
    return gB.numpy() * (B != 0), gC.numpy(), gD.numpy()


@pytest.fixture
def own_plans(monkeypatch):
    """Every call plans for its own statistics, as a call of 100k rows does (the thread
    count is restored by tests/conftest.py)."""
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 0)


def _first(expr: str, stats: Stats, threads: int):
    """The first proposal the checker accepts: the plan a call with ``stats`` gets."""
    fmts = {"grad_A": parse_format("csr"), "B": parse_format("csr")}
    for choice in pipeline.proposals(expr, fmts, stats, threads=threads):
        try:
            ucf.compile(expr, {"grad_A": "csr", "B": "csr"}, schedule=choice.text)
        except ucf.ScheduleError:
            continue
        return choice
    raise AssertionError("no proposal passed")


@pytest.mark.parametrize("threads", [1, 2])
def test_an_output_loop_of_one_step_runs_above_the_sum(threads):
    """K = 1: C's gradient sums each entry over j in a register (``k, i, j``, k of one
    step outermost); at K = 8 the row of K entries stays innermost, where each stored
    entry serves all of it."""
    nnz = {"grad_A": 10**6, "B": 10**6}
    one = _first(GRAD_C, Stats({"i": 10**5, "j": 10**5, "k": 1}, nnz), threads)
    assert "reorder(k, i, j)" in one.text, one.text
    assert any("extent 1 at this call" in w for w in one.why)
    eight = _first(GRAD_C, Stats({"i": 10**5, "j": 10**5, "k": 8}, nnz), threads)
    assert "reorder(k, i, j)" not in eight.text, eight.text
    assert not any("extent 1" in w for w in eight.why)


def test_an_output_loop_stored_by_a_sparse_operand_stays_below_its_sum():
    """SpMM into one column with C in csr: C stores k below j, so k of one step cannot go
    above the sum over j without breaking C's walk; the model does not propose it (a
    proposal ``reorder`` refuses is dropped with a note, and with it any other move it
    carried)."""
    expr, fmts = "A(i,k) = B(i,j) * C(j,k)", {"B": "csr", "C": "csr"}
    stats = Stats({"i": 10**5, "j": 10**5, "k": 1}, {"B": 10**6, "C": 5 * 10**4})
    parsed = {n: parse_format(f) for n, f in fmts.items()}
    choices = pipeline.proposals(expr, parsed, stats, threads=2)
    assert not any("refused" in w for c in choices for w in c.why), choices[0].why


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("K", [1, 3])
def test_the_gradients_against_torch(own_plans, target, threads, layout, K):
    ucf.set_num_threads(threads)
    fortran, fmt = LAYOUTS[layout]
    B, C, D, G = operands(K=K, seed=K, fortran=fortran)
    Bs = ucf.from_numpy(B, format="csr")
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr", "D": fmt}, target=target)
    back = ucf.gradients(k)
    ops = {"B": Bs, "C": C, "D": D}
    with warnings.catch_warnings():
        # read in place: a (1, n) D is C- and Fortran-ordered at once
        warnings.simplefilter("error" if K == 1 else "ignore", ucf.ConversionWarning)
        A = k(**ops)
        cols, count = A.columns()
        at = tuple(A.format.mode_coords(cols, count).T)
        grad = ucf.Tensor(A.shape, A.format, A.levels, G[at])
        got = [back(w, grad, ops) for w in "BCD"]
        again = back("C", grad, ops)  # the second call of the same operands replays
    want = torch_reference(B, C, D, np.where(B != 0, G, 0))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.to_numpy(), w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(again.to_numpy(), want[1], rtol=1e-10, atol=1e-12)
    assert ("extent 1 at this call" in back.kernel("C").cin) == (K == 1)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_gradcheck_at_k_1(own_plans, target):
    """Finite differences through ``ucf.torch.einsum``: B's values, C and a column-major
    D of one row, B with empty rows."""
    ucf.set_num_threads(1)
    B, C, D, _ = operands(n=7, m=6, K=1, seed=3)
    crow = torch.tensor(B).to_sparse_csr()
    index = (crow.crow_indices(), crow.col_indices())
    vals = crow.values().clone().requires_grad_()
    Ct, Dt = (torch.tensor(np.ascontiguousarray(x), requires_grad=True) for x in (C, D))
    fmts = {"A": "csr", "D": "UU:1,0"}

    def f(v, c, d):
        Bv = torch.sparse_csr_tensor(*index, v, B.shape)
        A = ucf.torch.einsum(SDDMM, formats=fmts, target=target, B=Bv, C=c, D=d)
        return A.values()

    assert torch.autograd.gradcheck(f, (vals, Ct, Dt))


@pytest.mark.parametrize("shape, fmt", [((1, 6), "UU:1,0"), ((6, 1), "UU:1,0"), ((0, 6), "UU:1,0")])
def test_a_dense_operand_with_one_long_mode_is_read_in_place(shape, fmt):
    """Its storage is the same in any mode order: no copy, no warning, the right sum."""
    x = np.random.default_rng(0).standard_normal(shape)
    k = ucf.compile("y(j) = D(k,j)", {"D": fmt})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ucf.ConversionWarning)
        np.testing.assert_allclose(np.asarray(k(D=x)), x.sum(axis=0))


def test_a_dense_operand_in_another_order_is_still_converted():
    x = np.random.default_rng(0).standard_normal((3, 6))
    k = ucf.compile("y(j) = D(k,j)", {"D": "UU:1,0"})
    with pytest.warns(ucf.ConversionWarning):
        np.testing.assert_allclose(np.asarray(k(D=x)), x.sum(axis=0))


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("same", [True, False])
def test_bs_gradient_on_the_outputs_positions(target, same):
    """Where the output's gradient stores exactly B's positions (the forward result's,
    copies of B's index arrays), B's gradient runs without the pattern, one sparse operand
    and no counting pass (``ucf.autodiff.on_positions``); with a position fewer it keeps
    the pattern. Both against torch autograd."""
    B, C, D, G = operands(K=2, seed=5)
    Bs = ucf.from_numpy(B, format="csr")
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr"}, target=target)
    A = k(B=Bs, C=C, D=D)
    cols, count = A.columns()
    at = tuple(A.format.mode_coords(cols, count).T)
    G = np.where(B != 0, G, 0)
    grad = ucf.Tensor(A.shape, A.format, A.levels, G[at])
    if not same:  # one stored entry fewer: G is zero there
        G[at[0][0], at[1][0]] = 0
        grad = ucf.from_numpy(G, format="csr")
    back = ucf.gradients(k)
    got = back("B", grad, {"B": Bs, "C": C, "D": D})
    assert got.levels is Bs.levels
    np.testing.assert_allclose(got.to_numpy(), torch_reference(B, C, D, G)[0], rtol=1e-10)
    assert ("B" in back._positions._kernels) == same


def test_a_call_under_replan_work_with_k_of_1_gets_a_plan_of_its_own():
    """2,000 rows of 10 at K = 1 (20,000 multiply-adds, under ``REPLAN_WORK``): the loop
    of one step would run with a trip count read at every stored entry in the plan
    compiled before any call (``ucf.schedule.unit_loops.pays_below``)."""
    rng = np.random.default_rng(4)
    n = 2000
    rows, cols = np.repeat(np.arange(n), 10), rng.integers(0, n, 10 * n)
    B = np.zeros((n, n))
    B[rows, cols] = rng.standard_normal(10 * n)
    C, D = rng.standard_normal((n, 1)), np.asfortranarray(rng.standard_normal((1, n)))
    Bs = ucf.from_numpy(B, format="csr")
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr", "D": "UU:1,0"})
    A = k(B=Bs, C=C, D=D)
    back = ucf.gradients(k)
    g = ucf.Tensor(A.shape, A.format, A.levels, rng.standard_normal(len(A.vals)))
    got = back("C", g, {"B": Bs, "C": C, "D": D})
    G = np.zeros((n, n))
    cols_a, count = A.columns()
    G[tuple(A.format.mode_coords(cols_a, count).T)] = g.vals
    np.testing.assert_allclose(np.asarray(got), (G * B) @ D.T, rtol=1e-10, atol=1e-12)
    assert "extent 1 at this call" in back.kernel("C").cin


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_bs_gradient_after_its_positions_are_written_in_place(target):
    """Positions found equal to B's on one call are compared again on the next: the
    output gradient's column indices written in place (one entry moved to a column B
    does not store) take the pattern's kernel, as a fresh ``ucf.gradients`` would; the
    result against torch autograd."""
    B, C, D, _ = operands(K=2, seed=6)
    Bs = ucf.from_numpy(B, format="csr")
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr"}, target=target)
    A = k(B=Bs, C=C, D=D)
    pos, crd = A.levels[1]["pos"], A.levels[1]["crd"].copy()
    vals = np.random.default_rng(6).standard_normal(len(A.vals))
    grad = ucf.Tensor(A.shape, A.format, [A.levels[0], {"pos": pos, "crd": crd}], vals)
    back = ucf.gradients(k)
    back("B", grad, {"B": Bs, "C": C, "D": D})
    row = next(r for r in range(B.shape[0]) if 0 < np.count_nonzero(B[r]) < B.shape[1])
    lo, hi = pos[row], pos[row + 1]
    crd[lo] = next(c for c in range(B.shape[1]) if B[row, c] == 0)
    order = lo + np.argsort(crd[lo:hi], kind="stable")
    crd[lo:hi], vals[lo:hi] = crd[order], vals[order]  # the row kept in column order
    got = back("B", grad, {"B": Bs, "C": C, "D": D})
    G = np.zeros(B.shape)
    G[np.repeat(np.arange(B.shape[0]), np.diff(pos)), crd] = vals
    np.testing.assert_allclose(got.to_numpy(), torch_reference(B, C, D, G)[0], rtol=1e-10)
