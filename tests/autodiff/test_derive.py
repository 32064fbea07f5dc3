"""Derived gradients (ucf.autodiff) against torch's autograd.

The reference evaluates a statement with torch, element by element over a grid
of all its index variables (broadcast, then summed where the statement sums),
so torch differentiates it on its own; ucf's gradient comes from the statement
it derives and compiles. A sparse operand's reference is the dense masked
computation, whose gradient is compared at the operand's stored positions.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import needs_cc
from ucf.autodiff import Backward, derive
from ucf.format.format import parse_format
from ucf.lang.ast import Access, Binary, Call, Literal, Neg, Sum, accesses
from ucf.lang.functions import FUNCTIONS
from ucf.lang.parser import parse_statement
from ucf.tesa import nm_split

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _one_thread():
    """Kernels on one thread: these tests are about gradients, and two test workers on two
    cores make threads that wait for each other slow every small call."""
    ucf.set_num_threads(1)


TORCH_FN = {
    "relu": torch.relu,
    "abs": torch.abs,
    "sign": torch.sign,
    "sqrt": torch.sqrt,
    "sin": torch.sin,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "cos": torch.cos,
    "sigmoid": torch.sigmoid,
    "gelu": torch.nn.functional.gelu,
    "erf": torch.erf,
    "rsqrt": torch.rsqrt,
    "max": torch.maximum,
    "min": torch.minimum,
}


def torch_eval(stmt, tensors, extents):
    """The statement's output, computed by torch over the grid of every variable."""
    names = sorted({v for a in accesses(stmt.rhs) for i in a.indices for v in i.variables})
    names += [i.single_variable for i in stmt.lhs.indices if i.single_variable not in names]
    axis = {v: k for k, v in enumerate(names)}

    def spread(t, variables):
        shape = [1] * len(names)
        for v in variables:
            shape[axis[v]] = extents[v]
        order = sorted(range(len(variables)), key=lambda k: axis[variables[k]])
        return t.permute(*order).reshape(shape) if variables else t.reshape(shape)

    def go(e):
        if isinstance(e, Access):
            return spread(tensors[e.tensor], [i.single_variable for i in e.indices])
        if isinstance(e, Literal):
            return torch.tensor(float(e.value), dtype=torch.float64)
        if isinstance(e, Neg):
            return -go(e.operand)
        if isinstance(e, Binary):
            a, b = go(e.left), go(e.right)
            return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[e.op]
        if isinstance(e, Call):
            return TORCH_FN[e.fn](*(go(x) for x in e.args))
        assert isinstance(e, Sum)
        body = go(e.body)
        shape = list(body.shape) + [1] * (len(names) - body.dim())
        body = body.reshape(shape)
        for v in e.vars:  # a variable the body does not read still counts |v| times
            shape[axis[v]] = extents[v]
        return body.expand(shape).sum(dim=[axis[v] for v in e.vars], keepdim=True)

    out = [i.single_variable for i in stmt.lhs.indices]
    value = go(stmt.rhs)  # summed variables have been summed into axes of size 1
    value = value.expand([extents[v] if v in out else 1 for v in names])
    summed = [axis[v] for v in names if v not in out]
    value = value.sum(dim=summed) if summed else value
    kept = [v for v in names if v in out]
    return value.permute(*[kept.index(v) for v in out]) if out else value


def check_against_torch(text, shapes, formats=None, seed=0, target="llvm", positive=()):
    """Every operand's derived gradient against torch's, at its stored positions."""
    stmt = parse_statement(text)
    read = {a.tensor for a in accesses(stmt.rhs)}
    shapes = {n: s for n, s in shapes.items() if n in read}
    rng = np.random.default_rng(seed)
    formats = {n: parse_format(f, order=len(shapes[n])) for n, f in (formats or {}).items()}
    operands, masked = {}, {}
    for n, shape in shapes.items():
        a = rng.standard_normal(shape)
        if n in positive:
            a = np.abs(a) + 0.5
        if n in formats:
            kept = rng.random(shape) < 0.5
            if str(formats[n]).startswith("UUF2"):  # nm(2,4): at most 2 of every 4
                kept = nm_split(kept, 2, 4)[0]
            a[~kept] = 0
        t = ucf.from_numpy(a, format=formats.get(n, "dense"))
        operands[n] = t
        masked[n] = torch.tensor(t.to_numpy(), requires_grad=True)
    extents = {}
    for a in [stmt.lhs, *accesses(stmt.rhs)]:
        for m, i in enumerate(a.indices):
            if a.tensor in shapes:
                extents[i.single_variable] = shapes[a.tensor][m]
    want = torch_eval(stmt, masked, extents)
    grad = torch.tensor(rng.standard_normal(tuple(want.shape)))
    want.backward(grad)
    back = Backward(stmt, formats, target=target)
    for n, t in operands.items():
        got = back(n, grad.numpy(), operands)
        if n in formats:  # the operand's own index arrays, new values
            assert got.levels is t.levels and got.format == t.format
        pattern = ucf.Tensor(t.shape, t.format, t.levels, np.ones(len(t.vals))).to_numpy()
        ref = masked[n].grad.numpy() * (pattern if n in formats else 1)
        np.testing.assert_allclose(np.asarray(got.to_numpy()), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fn", sorted(FUNCTIONS))
def test_every_function_has_the_derivative_torch_has(fn):
    if FUNCTIONS[fn].arity == 2:
        check_against_torch(f"y(i) = {fn}(x(i), z(i))", {"x": (7,), "z": (7,)})
    else:
        positive = ("x",) if fn in ("sqrt", "rsqrt") else ()
        check_against_torch(f"y(i) = {fn}(x(i)) * z(i)", {"x": (7,), "z": (7,)}, positive=positive)


@pytest.mark.parametrize(
    "fmt, target",
    [(f, "llvm") for f in ("csr", "csc", "dcsr", "bcsr(2,2)", "nm(2,4)", "coo")]
    + [pytest.param(f, "c", marks=[needs_cc, pytest.mark.slow]) for f in ("csr", "bcsr(2,2)")],
)
def test_sparse_operand_gradients_keep_the_pattern(fmt, target):
    shapes = {"A": (6, 8), "B": (8, 3)}
    check_against_torch("C(i,k) = A(i,j) * B(j,k)", shapes, {"A": fmt}, target=target)
    shapes = {"A": (6, 8), "x": (8,), "b": (6,)}
    text = "y(i) = tanh(sum(k, A(i,k) * x(k))) * b(i) + sigmoid(A(i,j)) * x(j)"
    check_against_torch(text, shapes, {"A": fmt}, seed=1, target=target)


def test_sums_of_terms_nested_sums_and_quotients():
    shapes = {"A": (5, 4), "B": (5, 4), "x": (4,), "z": (4,), "d": (4,)}
    text = "y(i) = A(i,j) * x(j) - B(i,j) * z(j) / d(j) + relu(sum(k, A(i,k) * z(k))) * x(j)"
    check_against_torch(text, shapes, {"B": "csr"}, positive=("d",))
    check_against_torch("s = A(i,j) * A(i,j) + max(A(i,j), B(i,j))", shapes)


def test_a_convolutions_gradients_are_convolutions():
    stmt = parse_statement("O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)")
    grad_input = derive(stmt, "I").statement
    assert str(grad_input) == (
        "grad_I(n, c, x2, x3) = sum(m, r, s, grad_O(n, m, -r + x2 + 1, -s + x3 + 1) * "
        "F(m, c, r, s))"
    )
    assert str(derive(stmt, "F").statement) == (
        "grad_F(m, c, r, s) = sum(n, p, q, grad_O(n, m, p, q) * I(n, c, p + r - 1, q + s - 1))"
    )
    rng = np.random.default_rng(3)
    inp = torch.tensor(rng.standard_normal((2, 3, 6, 5)), requires_grad=True)
    filt = torch.tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    out = torch.nn.functional.conv2d(inp, filt, padding=1)
    grad = torch.tensor(rng.standard_normal(tuple(out.shape)))
    out.backward(grad)
    ops = {"I": ucf.from_numpy(inp.detach().numpy()), "F": ucf.from_numpy(filt.detach().numpy())}
    back = Backward(stmt, {})
    for name, t in (("I", inp), ("F", filt)):
        got = np.asarray(back(name, grad.numpy(), ops))
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_a_variable_only_an_affine_index_bounds_gets_its_range():
    """y(i) = x(i+r): solving i = x0 - r keeps i in range through grad_y; r's extent
    (the window) comes from the forward call, since nothing in the gradient fixes it."""
    stmt = parse_statement("y(i) = x(i + r) * w(r)")
    d = derive(stmt, "x")
    assert str(d.statement) == "grad_x(x0) = sum(r, grad_y(-r + x0) * w(r))"
    x, w = np.arange(6.0), np.array([1.0, 2.0, 3.0])
    k = ucf.compile("y(i) = x(i + r) * w(r)")
    y = np.asarray(k(x=x, w=w))
    grad = np.arange(1.0, len(y) + 1)
    got = np.asarray(Backward(stmt, {})("x", grad, {"x": ucf.from_numpy(x), "w": w}))
    want = np.array(
        [sum(grad[a - r] * w[r] for r in range(3) if 0 <= a - r < len(y)) for a in range(6)]
    )
    np.testing.assert_allclose(got, want)


def test_derived_statements_are_statements_ucf_parses_back():
    for text, wrt in [
        ("y(i) = relu(sum(j, A(i,j) * x(j))) * c(i)", "x"),
        ("Y(i,j) = A(i)*B(j) + A(i)*C(j)", "A"),
        ("y(i) = A(i,j) / x(j) + max(A(i,j), x(j))", "A"),
        ("Y(i,j) = X(i,j) + X(j,i)", "X"),
    ]:
        d = derive(parse_statement(text), wrt, keep_pattern=True).statement
        again = parse_statement(str(d))
        assert (again.lhs, again.rhs) == (d.lhs, d.rhs), text
    d = derive(parse_statement("y(i) = relu(sum(j, A(i,j) * x(j))) * c(i)"), "x").statement
    assert str(d) == ("grad_x(j) = sum(i, grad_y(i) * c(i) * sign(relu(inner_j(i))) * A(i, j))")
    assert derive(parse_statement("y(i) = sign(x(i))"), "x").statement is None


def test_what_cannot_be_differentiated_is_refused_by_name():
    with pytest.raises(ucf.UnsupportedError, match="T\\(i, i\\)"):
        derive(parse_statement("y(i) = T(i,i)"), "T")
    with pytest.raises(ucf.UnsupportedError, match="distinct variables"):
        derive(parse_statement("y(i,i) = x(i)"), "x")
    with pytest.raises(ucf.OperandError, match="B is not an operand"):
        derive(parse_statement("y(i) = x(i)"), "B")
    with pytest.raises(ucf.UnsupportedError, match="floating-point"):
        Backward(parse_statement("y(i) = x(i)"), {}, dtype=np.int64)


def test_kernels_show_the_gradients_they_derive():
    k = ucf.compile("y(i) = A(i,j) * x(j)", {"A": "csr"})
    text = ucf.gradients(k).cin
    assert "grad_A(i, j) = pattern_A(i, j) * grad_y(i) * x(j)" in text
    assert "# gradient of x" in text


# --------------------------------------------------------------- random statements

_OPERANDS = {"A": ("i", "j"), "B": ("i", "j"), "x": ("j",), "b": ("i",)}


@st.composite
def expressions(draw, depth=0):
    """A right-hand side over A(i,j), B(i,j), x(j), b(i), summed over j implicitly."""
    if depth >= 2 or draw(st.booleans()):
        name = draw(st.sampled_from(sorted(_OPERANDS)))
        return f"{name}({','.join(_OPERANDS[name])})"
    kind = draw(st.sampled_from(["+", "-", "*", "fn", "max"]))
    left = draw(expressions(depth + 1))
    if kind == "fn":
        fn = draw(st.sampled_from(["relu", "tanh", "sigmoid", "exp", "sin", "gelu", "abs"]))
        return f"{fn}({left})"
    right = draw(expressions(depth + 1))
    if kind == "max":
        return f"max({left}, {right})"
    return f"({left} {kind} {right})"


@settings(max_examples=8)
@given(rhs=expressions(), fmt=st.sampled_from([None, "csr", "bcsr(2,2)"]))
def test_random_statements_against_torch(rhs, fmt):
    text = f"y(i) = {rhs} + b(i)"
    stmt = parse_statement(text)
    names = {a.tensor for a in accesses(stmt.rhs)}
    shapes = {n: {"A": (4, 6), "B": (4, 6), "x": (6,), "b": (4,)}[n] for n in names}
    formats = {"A": fmt} if fmt and "A" in names else {}
    check_against_torch(text, shapes, formats)


@pytest.mark.parametrize(
    "text,formats",
    [
        ("y(i) = max(max(A(i,j), A(i,j)), max(A(i,j), x(j))) + b(i)", {}),
        ("y(i) = max((A(i,j) - A(i,j)), (A(i,j) * x(j))) + b(i)", {"A": "csr"}),
    ],
)
def test_gradients_of_nested_maxes_of_a_tensor_read_often(text, formats):
    """Drawn by test_random_statements_against_torch: the merge lattice of the gradient's
    term kept every duplicate point, multiplying along the term (23 GB, a CI worker
    killed by the OOM killer). Points are merged as they are made."""
    check_against_torch(text, {"A": (4, 6), "x": (6,), "b": (4,)}, formats)
