"""Several ``precompute`` commands in one kernel: side by side, one inside the producer
or the consumer of another, and one that reads an earlier workspace, checked against
``np.einsum`` and scipy on both CPU targets."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, rand_dense, rand_sparse, stored_coords
from ucf.errors import ScheduleError
from ucf.ir.printer import format_functions

MATRIX = ["csr", "UU", "csc"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa", MATRIX)
@pytest.mark.parametrize("fb", MATRIX)
def test_two_workspaces_side_by_side(target, fa, fb):
    """y = (A@x) * (B@z): each product reduces into a workspace of its own over i."""
    rng = np.random.default_rng(3)
    A, B = rand_sparse(rng, (30, 20), 0.2), rand_sparse(rng, (30, 25), 0.2)
    x, z = rand_dense(rng, 20), rand_dense(rng, 25)
    k = ucf.compile(
        "y(i) = A(i,j)*x(j)*B(i,k)*z(k)",
        formats={"A": fa, "B": fb},
        schedule="precompute(A(i,j)*x(j), i, i, w1); precompute(B(i,k)*z(k), i, i, w2)",
        target=target,
    )
    assert "workspace w1(i)" in k.cin and "workspace w2(i)" in k.cin
    got = k(A=A, x=x, B=B, z=z).to_numpy()
    np.testing.assert_allclose(got, (A @ x) * (B @ z), rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_a_precompute_reads_an_earlier_workspace(target):
    """TACO's precompute3D_multipleWS in one dimension: the second expression names the
    first workspace."""
    rng = np.random.default_rng(4)
    B = rand_sparse(rng, (12, 9, 8), 0.2)
    c, d = rand_dense(rng, 8), rand_dense(rng, 9)
    k = ucf.compile(
        "y(i) = B(i,k,l)*c(l)*d(k)",
        formats={"B": "csf"},
        schedule="precompute(B(i,k,l)*c(l), k, k, w); precompute(w(k)*d(k), k, k, t)",
        target=target,
    )
    got = k(B=B, c=c, d=d).to_numpy()
    np.testing.assert_allclose(got, np.einsum("ikl,l,k->i", B, c, d), rtol=1e-12)


MTTKRP = "A(i,j) = B(i,k,l)*C(k,j)*D(l,j)"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "second",
    [
        "precompute(D(l,j), j, j, v)",  # inside the producer
        "precompute(w(j)*C(k,j), j, j, v)",  # the whole consumer
        "precompute(C(k,j), j, j, v)",  # part of the consumer
    ],
)
def test_mttkrp_with_a_second_workspace(target, second):
    rng = np.random.default_rng(5)
    B = rand_sparse(rng, (20, 7, 6), 0.2, empty_rows=3)
    C, D = rand_dense(rng, (7, 5)), rand_dense(rng, (6, 5))
    k = ucf.compile(
        MTTKRP,
        formats={"B": "csf"},
        schedule=f"reorder(i,k,l,j); precompute(B(i,k,l)*D(l,j), j, j, w); {second}",
        target=target,
    )
    got = k(B=B, C=C, D=D).to_numpy()
    np.testing.assert_allclose(got, np.einsum("ikl,kj,lj->ij", B, C, D), rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("threads", [1, 2])
def test_two_workspaces_per_thread(target, threads):
    """(B@C) * (D@E) element-wise, each product in its own workspace under a parallel
    loop over rows: both workspaces are private to each thread."""
    rng = np.random.default_rng(6)
    B, D = rand_sparse(rng, (40, 15), 0.2), rand_sparse(rng, (40, 12), 0.2)
    C, E = rand_dense(rng, (15, 9)), rand_dense(rng, (12, 9))
    k = ucf.compile(
        "A(i,j) = B(i,k)*C(k,j)*D(i,l)*E(l,j)",
        formats={"B": "csr", "D": "csr"},
        schedule="reorder(i,k,l,j); precompute(B(i,k)*C(k,j), j, j, w1); "
        "precompute(D(i,l)*E(l,j), j, j, w2); parallelize(i, CPUThread, NoRaces)",
        target=target,
    )
    text = format_functions(k.llir)
    assert text.index("per-thread") < text.index("alloc w1") < text.index("alloc w2")
    ucf.set_num_threads(threads)
    got = k(B=B, C=C, D=D, E=E).to_numpy()
    np.testing.assert_allclose(got, (B @ C) * (D @ E), rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_sparse_output_through_two_listed_workspaces(target):
    """SpGEMM scaled by columns, A = (B@C) diag(d), with TACO's workspace and a second
    one over the consumer: the output keeps exactly the product's pattern."""
    rng = np.random.default_rng(7)
    B = sp.random(50, 30, density=0.1, format="csr", random_state=8)
    C = sp.random(30, 40, density=0.1, format="csr", random_state=9)
    d = rand_dense(rng, 40, signed=False)
    k = ucf.compile(
        "A(i,j) = B(i,k)*C(k,j)*d(j)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        schedule="reorder(i,k,j); precompute(B(i,k)*C(k,j), j, j, w); "
        "precompute(w(j)*d(j), j, j, v)",
        target=target,
    )
    got = k(B=B, C=C, d=d)
    got.validate()
    want = (B @ C) @ sp.diags(d)
    np.testing.assert_allclose(got.to_numpy(), want.toarray(), rtol=1e-12)
    assert stored_coords(got) == set(zip(*(B @ C).nonzero(), strict=True))


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (
            "precompute(B(i,k,l)*D(l,j), j, j, w); precompute(C(k,j)*D(l,j), j, j, v)",
            "both sides of an earlier precompute",
        ),
        (
            "precompute(B(i,k,l)*D(l,j), j, j, w); precompute(C(k,j), j, j, w)",
            "already names its workspace w",
        ),
        (
            "precompute(B(i,k,l)*D(l,j), j, j, w); precompute(E(k,j), j, j, v)",
            r"E\(k, j\) is not a factor",
        ),
    ],
)
def test_a_second_precompute_that_cannot_be_placed_is_named(schedule, message):
    with pytest.raises(ScheduleError, match=message):
        ucf.compile(MTTKRP, formats={"B": "csf"}, schedule=f"reorder(i,k,l,j); {schedule}")


def test_a_tiled_workspace_is_the_only_precompute():
    with pytest.raises(ScheduleError, match="only precompute"):
        ucf.compile(
            "y(i) = b(i)*c(i)*d(i)",
            schedule="split(i,i0,i1,4); precompute(b(i)*c(i), i1, i1, w); "
            "precompute(d(i), i1, i1, v)",
        )
