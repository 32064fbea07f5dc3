"""Execution plans of TeSA programs: split operands, sub-statements, compiled against numpy."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import EXPLORE, needs_cc
from ucf.format.format import Format, parse_format
from ucf.lang.parser import parse_statement
from ucf.tesa.policy import with_width

MLP = "T(t,h) = X(t,d) * W1(d,h)\nU(t,h) = relu(T(t,h))\nY(t,e) = U(t,h) * W2(h,e) + B(e)"


def mixed(rng, rows: int, cols: int, block: int = 4) -> ucf.TeSA:
    """Blocks at 8 or 32 bits plus a few fine-grained 32-bit elements."""
    grid = (rows // block, cols // block)
    ones = np.ones((block, block), dtype=bool)
    kept = np.kron(rng.random(grid) < 0.3, ones) | (rng.random((rows, cols)) < 0.03)
    bits = np.where(np.kron(rng.random(grid) < 0.5, ones), 8, 32)
    return ucf.TeSA(np.where(kept, bits, 0))


def mlp(seed: int) -> ucf.tesa.program.Program:
    rng = np.random.default_rng(seed)
    attrs = {"W1": mixed(rng, 16, 24), "W2": mixed(rng, 24, 12)}
    return ucf.program(MLP, shapes={"X": (8, 16), "B": (12,)}, attrs=attrs)


POLICY = ucf.Policy(bits={8, 32}, blocks={(1, 1): 1.0, (4, 4): 6.0})


def stored(plan, name: str, value: np.ndarray) -> np.ndarray:
    """``value`` as the plan stores ``name``'s parts, by the documented rule and
    independently of ucf: 8- and 4-bit parts symmetric integers with a float32 scale
    of max|x|/127 (or /7) per block (BCSR) or per part (CSR), 16-bit parts float16,
    32-bit parts as they are."""
    out = np.zeros_like(value)
    for part in (q for q in plan.parts if q.tensor == name):
        kept = np.where(part.mask, value, 0)
        if part.bits >= 16:
            out += kept.astype(np.float16) if part.bits == 16 else kept
            continue
        limit = {4: 7, 8: 127}[part.bits]
        bh, bw = part.block
        groups = kept.reshape(kept.shape[0] // bh, bh, kept.shape[1] // bw, bw)
        axes = (1, 3) if part.block != (1, 1) else (0, 1, 2, 3)
        top = np.abs(groups).max(axis=axes, keepdims=True)
        scale = np.where(top > 0, top / limit, 1).astype(np.float32).astype(value.dtype)
        q = np.clip(np.rint(groups / scale), -limit, limit)
        out += (q * scale).reshape(kept.shape)
    return out


def test_parts_split_each_operand_exactly():
    p = mlp(0)
    p.propagate()
    plan = p.transform(POLICY)
    for name in ("W1", "W2"):
        parts = [q for q in plan.parts if q.tensor == name]
        total = np.zeros(p.shapes[name], dtype=int)
        for q in parts:
            total += q.mask
            assert (p.attrs[name].bits[q.mask] == q.bits).all()  # one width per part
            # W1, W2: rows summed, and read only by products run transposed: blocks by
            # column, each block's places by column too
            base = "csc" if q.block == (1, 1) else "UCUU:1/4,0/4,1%4,0%4"
            assert (
                q.format.name
                == base + {8: "@qint8" + (":1" if base != "csc" else ""), 32: ""}[q.bits]
            )
        assert (total == p.attrs[name].mask).all()  # disjoint, and all of the kept elements
    for step in str(plan).splitlines():
        if not step.startswith("#"):
            parse_statement(step)  # the plan prints as ucf statements


# The c target compiles every step with gcc (24 s): in the slow run.
@pytest.mark.parametrize("target", ["llvm", pytest.param("c", marks=[needs_cc, pytest.mark.slow])])
def test_plan_matches_numpy(target):
    p = mlp(1)
    p.propagate()
    plan = p.transform(POLICY)
    # Both layers transposed whole, their parts (8-bit blocks included) adding into Y_t,
    # B added last, and Y transposed back once
    assert sum(s.startswith("Y_t(e, t) +=") for s in plan.steps) >= 2
    assert plan.steps[-2:] == ["Y_t(e, t) += B(e)", "Y(t, e) = Y_t(e, t)"]
    run = plan.compile(target=target, dtype="float64")
    rng = np.random.default_rng(7)
    values = {name: rng.standard_normal(shape) for name, shape in p.shapes.items()}
    values = {name: values[name] for name in p.inputs}
    assert {q.bits for q in plan.parts} == {8, 32}
    w1, w2 = stored(plan, "W1", values["W1"]), stored(plan, "W2", values["W2"])
    expected = np.maximum(values["X"] @ w1, 0) @ w2 + values["B"]
    np.testing.assert_allclose(run(**values)["Y"], expected, rtol=1e-10, atol=1e-10)
    exact = {n: np.where(p.attrs[n].mask, values[n], 0) for n in ("W1", "W2")}
    unquantized = np.maximum(values["X"] @ exact["W1"], 0) @ exact["W2"] + values["B"]
    assert not np.allclose(expected, unquantized, rtol=1e-6)  # the 8-bit parts are int8
    weights = {"W1": values.pop("W1"), "W2": values.pop("W2")}
    run = plan.compile(target=target, dtype="float64", static=weights)
    np.testing.assert_allclose(run(**values)["Y"], expected, rtol=1e-10, atol=1e-10)
    with pytest.raises(ucf.OperandError, match="missing operand X"):
        run(B=values["B"])


def test_a_compiled_plan_writes_its_intermediates_again_but_never_its_outputs():
    """The callable keeps each thread's intermediates for the next call with operands of
    the same shapes: every call is right whether the operands are new arrays, the same
    array changed in place, or of other shapes, an output returned earlier is never
    written again, and threads calling one plan at once each get their own answers."""
    p = mlp(2)  # not propagated: X has no pruned element, so any number of rows
    plan = p.transform(POLICY)
    rng = np.random.default_rng(9)
    w1, w2, b = (
        rng.standard_normal((16, 24)),
        rng.standard_normal((24, 12)),
        rng.standard_normal(12),
    )
    run = plan.compile(dtype="float64", static={"W1": w1, "W2": w2})
    q1, q2 = stored(plan, "W1", w1), stored(plan, "W2", w2)

    def expected(x):
        return np.maximum(x @ q1, 0) @ q2 + b

    x = rng.standard_normal((8, 16))
    first = run(X=x, B=b)["Y"]
    kept = first.copy()
    for tokens in (8, 8, 5, 8):
        other = rng.standard_normal((tokens, 16))
        np.testing.assert_allclose(run(X=other, B=b)["Y"], expected(other), rtol=1e-10)
    x[...] = rng.standard_normal(x.shape)  # the same array, changed in place
    for _ in range(3):
        np.testing.assert_allclose(run(X=x, B=b)["Y"], expected(x), rtol=1e-10)
    np.testing.assert_array_equal(first, kept)
    with pytest.raises(ucf.ArgumentError, match="positional"):
        run(x, b)  # the operands go by name
    p.propagate()  # prunes columns of X: its shape is the attribute's
    pruned = p.transform(POLICY).compile(dtype="float64", static={"W1": w1, "W2": w2})
    with pytest.raises(ucf.OperandError, match=r"X has shape \(5, 16\).* of shape \(8, 16\)"):
        pruned(X=x[:5], B=b)

    xs = [rng.standard_normal((8, 16)) for _ in range(4)]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda v: [run(X=v, B=b)["Y"] for _ in range(20)], xs))
    for v, ys in zip(xs, got, strict=True):
        for y in ys:
            np.testing.assert_allclose(y, expected(v), rtol=1e-10)


def test_each_width_is_stored_in_its_values():
    """Blocks of 4, 8, 16 and 32 bits: the parts are qint4, qint8, float16 and plain,
    and the plan computes with the values so stored."""
    rng = np.random.default_rng(11)
    kept = np.kron(rng.random((4, 5)) < 0.4, np.ones((4, 4), dtype=bool))
    kept |= rng.random((16, 20)) < 0.05
    widths = np.kron(rng.choice([4, 8, 16, 32], size=(4, 5)), np.ones((4, 4), dtype=int))
    attrs = {"W": ucf.TeSA(np.where(kept, widths, 0))}
    p = ucf.program("y(i) = W(i,j) * x(j)", shapes={"x": (20,)}, attrs=attrs)
    plan = p.transform(ucf.Policy(bits={4, 8, 16, 32}, blocks={(1, 1): 1.0, (4, 4): 6.0}))
    values = {q.bits: str(q.format).partition("@")[2] for q in plan.parts if q.block == (4, 4)}
    assert values == {4: "qint4:1", 8: "qint8:1", 16: "float16", 32: ""}
    w, x = rng.standard_normal((16, 20)), rng.standard_normal(20)
    got = plan.compile(dtype="float64")(W=w, x=x)["y"]
    np.testing.assert_allclose(got, stored(plan, "W", w) @ x, rtol=1e-10, atol=1e-10)
    as_stored = plan.stored("W", w, dtype="float64")  # what users check a plan against
    np.testing.assert_allclose(as_stored, stored(plan, "W", w), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(plan.stored("x", x), x.astype(np.float32))  # not split


def test_a_width_ucf_cannot_store_is_refused():
    with pytest.raises(ucf.OperandError, match="no storage for 2-bit values"):
        ucf.Policy(bits={2, 32})


def test_an_operand_under_a_function_reads_the_sum_of_its_parts():
    rng = np.random.default_rng(3)
    attrs = {"W": mixed(rng, 8, 8)}
    p = ucf.program("y(i) = relu(W(i,j)) * x(j) + W(i,j) * x(j)", shapes={"x": (8,)}, attrs=attrs)
    plan = p.transform(POLICY)
    w, x = rng.standard_normal((8, 8)), rng.standard_normal(8)
    got = plan.compile(dtype="float64")(W=w, x=x)["y"]
    kept = stored(plan, "W", w)
    np.testing.assert_allclose(got, np.maximum(kept, 0) @ x + kept @ x, rtol=1e-12)


def issue_mask() -> np.ndarray:
    """W, 4x8: two live 2x2 blocks and one element (issue 32's plan)."""
    w = np.zeros((4, 8), dtype=bool)
    w[0:2, 0:2] = w[2:4, 4:6] = True
    w[3, 7] = True
    return w


ISSUE_POLICY = ucf.Policy(bits={8, 32}, blocks={(1, 1): 1, (2, 2): 2.5})


@pytest.mark.parametrize("target", ["llvm", pytest.param("c", marks=needs_cc)])
def test_a_linear_sum_under_a_function_becomes_sub_statements(target):
    """``relu(sum(j, W(i,j) * x(j)))``: the sum is linear in W and the output's ``i``
    fixes it, so each part gets a sub-statement and relu reads their sum. Before, relu
    read ``W_8b_2x2 + W_8b_1x1`` in one kernel, whose nested sum forces a loop order
    the blocked part's per-block scales cannot follow: the plan refused to compile."""
    p = ucf.program(
        "y(i) = relu(sum(j, W(i,j)*x(j))) + b(i)",
        shapes={"x": (8,), "b": (4,)},
        attrs={"W": ucf.TeSA.from_mask(issue_mask(), bits=8)},
    )
    plan = p.transform(ISSUE_POLICY)
    assert {q.block for q in plan.parts} == {(2, 2), (1, 1)}
    assert sum(s.startswith("y_") for s in plan.steps) == 2
    rng = np.random.default_rng(32)
    w, x, b = rng.standard_normal((4, 8)), rng.standard_normal(8), rng.standard_normal(4)
    run = plan.compile(target=target, dtype="float64")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ucf.ConversionWarning)  # no part converted per call
        got = run(W=w, x=x, b=b)["y"]
    np.testing.assert_allclose(got, np.maximum(stored(plan, "W", w) @ x, 0) + b, rtol=1e-12)


def test_parts_read_together_in_a_nested_sum_compile():
    """``relu(W)`` under a nested sum reads the sum of W's parts in one kernel whose
    loop order cannot follow the 2x2 part's blocks: that part is read from a copy with
    its values dequantized (regrouping its scales would requantize it)."""
    p = ucf.program(
        "y(i) = relu(sum(j, relu(W(i,j)) * x(j))) + b(i)",
        shapes={"x": (8,), "b": (4,)},
        attrs={"W": ucf.TeSA.from_mask(issue_mask(), bits=8)},
    )
    plan = p.transform(ISSUE_POLICY)
    rng = np.random.default_rng(33)
    w, x, b = rng.standard_normal((4, 8)), rng.standard_normal(8), rng.standard_normal(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        got = plan.compile(dtype="float64")(W=w, x=x, b=b)["y"]
    kept = stored(plan, "W", w)
    np.testing.assert_allclose(got, np.maximum(np.maximum(kept, 0) @ x, 0) + b, rtol=1e-12)


def test_policy_refuses_bad_arguments():
    with pytest.raises(ucf.OperandError, match="measure"):
        ucf.Policy(blocks="guess")
    with pytest.raises(ucf.OperandError):
        ucf.Policy(bits=[])
    with pytest.raises(ucf.OperandError, match="tensor W1 has 32-bit"):
        mlp(0).transform(ucf.Policy(bits={8}))


@pytest.mark.parametrize(
    "kwargs, shown",
    [
        ({"bits": {8.5}}, "bits must be integers, got 8.5"),
        ({"bits": "8"}, "bits must be a collection"),
        ({"bits": {float("nan")}}, "bits must be integers"),
        ({"min_sparsity": "x"}, "min_sparsity must be a number"),
        ({"min_sparsity": 1.5}, r"min_sparsity must be in \[0, 1\]"),
        ({"blocks": {(4, 4.5): 1.0}}, "a block shape must be integers"),
        ({"blocks": {(4, 0): 1.0}}, "two positive sizes"),
        ({"blocks": {(4, 4): -1.0}}, "positive and finite"),
        ({"blocks": [(4, 4)]}, "dict from block shape"),
    ],
)
def test_policy_names_the_bad_argument(kwargs, shown):
    """Not truncated (8.5 bits is not 8) and not a raw ValueError."""
    with pytest.raises(ucf.OperandError, match=shown):
        ucf.Policy(**kwargs)


def test_a_plan_refuses_names_that_are_not_its_inputs():
    plan = mlp(0).transform(POLICY)
    assert plan.inputs == {"X", "W1", "W2", "B"}
    with pytest.raises(ucf.OperandError, match="Q is not an input of the plan"):
        plan.stored("Q", np.ones(3))
    with pytest.raises(ucf.OperandError, match="Q is not an input"):
        plan.compile(static={"Q": np.ones(3)})


def test_measured_costs_are_measured_once():
    """Which shape is cheaper per element is the machine's business; a block of 1024
    elements costs more than one element, and the second policy reads the cache."""
    first = ucf.Policy(blocks="measure").blocks
    assert set(first) == {(1, 1), (8, 8), (32, 32)}
    assert 0 < first[(1, 1)] < first[(32, 32)]
    assert ucf.Policy(blocks="measure").blocks == first  # read back, not measured again


def test_an_input_below_min_sparsity_is_read_whole_with_its_pruned_elements_zeroed():
    rng = np.random.default_rng(5)
    x_mask = rng.random(8) < 0.8
    attrs = {"W": mixed(rng, 8, 8), "x": ucf.TeSA.from_mask(x_mask)}
    p = ucf.program("y(i) = W(i,j) * x(j)", attrs=attrs)
    plan = p.transform(POLICY)
    assert {q.tensor for q in plan.parts} == {"W"}
    w, x = rng.standard_normal((8, 8)), rng.standard_normal(8)
    got = plan.compile(dtype="float64")(W=w, x=x)["y"]
    expected = stored(plan, "W", w) @ np.where(x_mask, x, 0)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    got = plan.compile(dtype="float64", static={"x": x})(W=w)["y"]  # static, not split
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize(
    "statement, shapes, into",
    [
        # the parts' products add into y, then b does
        ("y(i) = W(i,j) * x(j) + b(i)", {"x": (8,), "b": (8,)}, True),
        # a difference: the parts' products are sub-statements of their own
        ("y(i) = W(i,j) * x(j) - b(i)", {"x": (8,), "b": (8,)}, False),
        # the parts' products cover only i of Y(i,k): the same
        ("Y(i,k) = W(i,j) * x(j) + B(i,k)", {"x": (8,), "B": (8, 3)}, False),
        # a scalar output
        ("s = W(i,j) * A(i,j)", {"A": (8, 8)}, True),
    ],
)
def test_sub_statements_add_into_the_output_where_they_cover_it(statement, shapes, into):
    """Sub-statements over all of the output's indices accumulate into it in place
    (``+=``, no output of their own and no pass adding them up); the result is the
    same as numpy's either way."""
    rng = np.random.default_rng(9)
    p = ucf.program(statement, shapes=shapes, attrs={"W": mixed(rng, 8, 8)})
    plan = p.transform(POLICY)
    out = parse_statement(statement).lhs.tensor
    adds = [s for s in plan.steps if parse_statement(s).op == "+="]
    assert bool(adds) == into
    assert all(parse_statement(s).lhs.tensor == out for s in adds)
    values = {n: rng.standard_normal(p.shapes[n]) for n in p.inputs}
    w = stored(plan, "W", values["W"])
    expected = {
        "y": lambda: w @ values["x"] + (1 if "+" in statement else -1) * values["b"],
        "Y": lambda: (w @ values["x"])[:, None] + values["B"],
        "s": lambda: (w * values["A"]).sum(),
    }[out]()
    got = plan.compile(dtype="float64")(**values)[out]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


# Parts of 32 bits only (no quantized block).
POLICY32 = ucf.Policy(bits={32}, blocks={(1, 1): 1.0, (4, 4): 6.0})


def test_an_mlp_of_plain_parts_runs_transposed_between_its_input_and_output():
    """Both layers run transposed, their parts adding into T_t and Y_t, the relu (read
    by the second layer's products) and B too: the input and the output are the only
    transposes, and the blocks are stored with each block's places by column for the
    transposed product."""
    p = mlp(1)
    p.propagate()
    plan = p.transform(POLICY32)
    assert plan.steps[0] == "X_t(d, t) = X(t, d)"
    assert sum(s.startswith("Y_t(e, t) +=") for s in plan.steps) >= 2
    assert plan.steps[-2:] == ["Y_t(e, t) += B(e)", "Y(t, e) = Y_t(e, t)"]
    relus = [s for s in plan.steps if "relu" in s]
    assert len(relus) >= 2 and all(s.endswith("* relu(T_t(h, t)))") for s in relus)
    assert not any(s.startswith(("T(", "U")) for s in plan.steps)
    blocks = {str(q.format) for q in plan.parts if q.block != (1, 1)}
    assert blocks == {"UCUU:1/4,0/4,1%4,0%4"}
    rng = np.random.default_rng(8)
    values = {name: rng.standard_normal(shape) for name, shape in p.shapes.items()}
    values = {name: values[name] for name in p.inputs}
    expected = np.maximum(values["X"] @ (values["W1"] * p.attrs["W1"].mask), 0)
    expected = expected @ (values["W2"] * p.attrs["W2"].mask) + values["B"]
    np.testing.assert_allclose(plan.compile(dtype="float64")(**values)["Y"], expected, rtol=1e-10)


# (program, is U = f(T) computed in its reader): one reader, linear in U in each term
# that reads it, fuses relu; a term reading U twice (one sum over both products), two
# readers (U then an output), a reader not linear in U and a function outside
# plan.FUSED keep the statement of U.
FUSIONS = [
    ("U(t,h) = relu(T(t,h))\nY(t,e) = U(t,h) * W(h,e) - B(e)", True),
    ("U(t,h) = relu(T(t,h))\nY(t,e) = sum(h, U(t,h) * W(h,e)) + sum(g, U(t,g) * V(g,e))", True),
    ("U(t,h) = relu(T(t,h))\nY(t,e) = U(t,h) * W(h,e) + U(t,h) * V(h,e)", False),
    ("U(t,h) = relu(T(t,h))\nY(t,e) = U(t,h) * W(h,e)\nZ(t,h) = U(t,h) * M(t,h)", False),
    ("U(t,h) = relu(T(t,h))\nY(t,e) = relu(U(t,h)) * W(h,e)", False),
    ("U(t,h) = abs(T(t,h))\nY(t,e) = U(t,h) * W(h,e)", False),
    ("U(h,t) = relu(T(t,h))\nY(t,e) = U(h,t) * W(h,e)", True),
]


@pytest.mark.parametrize("target", ["llvm", pytest.param("c", marks=[needs_cc, pytest.mark.slow])])
@pytest.mark.parametrize("program, fused", FUSIONS)
def test_a_cheap_function_is_computed_where_its_one_linear_reader_reads_it(target, program, fused):
    """U = relu(T) read by one statement linear in U becomes relu(T) in that statement,
    its indices renamed to the read's, and no step writes U; the result matches numpy
    either way (U an output where the program ends with it)."""
    rng = np.random.default_rng(11)
    shapes = {"T": (6, 8), "B": (12,), "V": (8, 12), "M": (6, 8)}
    shapes = {n: s for n, s in shapes.items() if f"{n}(" in program}
    p = ucf.program(program, shapes=shapes, attrs={"W": mixed(rng, 8, 12)})
    p.propagate()
    plan = p.transform(POLICY32)
    assert (not any(s.startswith("U") for s in plan.steps)) == fused
    assert any("abs(" in s or "relu(T" in s for s in plan.steps)
    values = {n: rng.standard_normal(p.shapes[n]) for n in p.inputs}
    t, w = values["T"], values["W"] * p.attrs["W"].mask
    u = np.abs(t) if "abs" in program else np.maximum(t, 0)
    expected = {"U": u if "U(t,h)" in program else u.T}
    y = u @ w
    if "V(" in program:
        y = y + u @ values["V"]
    if "B(" in program:
        y = y - values["B"]
    if "relu(U" in program:
        y = np.maximum(u, 0) @ w
    expected["Y"] = y
    expected["Z"] = u * values.get("M", 0)
    got = plan.compile(target=target, dtype="float64")(**values)
    assert set(got) == set(p.outputs)
    for name in p.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-10, atol=1e-12)


# The c target compiles every step with gcc (28 s): in the slow run.
@pytest.mark.parametrize("target", ["llvm", pytest.param("c", marks=[needs_cc, pytest.mark.slow])])
@pytest.mark.parametrize(
    "policy, extra, whole",
    [(POLICY32, "", True), (POLICY32, " + C(t,h)", False), (POLICY, "", True)],
)
def test_products_with_column_parts_run_transposed(target, policy, extra, whole):
    """``T(t,h) = X(t,d) * W(d,h)`` with W's parts stored by column: the statement runs
    transposed whole, each part into ``T_t`` (over X transposed once), and one tiled
    transpose makes T, quantized blocks included. With a term that cannot run transposed
    (``C``, read plain), only the parts of single elements run transposed, into one
    ``T_t`` added back into T once. Extents
    that are no multiple of the tile, and both threads (the tests start every parallel
    loop's threads)."""
    rng = np.random.default_rng(15)
    shapes = {"X": (7, 12), "C": (7, 20)} if extra else {"X": (7, 12)}
    attrs = {"W": mixed(rng, 12, 20)}
    p = ucf.program(f"T(t,h) = X(t,d) * W(d,h){extra}", shapes=shapes, attrs=attrs)
    plan = p.transform(policy)
    singles = [q.name for q in plan.parts if q.block == (1, 1)]
    blocks = [q.name for q in plan.parts if q.block != (1, 1)]
    assert singles and blocks
    assert {q.format.name for q in plan.parts if q.block == (1, 1)} <= {"csc", "csc@qint8"}
    assert plan.steps.count("X_t(d, t) = X(t, d)") == 1
    for name in singles:
        assert any(s.endswith(f"{name}(d, h) * X_t(d, t))") for s in plan.steps)
    added_back = sum(s.startswith("T(t, h) += T_t") for s in plan.steps)
    if whole:
        assert added_back == 0 and plan.steps[-1] == "T(t, h) = T_t(h, t)"
        for name in blocks:
            assert any(s.endswith(f"{name}(d, h) * X_t(d, t))") for s in plan.steps)
    else:
        assert added_back == 1
        for name in blocks:
            assert any(s.endswith(f"X(t, d) * {name}(d, h))") for s in plan.steps)
    ucf.set_num_threads(2)
    x, w = rng.standard_normal((7, 12)), rng.standard_normal((12, 20))
    c = {"C": rng.standard_normal((7, 20))} if extra else {}
    for static in (False, True):
        run = plan.compile(target=target, dtype="float32", static={"W": w} if static else None)
        got = run(X=x, **c)["T"] if static else run(X=x, W=w, **c)["T"]
        expected = x @ stored(plan, "W", w) + c.get("C", 0)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize(
    "program, outputs, plain",
    [
        ("T(t,h) = X(t,d) * W(d,h)\ns(t) = T(t,h)", ["s"], "T"),
        ("T(t,h) = X(t,d) * W(d,h)\nU(t,h) = T(t,h) * M(t,h)", ["U"], "T"),
        ("T(t,h) = X(t,d) * W(d,h)\nU(t,h) = relu(T(t,h)) + T(t,h)", ["T", "U"], "T"),
    ],
)
def test_a_tensor_held_transposed_is_transposed_back_where_read_plain(program, outputs, plain):
    """A statement that cannot run transposed (a sum over the rows of T, a product with
    a plain M), and the program's outputs, read T transposed back once, after the steps
    that made it; an element-wise statement over tensors held transposed runs so."""
    rng = np.random.default_rng(16)
    shapes = {"X": (9, 12), "M": (9, 20)} if "M" in program else {"X": (9, 12)}
    p = ucf.program(program, shapes=shapes, attrs={"W": mixed(rng, 12, 20)}, outputs=outputs)
    plan = p.transform(POLICY32)
    back = f"{plain}(t, h) = {plain}_t(h, t)"
    assert plan.steps.count(back) == 1
    made = max(k for k, s in enumerate(plan.steps) if s.startswith(f"{plain}_t(h, t)"))
    assert plan.steps.index(back) > made
    assert ("U_t(h, t) = relu(T_t(h, t)) + T_t(h, t)" in plan.steps) == ("relu" in program)
    x, w, m = (rng.standard_normal(shape) for shape in ((9, 12), (12, 20), (9, 20)))
    t = x @ stored(plan, "W", w)
    expected = {"s": t.sum(axis=1), "T": t}
    expected["U"] = t * m if "M" in program else np.maximum(t, 0) + t
    got = plan.compile(dtype="float64")(X=x, W=w, **({"M": m} if "M" in program else {}))
    for name in outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-10, atol=1e-10)


@st.composite
def chains(draw) -> tuple[str, dict, list[str], list]:
    """A random chain of layers over the rows ``t`` of an input X: products with a
    pruned weight (and a bias, or a plain input added), relus, residual sums of two
    earlier tensors of one shape, and maybe a row sum at the end. Returns the program,
    its shapes, the weights' names and the numpy steps that compute it."""
    dims = [draw(st.sampled_from([4, 8, 12])) for _ in range(6)]
    tokens = draw(st.integers(1, 9))
    shapes = {"X": (tokens, dims[0])}
    made = [("X", 0)]  # tensors so far and their column dimension
    lines, weights, steps = [], [], []
    for k in range(draw(st.integers(1, 4))):
        name, (prev, dim) = f"Z{k}", made[-1]
        a = "abcefg"[dim]
        kind = draw(st.sampled_from(["matmul", "matmul", "relu", "residual"]))
        same = [m for m in made[:-1] if m[1] == dim]
        if kind == "residual" and same:
            other = draw(st.sampled_from(same))[0]
            lines.append(f"{name}(t,{a}) = {prev}(t,{a}) + {other}(t,{a})")
            steps.append((name, lambda v, p=prev, o=other: v[p] + v[o]))
        elif kind == "relu":
            lines.append(f"{name}(t,{a}) = relu({prev}(t,{a}))")
            steps.append((name, lambda v, p=prev: np.maximum(v[p], 0)))
        else:
            out = dim + 1
            b, w = "abcefg"[out], f"W{k}"
            extra = draw(st.sampled_from(["", "bias", "plain"]))
            text = f"{name}(t,{b}) = {prev}(t,{a}) * {w}({a},{b})"
            shapes[w] = (dims[dim], dims[out])
            weights.append(w)
            if extra == "bias":
                text += f" + B{k}({b})"
                shapes[f"B{k}"] = (dims[out],)
            elif extra == "plain":
                text += f" + C{k}(t,{b})"
                shapes[f"C{k}"] = (tokens, dims[out])
            lines.append(text)
            steps.append(
                (
                    name,
                    lambda v, p=prev, w=w, k=k: v[p] @ v[w] + v.get(f"B{k}", 0) + v.get(f"C{k}", 0),
                )
            )
            dim = out
        made.append((name, dim))
    if draw(st.booleans()):
        last, dim = made[-1]
        lines.append(f"s(t) = {last}(t,{'abcefg'[dim]})")
        steps.append(("s", lambda v, p=last: v[p].sum(axis=1)))
    return "\n".join(lines), shapes, weights, steps


@settings(max_examples=4)
@given(chain=chains(), plain=st.booleans())
def test_random_chains_match_numpy(chain, plain):
    """Plans of random chains of layers, transposed or not as their parts allow,
    against numpy on the weights as the plan stores them."""
    check_chain(chain, plain)


@pytest.mark.slow
@settings(EXPLORE, max_examples=150)
@given(chain=chains(), plain=st.booleans())
def test_random_chains_match_numpy_long(chain, plain):
    check_chain(chain, plain)


def check_chain(chain, plain: bool) -> None:
    program, shapes, weights, steps = chain
    rng = np.random.default_rng(len(program))
    attrs = {w: mixed(rng, *shapes[w]) for w in weights}
    inputs = {n: s for n, s in shapes.items() if n not in attrs}
    p = ucf.program(program, shapes=inputs, attrs=attrs)
    p.propagate()
    plan = p.transform(POLICY32 if plain else POLICY)
    values = {n: rng.standard_normal(s) for n, s in shapes.items()}
    got = plan.compile(dtype="float64")(**values)
    v = dict(values)
    for w in weights:  # a weight the plan does not split is read whole, pruned
        kept = np.where(p.attrs[w].mask, values[w], 0)
        v[w] = stored(plan, w, kept) if any(q.tensor == w for q in plan.parts) else kept
    for name, step in steps:
        v[name] = step(v)
    for name in p.outputs:
        np.testing.assert_allclose(got[name], v[name], rtol=1e-10, atol=1e-10, err_msg=program)


@pytest.mark.parametrize(
    "bits, spelled", [(8, "@qint8"), (4, "@qint4"), (16, "@float16"), (32, "")]
)
def test_a_width_adds_the_values_tesa_stores_it_in(bits, spelled):
    """A blocked part is quantized with a scale per block, a CSR one per tensor."""
    per_block = ":1" if spelled.startswith("@q") else ""
    assert with_width(Format.compressed(2, 1), bits) == parse_format(f"csr{spelled}")
    got = with_width(Format.blocked_rows(4, 4), bits)
    assert got == parse_format(f"bcsr(4,4){spelled}{per_block}")
