"""TeSA attributes and their propagation through programs (issue 15, items 1-3).

Expected masks come from the papers' examples (SparTA Table 2 and §3.2, SparGen
Fig. 4) worked by hand, from numpy (what a function gives at 0, what a program
computes), or from the other method (scrambling against the exact rules).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import EXPLORE
from ucf.lang.functions import FUNCTIONS

M = ucf.TeSA.from_mask


def masks(result: dict[str, ucf.TeSA]) -> dict[str, list]:
    return {name: attr.mask.astype(int).tolist() for name, attr in result.items()}


# --- ucf.TeSA -----------------------------------------------------------------------------


def test_tesa_constructors_and_properties():
    bits = np.array([[4, 4, 4], [0, 0, 0], [4, 4, 8]])  # SparTA Fig. 3
    t = ucf.TeSA(bits)
    assert t.mask.tolist() == (bits > 0).tolist()
    assert t.bits.tolist() == bits.tolist()
    assert t.sparsity == pytest.approx(3 / 9)
    assert ucf.TeSA.from_mask(bits > 0, bits=8).bits.max() == 8
    d = ucf.TeSA.dense((2, 3), bits=16)
    assert d.shape == (2, 3) and d.sparsity == 0 and (d.bits == 16).all()
    with pytest.raises(ValueError):
        t.bits[0, 0] = 1  # read-only: propagation never changes an attribute in place


@pytest.mark.parametrize(
    "make",
    [
        lambda: ucf.TeSA(np.ones((2, 2), dtype=bool)),
        lambda: ucf.TeSA(np.array([1.5, 2.0])),
        lambda: ucf.TeSA(np.array([-1, 8])),
        lambda: ucf.TeSA.from_mask(np.ones(3, dtype=bool), bits=0),
        lambda: ucf.TeSA(np.ones((4, 4), dtype=int), block=(2,)),
    ],
)
def test_tesa_refuses_bad_widths(make):
    with pytest.raises(ucf.OperandError):
        make()


# --- ucf.program --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, kwargs, error, names",
    [
        ("T(i) = a(i); T(i) = b(i)", {"shapes": {"a": (2,), "b": (2,)}}, ucf.ProgramError, "T"),
        ("U(i) = T(i); T(i) = a(i)", {"shapes": {"a": (2,)}}, ucf.ProgramError, "T"),
        ("T(i) = a(i) * b(i)", {"shapes": {"a": (2,)}}, ucf.ProgramError, "b"),
        ("T(i) = a(i) * b(i)", {"shapes": {"a": (2,), "b": (3,)}}, ucf.ShapeError, "b"),
        ("T(i) = a(i)", {"shapes": {"a": (2,)}, "outputs": ["Z"]}, ucf.ProgramError, "Z"),
        ("T(i) = a(i)", {"shapes": {"a": (2,), "T": (3,)}}, ucf.ShapeError, "T"),
        ("T(i) = a(i)", {"shapes": {"a": (2,)}, "attrs": {"q": M([1])}}, ucf.ProgramError, "q"),
        ("T(i) = a(i,j)", {"shapes": {"a": (2,)}}, ucf.ShapeError, "a"),
        ("T(i) += a(i)", {"shapes": {"a": (2,)}}, ucf.UnsupportedError, "T"),
        ("T(i) = a(i) *", {"shapes": {"a": (2,)}}, ucf.ParseError, ""),
    ],
)
def test_program_errors_name_the_tensor(text, kwargs, error, names):
    with pytest.raises(error, match=names):
        ucf.program(text, **kwargs)


def test_program_infers_intermediates_and_outputs():
    p = ucf.program(
        "T(i,j) = X(i,k) * W(k,j)\nU(i,j) = relu(T(i,j)); Y(i) = U(i,j) * v(j)",
        shapes={"X": (3, 4), "W": (4, 5), "v": (5,)},
    )
    assert p.shapes["T"] == (3, 5) and p.shapes["U"] == (3, 5) and p.shapes["Y"] == (3,)
    assert p.outputs == ("Y",) and set(p.inputs) == {"X", "W", "v"}
    assert all(a.sparsity == 0 for a in p.attrs.values())


# --- SparTA Table 2 -----------------------------------------------------------------------

X_MASK, Y_MASK = [0, 0, 1, 1], [0, 1, 0, 1]


@pytest.mark.parametrize("fn", [f for f in FUNCTIONS.values() if f.arity == 1])
def test_table2_unary(fn):
    """A function keeps a pruned element pruned exactly when numpy says it maps 0 to 0."""
    numpy = {
        "relu": lambda x: np.maximum(x, 0),
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "erf": scipy.special.erf,
        "gelu": lambda x: x / 2 * (1 + scipy.special.erf(x / np.sqrt(2))),
        "rsqrt": lambda x: np.inf,  # 1 / sqrt(0)
    }
    at_zero = numpy.get(fn.name, getattr(np, fn.name, None))(np.float64(0))
    p = ucf.program(f"Z(i) = {fn.name}(X(i))", attrs={"X": M(X_MASK)})
    z = p.propagate()["Z"].mask.tolist()
    assert z == ([False, False, True, True] if at_zero == 0 else [True] * 4)


@pytest.mark.parametrize(
    "op, z",
    [
        ("+", [0, 1, 1, 1]),  # pruned only where both are
        ("-", [0, 1, 1, 1]),
        ("*", [0, 0, 0, 1]),  # pruned where either is
        ("/", [0, 0, 0, 1]),
    ],
)
def test_table2_binary(op, z):
    p = ucf.program(f"Z(i) = X(i) {op} Y(i)", attrs={"X": M(X_MASK), "Y": M(Y_MASK)})
    assert p.propagate()["Z"].mask.astype(int).tolist() == z


@pytest.mark.parametrize("fn", ["max", "min"])
def test_binary_functions_keep_the_union(fn):
    p = ucf.program(f"Z(i) = {fn}(X(i), Y(i))", attrs={"X": M(X_MASK), "Y": M(Y_MASK)})
    assert p.propagate()["Z"].mask.astype(int).tolist() == [0, 1, 1, 1]


# --- A @ X = Y with 2x2 masks ---------------------------------------------------------------

MATMUL = "Y(i,j) = A(i,k) * X(k,j)"


@pytest.mark.parametrize("method", ["exact", "scramble"])
def test_matmul_forward_prunes_output_rows(method):
    p = ucf.program(MATMUL, shapes={"X": (2, 2)}, attrs={"A": M([[1, 1], [0, 0]])})
    r = masks(p.propagate(method=method))
    assert r["Y"] == [[1, 1], [0, 0]] and r["X"] == [[1, 1], [1, 1]]


@pytest.mark.parametrize("method", ["exact", "scramble"])
def test_matmul_backward_prunes_input_rows(method):
    p = ucf.program(MATMUL, shapes={"X": (2, 2)}, attrs={"A": M([[0, 1], [0, 1]])})
    r = masks(p.propagate(method=method))
    assert r["X"] == [[0, 0], [1, 1]] and r["Y"] == [[1, 1], [1, 1]]


@pytest.mark.parametrize("method", ["exact", "scramble"])
def test_matmul_pruned_output_row_prunes_a(method):
    attrs = {"A": M([[0, 1], [0, 1]]), "Y": M([[0, 0], [1, 1]])}
    r = masks(ucf.program(MATMUL, shapes={"X": (2, 2)}, attrs=attrs).propagate(method=method))
    assert r["A"] == [[0, 0], [0, 1]] and r["X"] == [[0, 0], [1, 1]]
    assert r["Y"] == [[0, 0], [1, 1]]


# --- SparGen Fig. 4: W1 x W2 = W3 -------------------------------------------------------------

CHAIN = "W3(i,j) = W1(i,k) * W2(k,j)"


def dense4(*pruned_rows, cols=()):
    m = np.ones((4, 4), dtype=bool)
    m[list(pruned_rows), :] = False
    m[:, list(cols)] = False
    return M(m)


def test_fig4a_pruned_row_and_column_of_w2():
    """W2's third row and second column pruned: W3's second column and W1's third column
    follow."""
    p = ucf.program(CHAIN, shapes={"W1": (4, 4)}, attrs={"W2": dense4(2, cols=[1])})
    r = p.propagate()
    assert (r["W3"].mask == dense4(cols=[1]).mask).all()
    assert (r["W1"].mask == dense4(cols=[2]).mask).all()


def test_fig4b_output_to_input():
    """A pruned column of W3 prunes W2's column; a single pruned W3[0,0] prunes nothing."""
    p = ucf.program(CHAIN, shapes={"W1": (4, 4), "W2": (4, 4)}, attrs={"W3": dense4(cols=[3])})
    r = p.propagate()
    assert (r["W2"].mask == dense4(cols=[3]).mask).all() and r["W1"].sparsity == 0
    one = np.ones((4, 4), dtype=bool)
    one[0, 0] = False
    p = ucf.program(CHAIN, shapes={"W1": (4, 4), "W2": (4, 4)}, attrs={"W3": M(one)})
    r = p.propagate()
    assert r["W1"].sparsity == 0 and r["W2"].sparsity == 0 and r["W3"] == M(one)


def test_fig4c_conflicts_union_the_pruned_sets_and_take_the_lowest_width():
    """W1's pruned row reaches W3, which carries its own pruned column: W3 ends with both."""
    w3 = np.where(dense4(cols=[0]).mask, 8, 0)
    w3[3, 3] = 4
    attrs = {"W1": dense4(1), "W3": ucf.TeSA(w3)}
    r = ucf.program(CHAIN, shapes={"W2": (4, 4)}, attrs=attrs).propagate()
    assert (r["W3"].mask == dense4(1, cols=[0]).mask).all()
    assert r["W3"].bits[3, 3] == 4 and r["W3"].bits[2, 2] == 8
    assert (r["W2"].mask == dense4(cols=[0]).mask).all()


def test_widths_pass_through_relu_both_ways():
    attrs = {"T": ucf.TeSA(np.array([[8, 8], [32, 0]])), "U": ucf.TeSA(np.array([[4, 32]] * 2))}
    r = ucf.program("U(i,j) = relu(T(j,i))", attrs=attrs, outputs=["U"]).propagate()
    assert r["U"].bits.tolist() == [[4, 32], [4, 0]]
    assert r["T"].bits.tolist() == [[4, 4], [32, 0]]


# --- Y = A X + B (SparTA §3.2) -----------------------------------------------------------

AFFINE = "Y(i,j) = A(i,k) * X(k,j) + B(i,j)"
SHAPES = {"A": (3, 4), "X": (4, 2), "B": (3, 2)}


def test_axb_pruned_output_row():
    y = np.ones((3, 2), dtype=bool)
    y[1] = False
    r = ucf.program(AFFINE, shapes=SHAPES, attrs={"Y": M(y)}).propagate()
    a = np.ones((3, 4), dtype=bool)
    a[1] = False
    assert (r["A"].mask == a).all() and (r["B"].mask == y).all() and r["X"].sparsity == 0


def test_axb_pruned_column_of_a():
    a = np.ones((3, 4), dtype=bool)
    a[:, 2] = False
    r = ucf.program(AFFINE, shapes=SHAPES, attrs={"A": M(a)}).propagate()
    x = np.ones((4, 2), dtype=bool)
    x[2] = False
    assert (r["X"].mask == x).all() and r["Y"].sparsity == 0 and r["B"].sparsity == 0


# --- the fixpoint: order independence, idempotence, soundness -------------------------------

MLP = """
T(t,h) = X(t,d) * W1(d,h)
U(t,h) = relu(T(t,h))
V(t,h) = U(t,h) * g(h)
Y(t,e) = V(t,h) * W2(h,e) + B(t,e)
Z(t,e) = Y(t,e) * S(t,e)
"""
MLP_SHAPES = {"X": (6, 8), "W1": (8, 10), "g": (10,), "W2": (10, 4), "B": (6, 4), "S": (6, 4)}


def mlp_attrs(seed: int) -> dict[str, ucf.TeSA]:
    """Row, column, block and fine-grained pruning, so that every rule has work."""
    rng = np.random.default_rng(seed)
    w1 = np.kron(rng.random((4, 5)) < 0.5, np.ones((2, 2), dtype=bool))
    w1[:, 3] = False
    w2 = rng.random((10, 4)) < 0.6
    w2[:, 1] = False
    b = rng.random((6, 4)) < 0.5
    s = np.ones((6, 4), dtype=bool)
    s[4] = False
    g = rng.random(10) < 0.8
    bits = np.where(rng.random((8, 10)) < 0.3, 8, 32)
    return {"W1": ucf.TeSA(np.where(w1, bits, 0)), "W2": M(w2), "B": M(b), "S": M(s), "g": M(g)}


def run_mlp(values: dict[str, np.ndarray], masks: dict[str, np.ndarray]) -> np.ndarray:
    """The program in numpy, each tensor zeroed where ``masks`` prunes it."""
    v = {k: np.where(masks[k], x, 0) if k in masks else x for k, x in values.items()}

    def keep(name, x):
        return np.where(masks[name], x, 0) if name in masks else x

    t = keep("T", v["X"] @ v["W1"])
    u = keep("U", np.maximum(t, 0))
    w = keep("V", u * v["g"])
    y = keep("Y", w @ v["W2"] + v["B"])
    return keep("Z", y * v["S"])


def test_order_does_not_matter_and_propagating_again_changes_nothing():
    p = ucf.program(MLP, shapes=MLP_SHAPES, attrs=mlp_attrs(0))
    reference = p.propagate()
    for shuffle in range(4):
        q = ucf.program(MLP, shapes=MLP_SHAPES, attrs=mlp_attrs(0))
        assert q.propagate(shuffle=shuffle) == reference
    assert p.propagate() == reference


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_soundness_against_numpy(seed):
    """The outputs are the same with and without the propagated pruning, on data that
    honours the initial masks, and propagation did prune."""
    attrs = mlp_attrs(seed)
    p = ucf.program(MLP, shapes=MLP_SHAPES, attrs=attrs)
    result = p.propagate()
    assert any(result[k].sparsity > (attrs[k].sparsity if k in attrs else 0) for k in result)
    rng = np.random.default_rng(100 + seed)
    for _ in range(3):
        values = {k: rng.standard_normal(shape) for k, shape in MLP_SHAPES.items()}
        before = run_mlp(values, {k: a.mask for k, a in attrs.items()})
        after = run_mlp(values, {k: a.mask for k, a in result.items()})
        np.testing.assert_allclose(after, before, rtol=1e-12, atol=1e-12)


# --- scrambling against the exact rules ---------------------------------------------------

VARS = "ijk"
EXTENT = {"i": 2, "j": 3, "k": 2}


@st.composite
def einsums(draw):
    """A random statement of two or three operands (a product, or a sum of a product and
    a third operand), the last maybe under a function, with random masks."""
    names = ["A", "B", "C"][: draw(st.integers(2, 3))]
    indices = {
        n: draw(st.lists(st.sampled_from(VARS), min_size=1, max_size=2, unique=True)) for n in names
    }
    out = draw(st.lists(st.sampled_from(VARS), max_size=2, unique=True))
    terms = [f"{n}({','.join(indices[n])})" for n in names]
    fn = draw(st.sampled_from(["", "relu", "abs", "tanh", "exp"]))
    terms[-1] = f"{fn}({terms[-1]})" if fn else terms[-1]
    rhs = (
        " * ".join(terms)
        if draw(st.booleans())
        else f"{terms[0]} * {terms[1]} + " + (terms[2] if len(terms) > 2 else terms[0])
    )
    attrs = {}
    for n in names:
        shape = tuple(EXTENT[v] for v in indices[n])
        attrs[n] = M(
            np.array(
                draw(
                    st.lists(
                        st.booleans(), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))
                    )
                )
            ).reshape(shape)
        )
    used = {v for n in names for v in indices[n]}
    out = [v for v in out if v in used]
    return f"Z({','.join(out)}) = {rhs}", attrs


def scrambling_agrees(case) -> None:
    text, attrs = case
    exact = ucf.program(text, attrs=attrs).propagate()
    scrambled = ucf.program(text, attrs=attrs).propagate(method="scramble", samples=64)
    assert masks(scrambled) == masks(exact), text


@settings(max_examples=6)
@given(einsums())
def test_scrambling_agrees_with_the_exact_rules(case):
    scrambling_agrees(case)


@pytest.mark.slow
@settings(EXPLORE, max_examples=60)
@given(einsums())
def test_scrambling_agrees_with_the_exact_rules_long(case):
    scrambling_agrees(case)


# --- backward through affine indices ------------------------------------------------------


def test_backward_through_a_strided_convolution_against_loops():
    """An input pixel is needed exactly where some kept output pixel reads it with a kept
    filter tap: checked against a loop over every (output, tap) pair."""
    rng = np.random.default_rng(41)
    n, c, m, h, w, r, s = 1, 2, 3, 9, 7, 3, 2
    p, q = (h - r) // 2 + 1, (w - s) // 2 + 1
    out = rng.random((n, m, p, q)) < 0.3
    filt = rng.random((m, c, r, s)) < 0.4
    prog = ucf.program(
        "O(n,m,p,q) = I(n,c,2*p+r,2*q+s) * F(m,c,r,s)",
        shapes={"I": (n, c, h, w)},
        attrs={"O": M(out), "F": M(filt)},
    )
    need = np.zeros((n, c, h, w), dtype=bool)
    for b, k, y, x, ch, dy, dx in np.ndindex(n, m, p, q, c, r, s):
        if out[b, k, y, x] and filt[k, ch, dy, dx]:
            need[b, ch, 2 * y + dy, 2 * x + dx] = True
    got = prog.propagate()["I"].mask
    assert need.any() and not need.all()
    np.testing.assert_array_equal(got, need)


@pytest.mark.parametrize(
    "text, shapes",
    [
        ("O(p) = I(p+r) * F(r)", {"I": (8,), "F": (3,), "O": (6,)}),
        ("O(p) = I(2*p+r+1) * F(r)", {"I": (9,), "F": (2,), "O": (4,)}),
        ("O(p,q) = relu(I(p+r,q) * F(r)) + B(p,q)", {"I": (6, 3), "F": (2,), "B": (5, 3)}),
        ("O(i) = I(i+j) * F(j) * G(i)", {"I": (7,), "F": (3,), "G": (5,)}),
        ("O(i,j) = I(i,i+j) * F(j)", {"I": (4, 6), "F": (3,), "O": (4, 3)}),
    ],
)
def test_affine_backward_agrees_with_scrambling(text, shapes):
    rng = np.random.default_rng(len(text))
    attrs = {k: M(rng.random(v) < 0.4) for k, v in shapes.items() if k != "I"}
    exact = ucf.program(text, shapes=shapes, attrs=attrs).propagate()
    scrambled = ucf.program(text, shapes=shapes, attrs=attrs).propagate(method="scramble")
    assert not exact["I"].mask.all()  # something was pruned through the affine index
    assert masks(scrambled) == masks(exact), text


@pytest.mark.parametrize("text", ["O(i) = I(i,i) * F(i)", "O(i) = I(i+j,i+j) * F(j)"])
def test_an_index_without_a_pivot_prunes_nothing_backward(text):
    attrs = {"F": M(np.array([True, False, True])), "O": M(np.array([True, True, False]))}
    got = ucf.program(text, shapes={"I": (3, 3)}, attrs=attrs).propagate()
    assert got["I"].mask.all()


def test_a_summed_variable_only_affine_indices_reach_prunes_nothing_backward():
    """r's extent is not a tensor's mode in O(p) = I(p+r) * F(r+1): no demand statement
    can range over it, so I keeps everything (it raised a KeyError)."""
    attrs = {"O": M(np.array([True, False]))}
    p = ucf.program("O(p) = I(p+r) * F(r+1)", shapes={"I": (4,), "O": (2,), "F": (3,)}, attrs=attrs)
    assert p.propagate()["I"].mask.all()
