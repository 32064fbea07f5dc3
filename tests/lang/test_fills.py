"""max/min reductions and fill values (docs/language.md) against numpy.

The references are numpy's ``max``/``min`` over the dense array that a tensor
stands for, absent entries holding the format's fill value; the data have empty
rows, rows whose every entry is absent (all-masked), and entries of either sign.
"""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS, needs_cc, product_params

INF = np.inf


def masked(rng, shape, fill, density=0.4):
    """A dense array whose absent entries (about 1 - density of them, and all of row 1)
    hold ``fill``; stored values are small signed integers, so every result is exact."""
    a = rng.integers(-5, 6, size=shape).astype(np.float64)
    live = rng.random(shape) < density
    live[1] = False  # an all-masked (or empty) row
    return np.where(live, a, fill)


FORMATS = ["csr", "dcsr", "csc", "coo", "dense"]
FILLS = [0.0, -INF, INF, 2.0]
#: The default suite's share of the matrix below (each format and fill once, c twice).
QUICK = [
    ("llvm", "csr", -INF),
    ("llvm", "dcsr", 0.0),
    ("llvm", "coo", INF),
    ("llvm", "csc", 2.0),
    ("llvm", "dense", 0.0),
    ("c", "csr", -INF),
    ("c", "dcsr", 2.0),
]
EVERY = [
    pytest.param(t, f, v, marks=[pytest.mark.slow, *([needs_cc] if t == "c" else [])])
    for t in ("llvm", "c")
    for f in FORMATS
    for v in FILLS
    if (t, f, v) not in QUICK
]


@pytest.mark.parametrize(
    "target,fmt,fill",
    [pytest.param(*q, marks=[needs_cc] if q[0] == "c" else []) for q in QUICK] + EVERY,
)
def test_max_and_min_reductions_over_rows(target, fmt, fill):
    rng = np.random.default_rng([7, FORMATS.index(fmt)])
    A = masked(rng, (6, 5), fill)
    spelled = f"{fmt} fill={fill}" if fill else fmt
    T = ucf.from_numpy(A, spelled)
    dense = T.to_numpy()
    if fmt != "dense":
        np.testing.assert_array_equal(dense, A)  # absent entries read as the fill
    k = ucf.compile("y(i) = max(j, A(i,j)) + min(k, A(i,k))", {"A": spelled}, target=target)
    np.testing.assert_array_equal(k(A=T).to_numpy(), dense.max(axis=1) + dense.min(axis=1))
    # over the columns: the outer loop is the reduction's own
    k = ucf.compile("y(j) = max(i, A(i,j) * 2)", {"A": spelled}, target=target)
    np.testing.assert_array_equal(k(A=T).to_numpy(), (dense * 2).max(axis=0))


@pytest.mark.parametrize("target", TARGETS)
def test_a_reduction_over_an_empty_range_is_its_identity(target):
    for op, identity in (("max", -INF), ("min", INF), ("sum", 0.0)):
        k = ucf.compile(f"y(i) = {op}(j, A(i,j))", {"A": "csr fill=-inf"}, target=target)
        got = k(A=ucf.from_numpy(np.zeros((3, 0)), "csr fill=-inf")).to_numpy()
        np.testing.assert_array_equal(got, np.full(3, identity))


@pytest.mark.parametrize("target", TARGETS)
def test_masked_softmax_in_statements(target):
    """Scores in the mask's pattern (absent: -inf), a row max, exp into a sparse output,
    a row sum, and the weighted values: a row with no live key gives 0."""
    rng = np.random.default_rng(3)
    n, d = 9, 4
    mask = rng.random((n, n)) < 0.35
    mask[2] = False
    Q, K, V = (rng.standard_normal((n, d)) for _ in range(3))
    M = ucf.from_numpy(np.where(mask, 0.0, -INF), "csr fill=-inf")
    scores = ucf.compile(
        "S(i,j) = M(i,j) + 0.5 * sum(d, Q(i,d) * K(j,d))",
        {"M": "csr fill=-inf", "S": "csr fill=-inf"},
        target=target,
    )
    S = scores(M=M, Q=Q, K=K)
    assert str(S.format) == "UC fill=-inf" and S.nnz == mask.sum()
    want_s = np.where(mask, 0.5 * Q @ K.T, -INF)
    np.testing.assert_allclose(S.to_numpy(), want_s, rtol=1e-14)
    m = ucf.compile("m(i) = max(j, S(i,j))", {"S": "csr fill=-inf"}, target=target)(S=S)
    m = m.to_numpy()
    assert m[2] == -INF
    P = ucf.compile(
        "P(i,j) = exp(S(i,j) - m(i))", {"S": "csr fill=-inf", "P": "csr"}, target=target
    )(S=S, m=m)
    assert P.nnz == mask.sum()  # exp(-inf) = 0: absent scores stay absent
    l_ = ucf.compile("l(i) = P(i,j)", {"P": "csr"}, target=target)(P=P).to_numpy()
    O = ucf.compile("O(i,e) = P(i,j) * V(j,e) / max(l(i), 1)", {"P": "csr"}, target=target)
    got = O(P=P, V=V, l=l_).to_numpy()
    with np.errstate(invalid="ignore"):
        w = np.exp(want_s - want_s.max(axis=1, keepdims=True))
        w = np.nan_to_num(w / w.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(got, w @ V, atol=1e-13)
    assert not got[2].any()


@pytest.mark.parametrize("target", TARGETS)
def test_a_function_that_makes_nan_of_a_fill(target):
    """``sin(-inf)`` folds to a NaN constant, which the C printer writes as ``NAN``
    (it wrote Python's ``nan``, which no C compiler takes; the statement fuzzer's)."""
    c = np.array([1.0, -INF, 2.0])
    for dtype in (np.float64, np.float32):
        k = ucf.compile("X(k) = sin(C(k))", {"C": "C:0 fill=-inf"}, target=target, dtype=dtype)
        got = k(C=ucf.from_numpy(c.astype(dtype), "C:0 fill=-inf")).to_numpy()
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(got, np.sin(c.astype(dtype)), rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_an_infinite_fill_decides_which_operand_drives(target):
    """-inf absorbs +, so M drives M + B; where M is absent the output keeps -inf
    unstored, and a dense output computes -inf there."""
    rng = np.random.default_rng(4)
    live = rng.random((5, 6)) < 0.3
    Mv = np.where(live, rng.integers(-3, 4, (5, 6)).astype(float), -INF)
    B = rng.integers(-3, 4, (5, 6)).astype(float)
    M = ucf.from_numpy(Mv, "csr fill=-inf")
    sparse = ucf.compile(
        "C(i,j) = M(i,j) + B(i,j)", {"M": "csr fill=-inf", "C": "csr fill=-inf"}, target=target
    )
    C = sparse(M=M, B=B)
    assert C.nnz == live.sum()
    np.testing.assert_array_equal(C.to_numpy(), Mv + B)
    dense = ucf.compile("C(i,j) = M(i,j) + B(i,j)", {"M": "csr fill=-inf"}, target=target)
    np.testing.assert_array_equal(dense(M=M, B=B).to_numpy(), Mv + B)
    # A product with a zero-filled operand: 0 absorbs it, -inf * 0 is 0 by structure.
    Z = np.where(rng.random((5, 6)) < 0.5, B, 0.0)
    prod = ucf.compile(
        "C(i,j) = M(i,j) * Z(i,j)", {"M": "csr fill=-inf", "Z": "csr"}, target=target
    )
    got = prod(M=M, Z=ucf.from_numpy(Z, "csr")).to_numpy()
    np.testing.assert_array_equal(got, np.where(Z == 0, 0.0, Mv * Z))


@pytest.mark.parametrize("target", TARGETS)
def test_where_fills_meet_as_ieee_nan_the_result_is_nan_or_the_absorbing_value(target):
    """docs/language.md: where absorbing fills meet (``-inf + inf``), a skipped
    coordinate holds the structural value, the left operand's, and a visited one IEEE's
    NaN; everywhere else the result is numpy's."""
    a = np.array([1.0, -INF, -INF, 2.0])  # fill -inf: stored at 0 and 3
    b = np.array([INF, 3.0, INF, 4.0])  # fill inf: stored at 1 and 3
    c = np.full(4, -INF)  # fill -inf: stored nowhere
    fmts = {"A": "C:0 fill=-inf", "B": "C:0 fill=inf", "C": "C:0 fill=-inf"}
    ops = {n: ucf.from_numpy(v, fmts[n]) for n, v in zip("ABC", (a, b, c), strict=True)}
    with np.errstate(invalid="ignore"):
        cases = [
            ("X(i) = A(i) + B(i)", -INF, a + b),
            ("X(i) = B(i) + A(i)", INF, b + a),
            ("X(i) = (A(i) + B(i)) + C(i)", -INF, a + b + c),
        ]
    for expr, left, want in cases:
        read = [n for n in fmts if f"{n}(" in expr]
        k = ucf.compile(expr, {n: fmts[n] for n in read}, target=target)
        got = k(**{n: ops[n] for n in read}).to_numpy()
        ieee = np.isnan(want)
        np.testing.assert_array_equal(got[~ieee], want[~ieee], err_msg=expr)
        assert all(np.isnan(g) or g == left for g in got[ieee]), (expr, got)
        if len(read) == 2:  # neither stored at 2: skipped, the left operand's infinity
            assert got[2] == left, expr


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("blocks", ["UU:0/2,0%2", "UC:0/2,0%2"])
def test_a_partial_block_stops_at_the_extent_beside_an_infinite_fill(target, blocks):
    """A's last block of 2 over an extent of 3 holds a place past the end; the fill of B
    (-inf) there times A's padding (0) would be NaN, so the loop stops at the extent
    (found by the fills fuzzer: the product's padding was taken to vanish)."""
    a = np.array([1.0, 1.0, 1.0])
    b = np.array([-2.0, -INF, 3.0])
    k = ucf.compile("X = -(A(i) * B(i))", {"A": blocks, "B": "C fill=-inf"}, target=target)
    got = k(A=ucf.from_numpy(a, blocks), B=ucf.from_numpy(b, "C fill=-inf")).to_numpy()
    np.testing.assert_array_equal(got, -np.sum(a * b))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_max_and_min(dtype):
    rng = np.random.default_rng(5)
    A = masked(rng, (5, 4), 0.0).astype(dtype)
    k = ucf.compile("y(i) = max(j, A(i,j)) + min(k, A(i,k))", {"A": "csr"}, dtype=dtype)
    got = k(A=ucf.from_numpy(A, "csr", dtype=dtype)).to_numpy()
    np.testing.assert_array_equal(got, A.max(axis=1) + A.min(axis=1))
    assert got.dtype == dtype


def test_max_min_reductions_and_fills_under_the_cuda_emulator():
    rng = np.random.default_rng(6)
    A = masked(rng, (40, 30), -INF)
    T = ucf.from_numpy(A, "csr fill=-inf")
    k = ucf.compile(
        "y(i) = max(j, A(i,j)) + sum(k, exp(A(i,k)))",
        {"A": "csr fill=-inf"},
        target="cuda",
        emulate=True,
    )
    with np.errstate(invalid="ignore"):
        want = A.max(axis=1) + np.exp(A).sum(axis=1)
    np.testing.assert_allclose(k(A=T).to_numpy(), want, rtol=1e-13)


def test_max_with_an_index_variable_first_is_a_reduction():
    from ucf.lang.parser import parse_statement

    assert str(parse_statement("y(i) = max(j, A(i,j))").rhs) == "max(j, A(i, j))"
    assert str(parse_statement("y(i) = min(j, k, A(i,j,k))").rhs) == "min(j, k, A(i, j, k))"
    # alpha indexes nothing: the element-wise max, and j is summed over the whole side
    assert str(parse_statement("y(i) = max(alpha, A(i,j))").rhs) == "sum(j, max(alpha(), A(i, j)))"
    k = ucf.compile("y(i) = max(j, A(i,j))", {"A": "csr fill=-inf"})
    assert k.cin.splitlines()[0] == "forall(i, where(y(i) = max_j, forall(j, max_j max= A(i, j))))"


@pytest.mark.parametrize(
    "expr,message",
    [
        ("y(i) = max(j, A(i,j)) * j", "both an index variable of the statement"),
        ("y(i,j) = max(j, A(i,j))", "an output variable cannot be reduced"),
        ("y(i) = max(a, b, A(i,j))", "max takes 2 arguments, got 3"),
        ("y(i) = min(j, A(i,j)) + min(j, B(i,j))", "reduced by two reductions"),
        ("y(i) = max(j, A(i,j)) * x(j)", "j is also used outside the max"),
    ],
)
def test_misused_max_is_a_parse_error_with_a_caret(expr, message):
    with pytest.raises(ucf.ParseError, match=message) as e:
        ucf.compile(expr)
    assert "^" in str(e.value)


@pytest.mark.parametrize(
    "make,error,message",
    [
        (
            lambda: ucf.compile("y(i) = A(i,j)", {"A": "csr fill=-inf"}, dtype="int32"),
            ucf.UnsupportedError,
            "a i32 kernel cannot hold",
        ),
        (
            lambda: ucf.compile("y(i) = A(i, i+j)", {"A": "csr fill=1"}).cin,
            ucf.UnsupportedError,
            "affine index",
        ),
        (
            lambda: ucf.compile("y(i) = A(i,j)", {"A": "csr fill=-inf", "y": "C fill=-inf"}),
            ucf.UnsupportedError,
            "a sum that meets no entry is 0",
        ),
        (
            lambda: ucf.compile("y(i) = A(i,j)", {"A": "bcsr(2,2) fill=-inf"}),
            ucf.FormatError,
            "blocked or fixed-width",
        ),
        (
            lambda: ucf.compile(
                "y(i) = max(j, A(i,j))",
                {"A": "csr"},
                "parallelize(j, CPUThread, ParallelReduction)",
            ),
            ucf.ScheduleError,
            "parallel max or min reduction is not supported",
        ),
        (
            lambda: ucf.compile("X = A(i) * B(i)", {"A": "UF2:0/2,0%2", "B": "C fill=-inf"}).cin,
            ucf.UnsupportedError,
            r"X = A\(i\) \* B\(i\): tensor A has a fixed-width level, and i runs in blocks",
        ),
        (  # blocked by the output's format, not A's (statement fuzzer, seed 45)
            lambda: (
                ucf.compile(
                    "X(i) = A(j,i) * B(i,j)",
                    {"A": "CF1:1,0", "B": "CC:0,1 fill=inf", "X": "UC:0/3,0%3"},
                ).cin
            ),
            ucf.UnsupportedError,
            r"X\(i\) = A\(j,i\) \* B\(i,j\): tensor A has a fixed-width level, and i runs",
        ),
        (lambda: ucf.parse_format("csr fill=nan"), ucf.FormatError, "is not a number"),
    ],
)
def test_what_the_rules_cannot_carry_is_refused_by_name(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_tensors_store_what_differs_from_their_fill():
    a = np.array([[1.0, -INF, 0.0], [-INF, -INF, -INF]])
    t = ucf.from_numpy(a, "csr fill=-inf")
    assert t.nnz == 2 and str(t.format) == "UC fill=-inf"  # the stored 0 is a value
    np.testing.assert_array_equal(t.to_numpy(), a)
    np.testing.assert_array_equal(t.convert("coo fill=-inf").to_numpy(), a)
    zero_filled = t.convert("csr")  # every -inf becomes a stored value
    assert zero_filled.nnz == 5
    np.testing.assert_array_equal(zero_filled.to_numpy(), a)
    with pytest.raises(ucf.UnsupportedError, match="scipy reads them as 0"):
        t.to_scipy()
    import scipy.sparse as sp

    back = ucf.from_scipy(sp.csr_array(np.eye(2)), "csr fill=-inf")
    np.testing.assert_array_equal(back.to_numpy(), np.eye(2))
    fmt = ucf.parse_format("csr").with_fill(-INF)
    assert fmt == ucf.parse_format("csr fill=-inf") and fmt.name == "csr fill=-inf"
    assert ucf.parse_format("dense fill=-inf") == ucf.parse_format("dense")  # nothing absent


def test_the_algebra_knows_every_function_at_zero():
    """Each unary function folds over constants (``ucf.lang.algebra``) as it is declared
    to treat 0, so a new function cannot be left out of the fills' rules."""
    from ucf.lang import algebra
    from ucf.lang.functions import FUNCTIONS

    unary = {name for name, f in FUNCTIONS.items() if f.arity == 1}
    assert set(algebra.UNARY) == unary
    for name in unary:
        assert (algebra.call(name, [0.0]) == 0) == FUNCTIONS[name].zero_preserving, name


@pytest.mark.parametrize("target", TARGETS)
def test_a_dense_level_of_a_filled_output_starts_as_the_fill(target):
    """A sparse output with a dense level below a stored coordinate holds every place of
    it; a place whose value is the fill is not written, so it must start as the fill,
    not 0 (the statement fuzzer, seed 45 case 7588: 0 where -inf was due)."""
    rng = np.random.default_rng(7588)
    a = rng.integers(-3, 3, 4).astype(float)
    b = np.where(rng.random((4, 4)) < 0.6, rng.integers(-3, 3, (4, 4)), np.inf)
    k = ucf.compile(
        "X(j,i) = -(A(j) + B(j,i))",
        {"B": "UC:1,0 fill=inf", "X": "CU:1,0 fill=-inf"},
        target=target,
    )
    got = k(A=a, B=ucf.from_numpy(b, "UC:1,0 fill=inf")).to_numpy()
    np.testing.assert_array_equal(got, -(a[:, None] + b))


@pytest.mark.parametrize("target", [*TARGETS, pytest.param("cuda", marks=pytest.mark.slow)])
def test_a_blocked_vector_beside_clashing_fills(target):
    """``max(i, A(i) + (B(i) + C(i)))`` with A in blocks of one, B stored everywhere with
    fill +inf, C stored at one entry with fill -inf (fills fuzz seed 139 case 676):
    numpy says -2. The blocks make the loop over them visit every block, and the case
    where B alone matched did nothing (C's fill makes the term -inf, max's identity);
    dropped from the chain of cases, its blocks fell through to the case where neither
    matched and read B's fill, +inf (on every target: the CUDA one under the emulator,
    in the slow run)."""
    a, b, c = np.array([-1.0, 3, 2]), np.array([-1.0, -3, -1]), np.array([-INF, -INF, -3])
    formats = {"A": "UC:0/1,0%1", "B": "C:0 fill=inf", "C": "C:0 fill=-inf"}
    expr = "X = max(i, A(i) + (B(i) + C(i)))"
    k = ucf.compile(expr, formats=formats, target=target, emulate=target == "cuda")
    ops = {n: ucf.from_numpy(v, format=formats[n]) for n, v in zip("ABC", (a, b, c), strict=True)}
    assert k(**ops).to_numpy() == np.max(a + b + c)


CLASH_SHAPES = [
    ("A(i) + (B(i) + C(i))", lambda a, b, c: a + (b + c)),
    ("(B(i) + C(i)) + A(i)", lambda a, b, c: (b + c) + a),
    ("A(i) * (B(i) + C(i))", lambda a, b, c: a * (b + c)),
]


@pytest.mark.parametrize(
    ("target", "reduction", "fills", "a_format", "shape"),
    product_params(
        ["max", "min"],
        [(INF, -INF), (-INF, INF)],
        ["UC:0/1,0%1", "UC:0/2,0%2", "UU:0/3,0%3", "U", "C"],
        range(len(CLASH_SHAPES)),
    ),
)
def test_a_third_operand_beside_clashing_fills(target, reduction, fills, a_format, shape):
    """The family of the case above: a third operand (blocked, dense or compressed)
    joined to two whose infinite fills clash, under max and min, against numpy. The
    operand whose fill would decide the reduction alone (+inf under max) is stored
    everywhere, the other at random, so the result is finite, and IEEE arithmetic never
    meets inf - inf: numpy needs no reading of ucf's structural rule. A holds no zero
    (an absent 0 times an infinity would be NaN in numpy), and in a product no negative
    entry (which would turn a -inf that max ignores into a +inf that decides it)."""
    expr, numpy_term = CLASH_SHAPES[shape]
    rng = np.random.default_rng(1000 + shape)
    n = 11
    a = rng.integers(-4, 5, n).astype(np.float64)
    a[a == 0] = 1.0
    if "*" in expr:
        a = np.abs(a)  # a product keeps the sign of the infinities that decide it
    decisive = INF if reduction == "max" else -INF
    live = [np.ones(n, bool) if f == decisive else rng.random(n) < 0.5 for f in fills]
    b, c = (np.where(m, rng.integers(-4, 5, n), f) for m, f in zip(live, fills, strict=True))
    formats = {"A": a_format, "B": f"C:0 fill={fills[0]:g}", "C": f"C:0 fill={fills[1]:g}"}
    k = ucf.compile(f"X = {reduction}(i, {expr})", formats=formats, target=target)
    ops = {m: ucf.from_numpy(v, format=formats[m]) for m, v in zip("ABC", (a, b, c), strict=True)}
    want = getattr(np, reduction)(numpy_term(a, b, c))
    assert np.isfinite(want)
    assert k(**ops).to_numpy() == want
