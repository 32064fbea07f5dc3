"""Multi-variable affine indices: the UCF paper's cases, extent inference, bad input, fuzzing.

Every expected value comes from numpy (``conv_reference``), never from ucf.
Operands are small integer-valued arrays with zeros in them and fixed seeds,
so results are exact and compared with ``np.array_equal``.

* The UCF paper's 1-D cases ``C(i) = A(2*i+k) * B(k)`` and
  ``C(i) = A(i+k) * B(k)`` for every U/C choice of ``A`` and ``B``, on both
  targets and in both loop orders; the ``i -> k`` order with both operands
  compressed must co-iterate them (a ``while`` loop over ``k`` checked on the
  LLIR), the ``k -> i`` order must not.
* Extent inference for variables that only occur inside affine indices
  (valid, strided, dilated and padded accesses), ``shapes=``/``out=``
  overrides, inconsistent and negative extents, and the formula ``k.cin``
  explains (evaluated, not string-matched).
* Bad input: non-affine indices (ParseError with line and column), affine
  output indices, affine indices on levels that cannot be searched.
* hypothesis: random strided/padded/dilated accesses in 1-D and 2-D on random
  U/C formats, with and without random loop orders, against a brute-force
  reference that reads out-of-range coordinates as zero.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import zlib

import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import EXPLORE, TARGETS, needs_cc, product_params, rand_sparse
from tests.lang.conv_reference import (
    affine_einsum,
    affine_einsum_loops,
    conv,
    conv_output_size,
    infer_extent,
)
from ucf.ir import nodes as ir

SEED = 20240917


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by the test's parameters, so every case is reproducible."""
    return np.random.default_rng([SEED, *(zlib.crc32(str(k).encode()) for k in key)])


def dense(result) -> np.ndarray:
    return result.to_numpy() if isinstance(result, ucf.Tensor) else np.asarray(result)


def pack(arrays: dict[str, np.ndarray], formats: dict[str, str]) -> dict[str, object]:
    """Operands as ucf.Tensors in their formats (others stay numpy arrays)."""
    return {
        n: ucf.from_numpy(a, format=formats[n]) if n in formats else a for n, a in arrays.items()
    }


def assert_exact(result, expected) -> None:
    got = dense(result)
    assert got.shape == np.shape(expected)
    np.testing.assert_array_equal(got, expected)


def names(message: str, name: str) -> bool:
    """``name`` occurs in ``message`` as a whole word."""
    return re.search(rf"(?<![A-Za-z0-9_.]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


# ----------------------------------------------------------------- LLIR walking


def nodes(node):
    """Every LLIR node reachable from ``node`` (statements, expressions, arrays), depth first."""
    if isinstance(node, list | tuple):
        for x in node:
            yield from nodes(x)
        return
    if not dataclasses.is_dataclass(node):
        return
    yield node
    for f in dataclasses.fields(node):
        yield from nodes(getattr(node, f.name))


def loops(fns, kind, label: str) -> list:
    return [n for n in nodes(fns) if isinstance(n, kind) and n.label == label]


def role_arrays(fn: ir.Function, role: str) -> dict[str, str]:
    """``{tensor: array name}`` of the parameters with ``role`` (e.g. 'crd') at level 0."""
    return {p.role[1]: p.name for p in fn.params if p.role[:1] == (role,) and p.role[2] == 0}


def var_names(expr) -> set[str]:
    return {n.name for n in nodes(expr) if isinstance(n, ir.Var)}


def coiterates(loop: ir.While, crd: dict[str, str], tensors) -> bool:
    """``loop``'s condition tests a position of each of ``tensors``.

    A position is a variable of the condition that indexes the tensor's
    coordinate array inside the loop.
    """
    tested = var_names(loop.cond)
    for t in tensors:
        reads = [
            n
            for n in nodes(loop.body)
            if isinstance(n, ir.Load) and n.array.name == crd[t] and var_names(n.index) & tested
        ]
        if not reads:
            return False
    return True


# ------------------------------------------------------------- the paper's cases

PAPER = {1: "C(i) = A(i+k) * B(k)", 2: "C(i) = A(2*i+k) * B(k)"}


def paper_operands(case: str):
    """(A, B) pairs: random with zeros at the ends, empty, single entries."""
    rng = rng_for("paper", case)
    a = rand_sparse(rng, (13,), 0.5, empty_rows=0)
    a[0] = a[-1] = 0
    b = rand_sparse(rng, (3,), 0.7, empty_rows=0)
    b[0] = 0
    b[1] = b[1] or 2.0
    single_a = np.zeros(13)
    single_a[6] = 5
    return [
        (a, b),
        (rand_sparse(rng, (9,), 0.8, empty_rows=0), rand_sparse(rng, (4,), 0.8, empty_rows=0)),
        (np.zeros(13), b),
        (a, np.zeros(3)),
        (single_a, b),
        (a[:3], b),  # a single output point
    ]


def paper_reference(a, b, stride):
    acc = [("A", [({"i": stride, "k": 1}, 0)]), ("B", [({"k": 1}, 0)])]
    ext = {"k": len(b)}
    ext["i"] = infer_extent({"i": stride, "k": 1}, 0, "i", len(a), ext)
    return affine_einsum(["i"], acc, {"A": a, "B": b}, ext)


@pytest.mark.parametrize(
    "target,stride,fa,fb,schedule",
    product_params([1, 2], "UC", "UC", [None, "", "reorder(i,k)", "reorder(k,i)"]),
)
def test_paper_1d(target, stride, fa, fb, schedule):
    formats = {"A": fa, "B": fb}
    k = ucf.compile(PAPER[stride], formats=formats, schedule=schedule, target=target)
    for a, b in paper_operands(f"{stride}"):
        got = k(**pack({"A": a, "B": b}, formats))
        assert_exact(got, paper_reference(a, b, stride))
        if stride == 1:  # the plain correlation numpy has built in
            np.testing.assert_array_equal(dense(got), np.correlate(a, b, "valid"))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa,fb", [("U", "U"), ("U", "C"), ("C", "U"), ("C", "C")])
def test_paper_loop_orders_agree(target, fa, fb):
    formats = {"A": fa, "B": fb}
    ik = ucf.compile(PAPER[1], formats=formats, schedule="reorder(i,k)", target=target)
    ki = ucf.compile(PAPER[1], formats=formats, schedule="reorder(k,i)", target=target)
    for a, b in paper_operands("orders"):
        ops = pack({"A": a, "B": b}, formats)
        np.testing.assert_array_equal(dense(ik(**ops)), dense(ki(**ops)))


@pytest.mark.parametrize("schedule", ["reorder(i,k)", None])
def test_paper_ik_coiterates_both_compressed(schedule):
    """In the i -> k order the k loop is a while loop walking A's window and B together."""
    k = ucf.compile(PAPER[1], formats={"A": "C", "B": "C"}, schedule=schedule)
    (fn,) = [f for f in k.llir if not f.internal]
    whiles = loops(k.llir, ir.While, "k")
    assert whiles, "no while loop over k"
    crd = role_arrays(fn, "crd")
    assert any(coiterates(w, crd, ["A", "B"]) for w in whiles)
    assert not loops(k.llir, ir.For, "k")


def test_paper_ki_does_not_coiterate():
    """In the k -> i order B drives k (a for loop) and A's window is walked for each k."""
    k = ucf.compile(PAPER[1], formats={"A": "C", "B": "C"}, schedule="reorder(k,i)")
    assert not loops(k.llir, ir.While, "k")
    (outer,) = loops(k.llir, ir.For, "k")
    (fn,) = [f for f in k.llir if not f.internal]
    pos = role_arrays(fn, "pos")
    assert {n.array.name for n in nodes([outer.start, outer.end]) if isinstance(n, ir.Load)} == {
        pos["B"]
    }
    assert loops(outer.body, ir.For, "i")


# ------------------------------------------------------------- extent inference

#: (statement, stride, padding, dilation) of a 1-D correlation ``O(p) = I(..) * F(r)``.
CONV_1D = [
    ("O(p) = I(p+r) * F(r)", 1, 0, 1),
    ("O(p) = I(2*p+r) * F(r)", 2, 0, 1),
    ("O(p) = I(3*p+r) * F(r)", 3, 0, 1),
    ("O(p) = I(p+2*r) * F(r)", 1, 0, 2),
    ("O(p) = I(p+r-1) * F(r)", 1, 1, 1),
    ("O(p) = I(p+r-2) * F(r)", 1, 2, 1),
    ("O(p) = I(2*p+r-1) * F(r)", 2, 1, 1),
    ("O(p) = I(2*p+2*r-2) * F(r)", 2, 2, 2),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fi", ["U", "C"])
@pytest.mark.parametrize("expr,stride,pad,dil", CONV_1D)
def test_inferred_extent_matches_torch_sizes(target, fi, expr, stride, pad, dil):
    k = ucf.compile(expr, formats={"I": fi}, target=target)
    rng = rng_for("extent", expr, fi)
    for n, kf in [(9, 3), (8, 3), (7, 2), (5, 1), (4, 4)]:
        if conv_output_size(n, kf, stride, pad, dil) < 0:
            continue
        x = rand_sparse(rng, (n,), 0.6, empty_rows=0)
        w = rand_sparse(rng, (kf,), 0.8, empty_rows=0)
        got = k(**pack({"I": x, "F": w}, {"I": fi}))
        expected = conv(x[None, None], w[None, None], stride, pad, dil)[0, 0]
        assert expected.shape == (conv_output_size(n, kf, stride, pad, dil),)
        assert_exact(got, expected)


@pytest.mark.parametrize("n,kf", [(7, 3), (3, 3), (3, 4), (1, 1)])
def test_valid_extent_is_difference_plus_one(n, kf):
    k = ucf.compile("O(p) = I(p+r) * F(r)")
    x = np.arange(1.0, n + 1)
    w = np.arange(1.0, kf + 1)
    got = dense(k(I=x, F=w))
    assert got.shape == (n - kf + 1,)
    if n >= kf:
        np.testing.assert_array_equal(got, np.correlate(x, w, "valid"))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fi", ["U", "C"])
@pytest.mark.parametrize("extent", [0, 2, 7, 9, 12])
def test_shapes_override_pads_with_zeros(target, fi, extent):
    """A larger output than inferred reads past I's end as zeros; a smaller one truncates."""
    k = ucf.compile("O(p) = I(p+r) * F(r)", formats={"I": fi}, target=target)
    x = rand_sparse(rng_for("override", extent), (7,), 0.6, empty_rows=0)
    w = np.array([2.0, 0.0, -3.0])
    padded = np.pad(x, (0, max(0, extent + 2 - 7)))
    expected = np.correlate(padded, w, "valid")[:extent]
    ops = pack({"I": x, "F": w}, {"I": fi})
    assert_exact(k(shapes={"p": extent}, **ops), expected)
    assert_exact(k(out=np.zeros(extent), **ops), expected)
    acc = [("I", [({"p": 1, "r": 1}, 0)]), ("F", [({"r": 1}, 0)])]
    assert_exact(expected, affine_einsum(["p"], acc, {"I": x, "F": w}, {"p": extent, "r": 3}))


@pytest.mark.parametrize("target", TARGETS)
def test_shapes_override_padded_2d(target):
    """A "same" 2-D convolution asked for one extra row/column on each side's far end."""
    rng = rng_for("override-2d")
    x = rand_sparse(rng, (5, 6), 0.5)
    w = rand_sparse(rng, (3, 3), 0.8, empty_rows=0)
    k = ucf.compile("O(p,q) = I(p+r-1, q+s-1) * F(r,s)", formats={"I": "UC"}, target=target)
    got = k(I=ucf.from_numpy(x, format="UC"), F=w, shapes={"p": 6, "q": 8})
    # padding (1, 2) rows and (1, 3) columns, then the valid correlation
    expected = conv(np.pad(x, ((1, 2), (1, 3)))[None, None], w[None, None])[0, 0]
    assert_exact(got, expected)


def test_smallest_extent_wins_over_several_accesses():
    expr = "O(p) = I(p+r) * J(2*p+r) * F(r)"
    k = ucf.compile(expr)
    rng = rng_for("smallest")
    x, y, w = (
        rand_sparse(rng, (9,), 0.7, empty_rows=0),
        rand_sparse(rng, (9,), 0.7, empty_rows=0),
        np.ones(3),
    )
    got = dense(k(I=x, J=y, F=w))
    acc = [("I", [({"p": 1, "r": 1}, 0)]), ("J", [({"p": 2, "r": 1}, 0)]), ("F", [({"r": 1}, 0)])]
    assert got.shape == (min(9 - 3 + 1, (9 - 3) // 2 + 1),)
    np.testing.assert_array_equal(
        got, affine_einsum(["p"], acc, {"I": x, "J": y, "F": w}, {"p": got.shape[0], "r": 3})
    )
    line = next(x for x in k.cin.splitlines() if "|p|" in x)
    assert "I(p + r)" in line and "J(2*p + r)" in line


def test_inconsistent_shapes_name_variable_and_both_extents():
    k = ucf.compile("O(p) = I(p+r) * F(r)")
    with pytest.raises(ucf.UcfError) as e:
        k(I=np.ones(7), F=np.ones(3), shapes={"r": 5})
    msg = str(e.value)
    assert names(msg, "r") and names(msg, "3") and names(msg, "5")


def test_inconsistent_plain_accesses_name_variable_and_both_extents():
    k = ucf.compile("O(p) = I(p+r) * F(r) * G(r)")
    with pytest.raises(ucf.ShapeError) as e:
        k(I=np.ones(7), F=np.ones(3), G=np.ones(4))
    msg = str(e.value)
    assert names(msg, "r") and names(msg, "3") and names(msg, "4")


def test_out_with_wrong_order_is_a_shape_error():
    k = ucf.compile("O(p) = I(p+r) * F(r)")
    with pytest.raises(ucf.ShapeError):
        k(I=np.ones(7), F=np.ones(3), out=np.zeros((5, 1)))


@pytest.mark.parametrize(
    "expr,n,kf,extent",
    [
        ("O(p) = I(p+r) * F(r)", 2, 5, -2),
        ("O(p) = I(2*p+r-1) * F(r)", 1, 6, -1),
        ("O(p) = I(p+2*r) * F(r)", 3, 3, -1),
    ],
)
def test_negative_inferred_extent_names_the_variable(expr, n, kf, extent):
    k = ucf.compile(expr)
    with pytest.raises(ucf.UcfError) as e:
        k(I=np.ones(n), F=np.ones(kf))
    msg = str(e.value)
    assert names(msg, "p") and str(extent) in msg


def test_negative_extent_in_shapes_is_a_ucf_error():
    k = ucf.compile("O(p) = I(p+r) * F(r)")
    with pytest.raises(ucf.UcfError) as e:
        k(I=np.ones(7), F=np.ones(3), shapes={"p": -1})
    assert names(str(e.value), "p") and "-1" in str(e.value)


@pytest.mark.parametrize("schedule,var", [("reorder(k,x)", "x"), ("reorder(x,k)", "k")])
def test_bound_on_a_narrowed_window_loop_says_so(schedule, var):
    """The innermost variable of an affine index iterates only where the index is inside
    its operand; bound needs the whole dimension, and the message says which it is."""
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile("O(x) = P(x+k) * G(k)", schedule=f"{schedule}; bound({var},vb,4,MaxExact)")
    msg = str(e.value)
    assert "narrowed" in msg and "positions" not in msg
    assert names(msg.split(":", 1)[1], var)


def cin_extent(cin: str, v: str) -> sympy.Expr:
    """The formula ``k.cin`` gives for ``|v|``, with ``X.shape[m]`` as symbols ``X_m``."""
    lines = [x for x in cin.splitlines() if f"|{v}| =" in x]
    assert len(lines) == 1, cin
    m = re.search(rf"\|{v}\| = (.*) \(inferred from (.*)\)", lines[0])
    assert m, lines[0]
    text = re.sub(r"([A-Za-z_]\w*)\.shape\[(\d+)\]", r"\1_\2", m.group(1))
    return sympy.sympify(text, locals={"floor": sympy.floor})


@pytest.mark.parametrize("expr,stride,pad,dil", CONV_1D)
def test_cin_explains_the_inferred_extent(expr, stride, pad, dil):
    """The formula in ``k.cin`` evaluates to the extent the call uses."""
    k = ucf.compile(expr)
    assert "inferred from I(" in k.cin
    formula = cin_extent(k.cin, "p")
    assert formula.free_symbols == {sympy.Symbol("I_0"), sympy.Symbol("F_0")}
    for n, kf in [(9, 3), (8, 3), (7, 2), (6, 1), (10, 4)]:
        value = formula.subs({"I_0": n, "F_0": kf})
        assert int(value) == conv_output_size(n, kf, stride, pad, dil)
        assert dense(k(I=np.ones(n), F=np.ones(kf))).shape == (int(value),)


def test_cin_explains_2d_extents():
    k = ucf.compile("O(n,m,p,q) = I(n,c,2*p+r-1,q+2*s) * F(m,c,r,s)")
    p, q = cin_extent(k.cin, "p"), cin_extent(k.cin, "q")
    sizes = {"I_2": 9, "I_3": 10, "F_2": 3, "F_3": 2}
    assert int(p.subs(sizes)) == conv_output_size(9, 3, 2, 1, 1)
    assert int(q.subs(sizes)) == conv_output_size(10, 2, 1, 0, 2)
    assert "|n|" not in k.cin and "|c|" not in k.cin  # plain indices are not inferred


# -------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "expr,line,column",
    [
        ("O(p) = I(p*r) * F(r)", 1, 10),
        ("O(p) = I(p*p) * F(r)", 1, 10),
        ("O(p,q) = I(p, q+s*r) * F(r,s)", 1, 17),
        ("O(p) =\n  I(p*r) * F(r)", 2, 5),
    ],
)
def test_non_affine_index_is_a_parse_error_with_position(expr, line, column):
    with pytest.raises(ucf.ParseError) as e:
        ucf.compile(expr)
    assert (e.value.line, e.value.column) == (line, column)
    assert "affine" in str(e.value)
    assert f"line {line}, column {column}" in str(e.value)


def test_non_affine_error_quotes_the_index_faithfully():
    with pytest.raises(ucf.ParseError) as e:
        ucf.compile("O(p) = I(r*(p+1)) * F(r)")
    assert "r * p + 1" not in str(e.value)
    assert re.search(r"r ?\* ?\(p ?\+ ?1\)", str(e.value))


@pytest.mark.parametrize(
    "expr,canonical",
    [
        ("O(p) = I(2*(p+r)) * F(r)", "I(2*p + 2*r)"),
        ("O(p) = I(p*2+r) * F(r)", "I(2*p + r)"),
        ("O(p) = I(2*3*p+r-1) * F(r)", "I(6*p + r - 1)"),
    ],
)
def test_affine_forms_are_normalised(expr, canonical):
    assert canonical in ucf.compile(expr).cin


@pytest.mark.parametrize("expr", ["O(p+1) = I(p+r) * F(r)", "O(2*p) = I(p) * F(p)"])
def test_affine_output_index_is_unsupported(expr):
    with pytest.raises(ucf.UnsupportedError, match="output"):
        ucf.compile(expr)


@pytest.mark.parametrize(
    "expr,fmt,acc",
    [
        (
            "O(p,q) = I(p+r, q+s) * F(r,s)",
            "coo",
            [
                ("I", [({"p": 1, "r": 1}, 0), ({"q": 1, "s": 1}, 0)]),
                ("F", [({"r": 1}, 0), ({"s": 1}, 0)]),
            ],
        ),
        (
            "O(p,q) = I(p, q+s) * F(s)",
            "coo",
            [("I", [({"p": 1}, 0), ({"q": 1, "s": 1}, 0)]), ("F", [({"s": 1}, 0)])],
        ),
        (
            "O(p,q) = I(p+r, q) * F(r)",
            "CS",
            [("I", [({"p": 1, "r": 1}, 0), ({"q": 1}, 0)]), ("F", [({"r": 1}, 0)])],
        ),
    ],
)
def test_affine_index_on_coo_or_singleton_reads_a_searchable_copy(expr, fmt, acc):
    """A singleton level (or the non-unique level above one) cannot be searched for an
    affine index, so the kernel reads a copy whose levels can (``LevelKind.searched``)."""
    k = ucf.compile(expr, formats={"I": fmt})
    assert "whose levels cannot be searched" in k.cin
    rng = rng_for("searchable", expr)
    x = rand_sparse(rng, (6, 5), 0.5)
    w = rand_sparse(rng, (2, 2) if "r,s" in expr else (2,), 1.0)
    with pytest.warns(ucf.ConversionWarning):
        got = dense(k(I=ucf.from_numpy(x, format=fmt), F=w))
    ext = {"p": got.shape[0], "q": got.shape[1], "r": 2, "s": 2}
    ext = {v: n for v, n in ext.items() if v in expr}
    assert_exact(got, affine_einsum(["p", "q"], acc, {"I": x, "F": w}, ext))


def test_decreasing_index_on_compressed_level_is_unsupported():
    with pytest.raises(ucf.UnsupportedError) as e:
        ucf.compile("O(p) = I(p-r) * F(r)", formats={"I": "C"}, schedule="reorder(p,r)")
    assert "p - r" in str(e.value) and names(str(e.value), "r")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fi,schedule", [("U", None), ("U", "reorder(r,p)"), ("C", "reorder(r,p)")])
def test_decreasing_index_where_supported(target, fi, schedule):
    """``I(p-r)`` on a dense level, or compressed with ``p`` innermost (increasing there)."""
    k = ucf.compile("O(p) = I(p-r+2) * F(r)", formats={"I": fi}, schedule=schedule, target=target)
    rng = rng_for("decreasing", fi)
    x = rand_sparse(rng, (8,), 0.6, empty_rows=0)
    w = np.array([1.0, -2.0, 3.0])
    acc = [("I", [({"p": 1, "r": -1}, 2)]), ("F", [({"r": 1}, 0)])]
    ext = {"r": 3, "p": infer_extent({"p": 1, "r": -1}, 2, "p", 8, {"r": 3})}
    assert_exact(
        k(**pack({"I": x, "F": w}, {"I": fi})), affine_einsum(["p"], acc, {"I": x, "F": w}, ext)
    )


# ------------------------------------------------------------------ hypothesis


@st.composite
def affine_cases(draw, dims: int, scheduled: bool):
    """A random correlation ``O(p[,q]) = I(a*p + b*r + c[, ...]) * F(r[,s])``."""
    out_vars, red_vars = "pq"[:dims], "rs"[:dims]
    indices = []
    for o, r in zip(out_vars, red_vars, strict=True):
        a, b, c = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(-2, 2)))
        indices.append(({o: a, r: b}, c))
    fi = "".join(draw(st.sampled_from("UC")) for _ in range(dims))
    ff = "".join(draw(st.sampled_from("UC")) for _ in range(dims))
    fo = "".join(draw(st.sampled_from("UC")) for _ in range(dims))
    ishape = tuple(draw(st.integers(1, 7)) for _ in range(dims))
    fshape = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    seed = draw(st.integers(0, 2**16))
    density = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    explicit = draw(st.booleans())
    shapes = {o: draw(st.integers(0, 6)) for o in out_vars} if explicit else None
    if scheduled:
        # Legal orders: a sparse F is walked in its level order (r above s); a
        # sparse output is appended in level order, outside every reduction.
        def legal(order):
            if "C" in ff and order.index(red_vars[0]) > order.index(red_vars[-1]):
                return False
            return "C" not in fo or list(order[:dims]) == list(out_vars)

        order = draw(st.permutations(out_vars + red_vars).filter(legal))
        schedule = f"reorder({','.join(order)})"
        if draw(st.booleans()) and "C" not in fo and order[0] in out_vars:
            schedule += f"; parallelize({order[0]},CPUThread,NoRaces)"
    else:
        schedule = draw(st.sampled_from([None, ""]))
    return out_vars, red_vars, indices, fi, ff, fo, ishape, fshape, seed, density, shapes, schedule


def check_random_case(case) -> None:
    out_vars, red_vars, indices, fi, ff, fo, ishape, fshape, seed, density, shapes, sched = case
    lhs = ",".join(out_vars)
    idx_text = ", ".join(
        " + ".join(f"{c}*{v}" for v, c in co.items()) + f" + {const}" for co, const in indices
    )
    expr = f"O({lhs}) = I({idx_text}) * F({','.join(red_vars)})"
    rng = np.random.default_rng(seed)
    x = rand_sparse(rng, ishape, density, empty_rows=1)
    w = rand_sparse(rng, fshape, 0.8, empty_rows=0)
    accesses = [("I", indices), ("F", [({r: 1}, 0) for r in red_vars])]
    ext = dict(zip(red_vars, fshape, strict=True))
    if shapes:
        ext.update(shapes)
    else:
        for m, (co, const) in enumerate(indices):
            o = out_vars[m]
            ext[o] = infer_extent(co, const, o, ishape[m], ext)
    formats = {"I": fi, "F": ff, "O": fo}
    k = ucf.compile(expr, formats=formats, schedule=sched)
    ops = pack({"I": x, "F": w}, formats)
    if any(n < 0 for n in ext.values()):
        with pytest.raises(ucf.ShapeError):
            k(shapes=shapes, **ops)
        return
    expected = affine_einsum(out_vars, accesses, {"I": x, "F": w}, ext)
    assert_exact(k(shapes=shapes, **ops), expected)


#: Loop orders are drawn by rejection (a filter on permutations).
SKIPS = [HealthCheck.too_slow, HealthCheck.filter_too_much]


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("scheduled", [False, True], ids=["default", "reorder"])
@settings(max_examples=20, suppress_health_check=SKIPS)
@given(data=st.data())
def test_random_affine_accesses(dims, scheduled, data):
    check_random_case(data.draw(affine_cases(dims, scheduled)))


@pytest.mark.slow
@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("scheduled", [False, True], ids=["default", "reorder"])
@settings(EXPLORE, max_examples=200, suppress_health_check=SKIPS)
@given(data=st.data())
def test_many_random_affine_accesses(dims, scheduled, data):
    check_random_case(data.draw(affine_cases(dims, scheduled)))


def test_brute_force_reference_agrees_with_loops():
    """The vectorised reference against literal loops, on strided/padded/dilated 2-D accesses."""
    rng = rng_for("reference")
    x = rand_sparse(rng, (5, 6), 0.6)
    w = rand_sparse(rng, (2, 3), 0.8, empty_rows=0)
    acc = [
        ("I", [({"p": 2, "r": 1}, -1), ({"q": 1, "s": 2}, -2)]),
        ("F", [({"r": 1}, 0), ({"s": 1}, 0)]),
    ]
    ext = {"p": 4, "q": 5, "r": 2, "s": 3}
    ops = {"I": x, "F": w}
    got = affine_einsum(["q", "p"], acc, ops, ext)
    np.testing.assert_array_equal(got, affine_einsum_loops(["q", "p"], acc, ops, ext))
    assert got.shape == (5, 4)


# ------------------------------------------------- regressions (bugs found by these tests)


def run_isolated(code: str) -> list:
    """Run ``code`` (printing a JSON value) in a fresh interpreter, so a crash fails one test."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"crashed with exit code {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


SERIAL_CC = """
import json, numpy as np, ucf
x = np.array([[1.0, 0, 3], [0, 2, 0], [4, 0, 5]])
k = ucf.compile("O(p,q) = I(p+r, q+s) * F(r,s)", formats={"I": "CC", "O": %r}, schedule=%r,
                target=%r)
print(json.dumps(k(I=ucf.from_numpy(x, format="CC"), F=np.ones((2, 2))).to_numpy().tolist()))
"""


@pytest.mark.parametrize(
    "fo,schedule,target",
    [
        ("UU", "", "llvm"),
        pytest.param("UU", "", "c", marks=needs_cc),
        ("UU", "reorder(q,r,p,s); parallelize(q,CPUThread,NoRaces)", "llvm"),
        ("CU", None, "llvm"),  # a sparse output keeps the default schedule serial
    ],
)
def test_serial_2d_affine_on_two_compressed_levels(fo, schedule, target):
    got = run_isolated(SERIAL_CC % (fo, schedule, target))
    expected = conv(np.array([[[[1.0, 0, 3], [0, 2, 0], [4, 0, 5]]]]), np.ones((1, 1, 2, 2)))
    assert got == expected[0, 0].tolist() == [[3.0, 5.0], [6.0, 7.0]]
