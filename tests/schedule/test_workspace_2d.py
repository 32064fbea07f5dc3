"""``precompute`` into a workspace over two variables (``W(j,l) = B(j,k)*X(k,l)`` of
``A@B@X``, ``W(i,j) = X(i,k)*A(k,j)`` of ``X@A@B``), as a user writes it, against
numpy on both CPU targets over formats and shapes (empty rows, one column, zero
extents), and on two threads with a chain's producer parallel too; what cannot work
is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS, rand_dense, rand_sparse
from ucf.ir.printer import format_functions

RIGHT = "Y(i,l) = A(i,j)*B(j,k)*X(k,l)"
LEFT = "Y(i,l) = X(i,k)*A(k,j)*B(j,l)"
ON_RIGHT = "precompute(B(j,k)*X(k,l), {j,l}, {j,l}, W)"
ON_LEFT = "precompute(X(i,k)*A(k,j), {i,j}, {i,j}, W)"


def _operands(expr: str, m: int, r: int, n: int, c: int, seed: int) -> dict:
    """A (m x r) and B (r x n) with empty rows; X (n x c) on the right, (c x m) on the left."""
    rng = np.random.default_rng(seed)
    ops = {
        "A": rand_sparse(rng, (m, r), 0.3, empty_rows=min(m, 2)),
        "B": rand_sparse(rng, (r, n), 0.3, empty_rows=min(r, 2)),
    }
    ops["X"] = rand_dense(rng, (n, c) if expr == RIGHT else (c, m))
    return ops


def _want(expr: str, o: dict) -> np.ndarray:
    return o["A"] @ (o["B"] @ o["X"]) if expr == RIGHT else (o["X"] @ o["A"]) @ o["B"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "expr,schedule",
    [
        (RIGHT, ON_RIGHT),
        (LEFT, ON_LEFT),
        (RIGHT, ON_RIGHT + "; parallelize(i, CPUThread, NoRaces)"),
    ],
)
@pytest.mark.parametrize(
    "formats,shape",
    [
        (("csr", "csr"), (9, 7, 11, 5)),
        (("csc", "dcsr"), (6, 8, 5, 1)),
        (("dense", "csc"), (0, 4, 3, 2)),
        (("csr", "dcsr"), (5, 4, 0, 3)),
    ],
)
def test_a_2d_workspace_against_numpy(target, expr, schedule, formats, shape):
    """The user's 2-D precompute, exact, with the workspace formed once outside the
    loop its value does not depend on."""
    ops = _operands(expr, *shape, seed=sum(shape))
    fmts = {n: f for n, f in zip("AB", formats, strict=True) if f != "dense"}
    k = ucf.compile(expr, formats=fmts, schedule=schedule, target=target)
    tensors = {n: ucf.from_numpy(a, format=fmts.get(n, "UU")) for n, a in ops.items()}
    np.testing.assert_array_equal(k(**tensors).to_numpy(), _want(expr, ops))
    at = "W(j, l)" if expr == RIGHT else "W(i, j)"
    assert f"precomputed into workspace {at}" in k.cin, k.cin


def test_the_text_and_the_fluent_schedule_agree():
    """``{j,l}`` in the text and a tuple in ``ucf.Schedule().precompute`` are one command,
    spelled back as the text spells it."""
    fluent = ucf.Schedule().precompute("B(j,k)*X(k,l)", ("j", "l"), ("j", "l"), "W")
    assert str(fluent) == "precompute(B(j,k)*X(k,l), {j,l}, {j,l}, W)"
    formats = {"A": "csr", "B": "csr"}
    a = ucf.compile(RIGHT, formats=formats, schedule=fluent)
    b = ucf.compile(RIGHT, formats=formats, schedule=ON_RIGHT)
    assert a.source == b.source


@pytest.mark.parametrize(
    "expr,formats,schedule,error,match",
    [
        (RIGHT, {}, "precompute(B(j,k)*X(k,l), {j,l}, {j,m}, W)", ucf.ScheduleError, "keeps"),
        (RIGHT, {}, "precompute(B(j,k)*X(k,l), {j,j}, {j,j}, W)", ucf.ScheduleError, "twice"),
        (RIGHT, {}, "precompute(B(j,k)*X(k,l), {j,l}, l, W)", ucf.ScheduleError, "keeps"),
        (RIGHT, {}, "precompute(B(j,k)*X(k,l), {j,q}, {j,q}, W)", ucf.ScheduleError, "q"),
        (
            RIGHT,
            {},
            "precompute(B(j,k)*X(k,l), {j,i}, {j,i}, W)",
            ucf.ScheduleError,
            r"B\(j,k\)\*X\(k,l\) does not use i",
        ),
        (
            RIGHT,
            {},
            "split(l, l0, l1, 2); precompute(B(j,k)*X(k,l1), {j,l1}, {j,l1}, W)",
            ucf.ScheduleError,
            "the statement's own index variables",
        ),
        (
            RIGHT,
            {"Y": "csr"},
            ON_RIGHT,
            ucf.UnsupportedError,
            "a workspace over several variables is dense, and the sparse output Y",
        ),
    ],
)
def test_what_cannot_work_is_refused(expr, formats, schedule, error, match):
    with pytest.raises(error, match=match):
        ucf.compile(expr, formats={"A": "csr", "B": "csr", **formats}, schedule=schedule)


def test_cuda_refuses_it_by_name():
    with pytest.raises(ucf.UnsupportedError, match="does not support precompute"):
        ucf.compile(
            RIGHT, formats={"A": "csr", "B": "csr"}, schedule=ON_RIGHT, target="cuda", emulate=True
        )


@pytest.mark.parametrize("target", TARGETS)
def test_the_default_on_two_threads(target, monkeypatch):
    """The default's w(j,l) = B@X, formed once, then A@w with i shared over two threads
    that start whatever the work (``UCF_WORK_THRESHOLD=0``): exact, rows of A empty too."""
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")
    ops = _operands(RIGHT, 40, 30, 20, 3, seed=5)
    formats = {"A": "csr", "B": "csr"}
    ucf.set_num_threads(2)
    k = ucf.compile(RIGHT, formats=formats, target=target)
    tensors = {n: ucf.from_numpy(a, format=formats.get(n, "UU")) for n, a in ops.items()}
    np.testing.assert_array_equal(k(**tensors).to_numpy(), _want(RIGHT, ops))
    assert "precomputed into workspace w(j, l)" in k.cin, k.cin
    assert "loop i runs in parallel" in k.cin, k.cin


PRODUCER = "parallelize(j, CPUThread, NoRaces)"
CONSUMER = "parallelize(i, CPUThread, NoRaces)"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "expr,precompute",
    [
        ("y(i) = A(i,j)*B(j,k)*x(k)", "precompute(B(j,k)*x(k), j, j, w)"),
        (RIGHT, ON_RIGHT),
    ],
)
@pytest.mark.parametrize("order", [(PRODUCER, CONSUMER), (CONSUMER, PRODUCER)])
def test_a_chain_producer_on_threads(target, expr, precompute, order, monkeypatch):
    """``parallelize(j)`` names the producer's loop over the workspace's variable (its
    iterations fill entries of their own) and the consumer's sum over j inside the
    parallel i, which is left to i's threads, in either order; both start their threads
    (``UCF_WORK_THRESHOLD=0``) on two, and the result is exact."""
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")
    rng = np.random.default_rng(9)
    a = rand_sparse(rng, (40, 30), 0.3, empty_rows=3)
    b = rand_sparse(rng, (30, 20), 0.3, empty_rows=2)
    x = rand_dense(rng, (20, 3) if expr == RIGHT else (20,))
    formats = {"A": "csr", "B": "csr"}
    ucf.set_num_threads(2)
    k = ucf.compile(expr, formats=formats, schedule="; ".join((precompute, *order)), target=target)
    ops = {"A": ucf.from_numpy(a, format="csr"), "B": ucf.from_numpy(b, format="csr")}
    ops["X" if expr == RIGHT else "x"] = x
    np.testing.assert_array_equal(k(**ops).to_numpy(), a @ (b @ x))
    text = format_functions(k.llir)
    assert text.count("for parallel(CPUThread") == 2, text  # the producer's j, the consumer's i


def test_a_consumer_sum_alone_is_still_refused():
    """Without a parallel loop around it, the consumer's sum over j is a race: refused."""
    with pytest.raises(ucf.ScheduleError, match="j is a reduction variable"):
        ucf.compile(
            "y(i) = A(i,j)*B(j,k)*x(k)",
            formats={"A": "csr", "B": "csr"},
            schedule="precompute(B(j,k)*x(k), j, j, w); " + PRODUCER,
        )
