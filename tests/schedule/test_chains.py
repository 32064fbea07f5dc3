"""Chains of products (``y = A@B@x``, ``s = x'@A@B@z``, ``A@B@C@x``, ``A@B@X``,
``X@A@B``): the default forms each sub-product with one or two free variables once,
in a workspace outside the loops it does not depend on
(``ucf.schedule.contraction_order``), checked against numpy on both CPU
targets over formats, rectangular shapes and empty rows; the plans of statements where
it is not cheaper, or that have no such sub-product, are left alone."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import TARGETS, rand_dense, rand_sparse
from ucf import pipeline
from ucf.format.format import parse_format
from ucf.ir.printer import format_functions
from ucf.schedule import contraction_order
from ucf.schedule.stats import Stats

# statement -> (numpy's value, the operands' shapes from (m, r, n, l))
CHAINS = {
    "y(i) = A(i,j)*B(j,k)*x(k)": (
        lambda o: o["A"] @ (o["B"] @ o["x"]),
        lambda m, r, n, l: {"A": (m, r), "B": (r, n), "x": (n,)},
    ),
    "s = x(i)*A(i,j)*B(j,k)*z(k)": (
        lambda o: o["x"] @ (o["A"] @ (o["B"] @ o["z"])),
        lambda m, r, n, l: {"x": (m,), "A": (m, r), "B": (r, n), "z": (n,)},
    ),
    "y(i) = A(i,j)*B(j,k)*C(k,l)*x(l)": (
        lambda o: o["A"] @ (o["B"] @ (o["C"] @ o["x"])),
        lambda m, r, n, l: {"A": (m, r), "B": (r, n), "C": (n, l), "x": (l,)},
    ),
    "y(i) = A(i,j)*sum(k, B(j,k)*x(k))": (
        lambda o: o["A"] @ (o["B"] @ o["x"]),
        lambda m, r, n, l: {"A": (m, r), "B": (r, n), "x": (n,)},
    ),
    "Y(i,l) = A(i,j)*B(j,k)*X(k,l)": (
        lambda o: o["A"] @ (o["B"] @ o["X"]),
        lambda m, r, n, l: {"A": (m, r), "B": (r, n), "X": (n, l)},
    ),
    "Y(i,l) = X(i,k)*A(k,j)*B(j,l)": (
        lambda o: (o["X"] @ o["A"]) @ o["B"],
        lambda m, r, n, l: {"X": (l, m), "A": (m, r), "B": (r, n)},
    ),
}
MATRICES = "ABC"


def operands(expr: str, shape, seed: int = 0) -> dict[str, np.ndarray]:
    """Small integer values (exact sums), matrices with empty rows and an empty column."""
    rng = np.random.default_rng(seed)
    ops = {}
    for name, s in CHAINS[expr][1](*shape).items():
        if name in MATRICES:
            d = rand_sparse(rng, s, 0.25, empty_rows=2)
            d[:, rng.integers(s[1])] = 0
            ops[name] = d
        else:
            ops[name] = rand_dense(rng, s)
    return ops


def run(expr: str, formats: dict[str, str], ops: dict, target: str = "llvm", **kw):
    k = ucf.compile(expr, formats=formats, target=target, **kw)
    got = k(**{n: ucf.from_numpy(a, format=formats.get(n, "U" * a.ndim)) for n, a in ops.items()})
    return k, got.to_numpy()


FORMATS = [("csr", "csr"), ("csc", "csc"), ("csc", "csr"), ("csr", "csc"), ("dcsr", "dcsr")]


@pytest.mark.parametrize("fa,fb", [*FORMATS, ("dense", "csr"), ("dense", "dense")])
@pytest.mark.parametrize("expr", list(CHAINS)[:4])
def test_chains_against_numpy(expr, fa, fb):
    """Every format pair (a third matrix in B's format): the workspace plan, exact."""
    ops = operands(expr, (13, 17, 11, 9))
    formats = {"A": fa, "B": fb, "C": fb}
    formats = {n: f for n, f in formats.items() if n in ops and f != "dense"}
    k, got = run(expr, formats, ops)
    np.testing.assert_array_equal(got, CHAINS[expr][0](ops))
    assert "precomputed into workspace w" in k.cin, k.cin
    assert "multiplies through every path of the chain" in k.cin


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("expr", list(CHAINS))
def test_chains_on_both_targets(expr, target):
    """CSR throughout, rectangular, on llvm and c; the default's schedule text compiles
    back to the same kernel."""
    ops = operands(expr, (19, 7, 23, 5), seed=1)
    formats = {n: "csr" for n in MATRICES if n in ops}
    k, got = run(expr, formats, ops, target)
    np.testing.assert_array_equal(got, CHAINS[expr][0](ops))
    again = ucf.compile(expr, formats=formats, schedule=k.schedule_used, target=target)
    assert again.source == k.source
    if expr.startswith("Y("):  # B*X (X*A) has two free variables: a 2-D workspace
        at = "w(j, l)" if "B(j,k)*X" in expr else "w(i, j)"
        assert f"precomputed into workspace {at}" in k.cin, k.cin


@pytest.mark.slow  # the emulator's compile: 12 s
@pytest.mark.parametrize("target", TARGETS)
def test_precompute_of_a_nested_sum(target):
    """A user's precompute of a nested sum whole forms it once above the loop over i; a
    part of it is refused by name."""
    expr = "y(i) = A(i,j)*sum(k, B(j,k)*x(k))"
    ops = operands(expr, (12, 15, 9, 1), seed=3)
    formats = {"A": "csr", "B": "csc"}
    k, got = run(expr, formats, ops, target, schedule="precompute(B(j,k)*x(k), j, j, t)")
    np.testing.assert_array_equal(got, CHAINS[expr][0](ops))
    assert "alloc t" in format_functions(k.llir).split("for i in")[0]
    with pytest.raises(ucf.ScheduleError, match=r"B\(j, k\) is not a factor"):
        ucf.compile(expr, formats=formats, schedule="precompute(B(j,k), j, j, t)")


def test_the_cuda_target_keeps_the_plain_nest():
    """CUDA builds no workspace: the default keeps its rows over threads, and is right."""
    expr = "y(i) = A(i,j)*B(j,k)*x(k)"
    ops = operands(expr, (40, 30, 20, 1), seed=2)
    k, got = run(expr, {"A": "csr", "B": "csr"}, ops, "cuda", emulate=True)
    np.testing.assert_array_equal(got, CHAINS[expr][0](ops))
    assert "precomputed" not in k.cin and "GPUThread" in k.cin


def test_einsum_takes_the_chain_plan():
    rng = np.random.default_rng(4)
    a = sp.csr_matrix(rand_sparse(rng, (30, 40), 0.2))
    b = sp.csr_matrix(rand_sparse(rng, (40, 25), 0.2))
    x = rand_dense(rng, (25,))
    got = ucf.einsum("ij,jk,k->i", a, b, x)
    np.testing.assert_array_equal(np.asarray(got), a @ (b @ x))


def test_a_large_call_plans_with_statistics():
    """A call past the replanning threshold plans with its operands' statistics: k.cin
    gives both estimates, and the plan's text compiles to the same kernel."""
    n = 3000
    a, b = (sp.random(n, n, 10 / n, format="csr", random_state=s) for s in (1, 2))
    x = np.random.default_rng(5).random(n)
    k = ucf.compile("y(i) = A(i,j)*B(j,k)*x(k)", formats={"A": "csr", "B": "csr"})
    np.testing.assert_allclose(k(A=a, B=b, x=x).to_numpy(), a @ (b @ x), rtol=1e-12)
    line = next(w for w in k.cin.splitlines() if "default: precompute" in w)
    assert "about 6.3e+04 steps" in line and "about 3e+05 multiply-adds" in line, line


def _first(expr: str, formats: dict, stats: Stats | None):
    fmts = {n: parse_format(f) for n, f in formats.items()}
    return pipeline.proposals(expr, fmts, stats, threads=1)[0]


def test_the_model_compares_the_estimates():
    """The workspace where it saves work; the plain nest for a small dense chain, for
    rows of one entry in B, and for a single row of A (B@x would be formed whole for a
    row that reads ten of its entries)."""
    expr, csr = "y(i) = A(i,j)*B(j,k)*x(k)", {"A": "csr", "B": "csr"}
    big = Stats({"i": 20000, "j": 20000, "k": 20000}, {"A": 200000, "B": 200000})
    chosen = _first(expr, csr, big)
    assert str(chosen.commands[0]) == "precompute(B(j, k)*x(k), j, j, w)"
    assert any("about 4.2e+05 steps" in w and "about 2e+06 multiply-adds" in w for w in chosen.why)
    for stats, formats in [
        (Stats({"i": 4, "j": 4, "k": 4}), {}),
        (Stats({"i": 20000, "j": 20000, "k": 20000}, {"A": 200000, "B": 20000}), csr),
        (Stats({"i": 1, "j": 20000, "k": 20000}, {"A": 10, "B": 200000}), csr),
    ]:
        kept = _first(expr, formats, stats)
        assert not any(str(c).startswith("precompute") for c in kept.commands), stats
        assert any("default: the plain nest" in w for w in kept.why), kept.why


def test_a_sub_product_over_two_variables_goes_into_a_2d_workspace():
    """A@B@X forms B@X into w(j,l), X@A@B forms X@A into w(i,j); a workspace larger than
    MAX_WORKSPACE, or one whose zeroing costs more than it saves (X a sparse n x n
    matrix), keeps the plain nest; so does a chain with no dense factor over its second
    variable before a call."""
    n, csr = 20000, {"A": "csr", "B": "csr"}
    big = Stats({"i": n, "j": n, "k": n, "l": 8}, {"A": 10 * n, "B": 10 * n})
    chosen = _first("Y(i,l) = A(i,j)*B(j,k)*X(k,l)", csr, big)
    assert str(chosen.commands[0]) == "precompute(B(j, k)*X(k, l), {j,l}, {j,l}, w)"
    assert any("w(j,l) = B(j, k)*X(k, l) once, outside the loops over i" in w for w in chosen.why)
    assert not any(str(c).startswith("bound") for c in chosen.commands), chosen.commands
    left = Stats({"i": 8, "j": n, "k": n, "l": n}, {"A": 10 * n, "B": 10 * n})
    chosen = _first("Y(i,l) = X(i,k)*A(k,j)*B(j,l)", csr, left)
    assert str(chosen.commands[0]) == "precompute(X(i, k)*A(k, j), {i,j}, {i,j}, w)"
    square = Stats({v: n for v in "ijkl"}, {"A": 10 * n, "B": 10 * n, "X": 10 * n})
    sparse_x = {**csr, "X": "csr"}
    for stats, formats in [(square, sparse_x), (None, sparse_x)]:
        kept = _first("Y(i,l) = A(i,j)*B(j,k)*X(k,l)", formats, stats)
        assert not any(str(c).startswith("precompute") for c in kept.commands), kept.why
    small = Stats({v: 300 for v in "ijkl"}, {"A": 3000, "B": 3000, "X": 3000})
    assert 300 * 300 <= contraction_order.MAX_WORKSPACE
    kept = _first("Y(i,l) = A(i,j)*B(j,k)*X(k,l)", sparse_x, small)
    assert any("default: the plain nest" in w for w in kept.why), kept.why


def test_a_longer_chain_is_searched_not_greedy():
    """A@B@C@x: forming B*C*x first costs what C*x then B*w does in one step, but the
    search finds the sequence that forms C@x, then B@w."""
    stats = Stats({v: 20000 for v in "ijkl"}, {n: 200000 for n in "ABC"})
    formats = {n: "csr" for n in "ABC"}
    chosen = _first("y(i) = A(i,j)*B(j,k)*C(k,l)*x(l)", formats, stats)
    assert [str(c) for c in chosen.commands[:2]] == [
        "precompute(C(k, l)*x(l), k, k, w)",
        "precompute(B(j, k)*w(k), j, j, w1)",
    ]


@pytest.mark.parametrize(
    "expr,formats",
    [
        ("y(i) = A(i,j)*x(j)", {"A": "csr"}),
        ("C(i,k) = A(i,j)*B(j,k)", {"A": "csr"}),
        ("C(i,j) = A(i,k)*B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}),
        ("C(i,j) = S(i,j)*A(i,k)*B(j,k)", {"S": "csr"}),
        ("C(i,j) = S(i,j)*A(i,k)*B(j,k)", {"S": "csr", "C": "csr"}),
        ("A(i,j) = B(i,k,l)*C(k,j)*D(l,j)", {"B": "csf"}),
        ("A(i,j) = B(i,j,k)*c(k)", {"B": "csf"}),
        ("C(i,j) = A(i,k)*B(k,j) + D(i,l)*E(l,j)", {n: "csr" for n in "ABCDE"}),
        ("y(i) = A(i,j)*x(j) + B(i,j)*x(j)", {"A": "csr", "B": "csr"}),
    ],
)
def test_other_kernels_get_no_chain_plan(expr, formats):
    """SpMV, SpMM, SpGEMM, SDDMM, MTTKRP, TTV and sums of products have no sub-product
    with one free variable to form: their plans are untouched (their C sources were
    compared byte for byte with main's: identical)."""
    stats = Stats({v: 300 for v in "ijkl"}, {n: 3000 for n in "ABSDE"})
    for known in (None, stats):
        chosen = _first(expr, formats, known)
        assert not any("path of the chain" in w or "plain nest" in w for w in chosen.why)
        fmts = {n: parse_format(f) for n, f in formats.items()}
        base = pipeline._Front(expr, fmts, None, None).concretized()
        assert contraction_order.plan(base, known, []) == []


@settings(max_examples=15)
@given(
    expr=st.sampled_from(list(CHAINS)),
    fa=st.sampled_from(["csr", "csc", "dcsr", "dense"]),
    fb=st.sampled_from(["csr", "csc", "dcsr", "dense"]),
    fc=st.sampled_from(["csr", "csc", "dense"]),
    shape=st.tuples(*[st.integers(1, 9)] * 4),
    seed=st.integers(0, 2**16),
)
def test_chains_of_operands_and_formats(expr, fa, fb, fc, shape, seed):
    ops = operands(expr, shape, seed)
    formats = {"A": fa, "B": fb, "C": fc}
    formats = {n: f for n, f in formats.items() if n in ops and f != "dense"}
    _, got = run(expr, formats, ops)
    np.testing.assert_array_equal(got, CHAINS[expr][0](ops))
