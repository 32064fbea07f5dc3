"""Differential fuzzing: random statements and formats against a numpy evaluator.

The reference evaluates the right-hand side with broadcasting over every
index variable and sums the variables missing from the output over the
WHOLE right-hand side at the end, which is TACO's (and ucf's) semantics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from conftest import needs_cc, rand_sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ucf

VARS = ["i", "j", "k"]
NAMES = ["A", "B", "C"]


@dataclass
class Case:
    expr: str
    tree: object  # ("acc", name) | (op, left, right)
    accesses: dict[str, tuple[str, ...]]
    out_vars: tuple[str, ...]
    extents: dict[str, int]
    formats: dict[str, str]
    arrays: dict[str, np.ndarray]
    out_format: str | None


def render(tree, accesses) -> str:
    if tree[0] == "acc":
        name = tree[1]
        return f"{name}({','.join(accesses[name])})"
    op, left, right = tree
    parts = [
        render(t, accesses) if t[0] == "acc" else f"({render(t, accesses)})" for t in (left, right)
    ]
    return f"{parts[0]} {op} {parts[1]}"


@st.composite
def trees(draw, names):
    if len(names) == 1:
        return ("acc", names[0])
    split = draw(st.integers(1, len(names) - 1))
    op = draw(st.sampled_from("+-*"))
    return (op, draw(trees(names[:split])), draw(trees(names[split:])))


def random_format(draw, order: int) -> str:
    if order == 0:
        return ""
    letters = "".join(draw(st.sampled_from("UC")) for _ in range(order))
    perm = draw(st.permutations(range(order)))
    return f"{letters}:{','.join(map(str, perm))}"


@st.composite
def cases(draw, sparse_output=True):
    nvars = draw(st.integers(1, 3))
    vars_ = VARS[:nvars]
    nops = draw(st.integers(1, 3))
    names = NAMES[:nops]
    accesses = {}
    for n in names:
        sub = draw(st.lists(st.sampled_from(vars_), min_size=1, max_size=nvars, unique=True))
        accesses[n] = tuple(sub)
    used = sorted({v for a in accesses.values() for v in a}, key=VARS.index)
    out_vars = tuple(draw(st.lists(st.sampled_from(used), max_size=len(used), unique=True)))
    extents = {v: draw(st.integers(1, 4)) for v in used}
    tree = draw(trees(names))
    formats = {n: random_format(draw, len(accesses[n])) for n in names}
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    rng = np.random.default_rng(seed)
    arrays = {
        n: rand_sparse(rng, tuple(extents[v] for v in accesses[n]), density, empty_rows=0)
        for n in names
    }
    out_format = None
    if sparse_output and out_vars and draw(st.booleans()):
        out_format = random_format(draw, len(out_vars))
    lhs = f"X({','.join(out_vars)})" if out_vars else "X"
    expr = f"{lhs} = {render(tree, accesses)}"
    return Case(expr, tree, accesses, out_vars, extents, formats, arrays, out_format)


def reference(case: Case) -> np.ndarray:
    used = list(case.extents)

    def full(name):
        a = case.arrays[name]
        acc = case.accesses[name]
        # transpose into the global variable order, then broadcast
        order = sorted(range(len(acc)), key=lambda m: used.index(acc[m]))
        a = np.transpose(a, order)
        shape = [case.extents[v] if v in acc else 1 for v in used]
        return a.reshape(shape)

    def ev(t):
        if t[0] == "acc":
            return full(t[1])
        left, right = ev(t[1]), ev(t[2])
        return {"+": np.add, "-": np.subtract, "*": np.multiply}[t[0]](left, right)

    val = np.broadcast_to(ev(case.tree), [case.extents[v] for v in used])
    red = tuple(m for m, v in enumerate(used) if v not in case.out_vars)
    val = val.sum(axis=red) if red else np.array(val)
    kept = [v for v in used if v in case.out_vars]
    return np.transpose(val, [kept.index(v) for v in case.out_vars])


def pure_product_reference(case: Case) -> np.ndarray | None:
    """numpy.einsum for statements that are a single product (cross-check of reference())."""

    def leaves(t):
        if t[0] == "acc":
            return [t[1]]
        if t[0] != "*":
            return None
        left, right = leaves(t[1]), leaves(t[2])
        return None if left is None or right is None else left + right

    names = leaves(case.tree)
    if names is None:
        return None
    spec = ",".join("".join(case.accesses[n]) for n in names) + "->" + "".join(case.out_vars)
    return np.einsum(spec, *[case.arrays[n] for n in names])


def check(case: Case, target: str) -> None:
    formats = {n: f for n, f in case.formats.items() if f}
    if case.out_format:
        formats["X"] = case.out_format
    k = ucf.compile(case.expr, formats=formats, target=target)
    ops = {n: ucf.from_numpy(a, format=case.formats[n] or None) for n, a in case.arrays.items()}
    shapes = {v: e for v, e in case.extents.items()}
    got = k(shapes=shapes, **ops).to_numpy()
    want = reference(case)
    einsum_want = pure_product_reference(case)
    if einsum_want is not None:
        np.testing.assert_array_equal(want, einsum_want)
    assert got.shape == want.shape, case.expr
    np.testing.assert_array_equal(got, want, err_msg=f"{case.expr} formats={formats}")


def test_reference_matches_taco_semantics():
    rng = np.random.default_rng(0)
    X = rng.integers(1, 5, (2, 3, 4)).astype(float)
    v = rng.integers(1, 5, 4).astype(float)
    W = rng.integers(1, 5, (2, 3)).astype(float)
    case = Case(
        "M(i,j) = X(i,j,k) * v(k) + W(i,j)",
        ("+", ("*", ("acc", "X"), ("acc", "v")), ("acc", "W")),
        {"X": ("i", "j", "k"), "v": ("k",), "W": ("i", "j")},
        ("i", "j"),
        {"i": 2, "j": 3, "k": 4},
        {},
        {"X": X, "v": v, "W": W},
        None,
    )
    np.testing.assert_array_equal(reference(case), np.einsum("ijk,k->ij", X, v) + 4 * W)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fuzz_llvm(case):
    check(case, "llvm")


@pytest.mark.slow
@needs_cc
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fuzz_c(case):
    check(case, "c")
