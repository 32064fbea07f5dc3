"""The one rule for "does this loop order walk each tensor as stored"
(``ucf.schedule.storage_order``): against a reference of its own (sorting a tensor's
coordinates by the loop order in numpy), and its three users against each other: the
tuner's orders (``ucf.tuning.search_problem``), a precompute producer's order of its own
(``ucf.schedule.own_order.follows``) and ``reorder``'s refusal
(``ucf.schedule.apply``), with a kernel's result against numpy."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import parsed_formats
from ucf.format.format import Format
from ucf.lang.ast import accesses
from ucf.lang.parser import parse_statement
from ucf.schedule import own_order
from ucf.schedule.storage_order import levels, misordered, walks_as_stored
from ucf.tuning import search_problem


def _walked_as_stored(shape, mode_order, at) -> bool:
    """Whether visiting every coordinate of a full tensor of ``shape`` with its modes
    nested as the loops bind them (mode ``m`` at loop ``at[m]``) meets the coordinates
    in the order the format stores them (lexicographic in ``mode_order``)."""
    coords = np.array(list(itertools.product(*map(range, shape))))
    stored = np.lexsort([coords[:, m] for m in reversed(mode_order)])
    by_loop = sorted(range(len(shape)), key=lambda m: at[m])
    walked = np.lexsort([coords[:, m] for m in reversed(by_loop)])
    return bool(np.array_equal(stored, walked))


@settings(max_examples=60)
@given(st.data())
def test_the_rule_is_sorting_by_the_loops(data):
    order = data.draw(st.integers(2, 3))
    mode_order = data.draw(st.permutations(range(order)))
    names = "ijk"[:order]
    loops = data.draw(st.permutations([*names, "l"]))  # a loop the access does not use
    (a,) = accesses(parse_statement(f"y = A({','.join(names)})").rhs)
    chain = levels(a, Format.compressed(order, mode_order=mode_order))
    assert chain == tuple(names[m] for m in mode_order)
    want = _walked_as_stored((2, 3, 4)[:order], mode_order, [loops.index(v) for v in names])
    assert walks_as_stored(loops, [chain]) == want
    assert (misordered(loops, chain) is None) == want


def test_the_pair_named_and_what_asks_nothing():
    assert misordered(("j", "i"), ("i", "j")) == ("i", "j")
    assert misordered(("i", "k", "j"), ("i", "j", "k")) == ("j", "k")
    assert misordered(("j", "i"), ("i", "i")) is None  # a diagonal: both levels at i
    (affine,) = accesses(parse_statement("y(i) = A(i+k,j)").rhs)
    assert levels(affine, Format.compressed(2, 1)) is None


CASES = [
    ("y(i) = A(i,j) * x(j)", {"A": "csc"}),
    ("C(i,k) = A(i,j) * B(j,k)", {"A": "csr", "B": "csr"}),
    ("C(i,k) = A(i,j) * B(j,k)", {"A": "csc", "B": "csr"}),
    ("C(i,j,k) = A(i,j,l) * B(l,k)", {"A": "csf"}),
]


@pytest.mark.parametrize(("statement", "spelled"), CASES)
def test_tuner_producer_and_reorder_agree(statement, spelled):
    fmts = parsed_formats(statement, spelled)
    problem = search_problem.problem(statement, fmts, {})
    sparse = [a for a in accesses(parse_statement(statement).rhs) if a.tensor in spelled]
    chains = [levels(a, fmts[a.tensor]) for a in sparse]
    kept = [p for p in itertools.permutations(problem.variables) if walks_as_stored(p, chains)]
    assert set(problem.orders) == set(kept)
    assert own_order.follows(sparse, fmts, problem.variables) == kept[0]
    rng = np.random.default_rng(7)
    shapes = dict(zip("ijkl", (5, 4, 3, 6), strict=True))
    for order in itertools.permutations(problem.variables):
        schedule = f"reorder({', '.join(order)})"
        if order not in kept:
            with pytest.raises(ucf.ScheduleError, match="reorder: loop order .* stores"):
                ucf.compile(statement, formats=spelled, schedule=schedule)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error", ucf.ConversionWarning)  # walked as stored
            k = ucf.compile(statement, formats=spelled, schedule=schedule)
        if order != kept[0]:
            continue  # one kernel an operand set is enough for the values
        stmt = parse_statement(statement)
        operands, dense = {}, {}
        for a in accesses(stmt.rhs):
            shape = tuple(shapes[i.single_variable] for i in a.indices)
            if a.tensor in spelled and len(shape) == 2:
                m = sp.random(*shape, density=0.5, random_state=rng, format="csr")
                operands[a.tensor], dense[a.tensor] = m, m.toarray()
            else:
                dense[a.tensor] = operands[a.tensor] = rng.random(shape)
        got = k(**operands).to_numpy()
        subscripts = ",".join(
            "".join(i.single_variable for i in a.indices) for a in accesses(stmt.rhs)
        )
        out = "".join(i.single_variable for i in stmt.lhs.indices)
        want = np.einsum(f"{subscripts}->{out}", *(dense[a.tensor] for a in accesses(stmt.rhs)))
        np.testing.assert_allclose(got, want, rtol=1e-12)
