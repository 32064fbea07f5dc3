"""TACO's ``assemble(T, Insert|Append[, true])`` command, with its query loops.

ucf counts a sparse output's entries in a query pass (``kernel_assemble``)
before the compute pass fills them.  ``Insert`` lets rows be filled in
parallel; ``Append`` appends in loop order; ``true`` gives the query pass
loops of its own (``qi``), scheduled apart.  TACO's published CPU schedules
are checked verbatim against scipy.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS
from ucf.ir.walk import loops

CSR3 = {"A": "csr", "B": "csr", "C": "csr"}


def matrices(seed, m=120, n=90):
    return (
        sp.random(m, n, density=0.06, format="csr", random_state=seed),
        sp.random(m, n, density=0.06, format="csr", random_state=seed + 1),
    )


def parallel_loops(k) -> dict[str, list[str]]:
    """For each generated function, the labels of its parallel loops."""
    return {
        f.name: [loop.label for _, loop in loops(f.body) if getattr(loop, "parallel", None)]
        for f in k.llir
    }


@pytest.mark.parametrize("target", TARGETS)
def test_taco_spadd_cpu_schedule_verbatim(target):
    B, C = matrices(1)
    k = ucf.compile(
        "A(i,j) = B(i,j) + C(i,j)",
        formats=CSR3,
        schedule="assemble(A,Insert,true); parallelize(i,CPUThread,NoRaces); "
        "parallelize(qi,CPUThread,NoRaces)",
        target=target,
    )
    got = k(B=B, C=C).to_scipy()
    assert abs(got - (B + C)).max() == 0
    np.testing.assert_array_equal(got.indptr, (B + C).indptr)
    assert parallel_loops(k) == {"kernel_assemble": ["i"], "kernel": ["i"]}
    assert "query loop qi runs in parallel" in k.cin


@pytest.mark.parametrize("target", TARGETS)
def test_taco_spgemm_cpu_schedule_verbatim(target):
    B, _ = matrices(3, 100, 80)
    C = sp.random(80, 110, density=0.06, format="csr", random_state=5)
    k = ucf.compile(
        "A(i,j) = B(i,k) * C(k,j)",
        formats=CSR3,
        schedule="reorder(i,k,j); precompute(B(i,k)*C(k,j),j,j,w); assemble(A,Insert,true); "
        "parallelize(i,CPUThread,NoRaces); parallelize(qi,CPUThread,NoRaces)",
        target=target,
    )
    got = k(B=B, C=C).to_scipy()
    want = B @ C
    want.sort_indices()
    assert abs(got - want).max() < 1e-12
    np.testing.assert_array_equal(got.indices, want.indices)
    assert parallel_loops(k) == {"kernel_assemble": ["i"], "kernel": ["i"]}


@pytest.mark.parametrize("target", TARGETS)
def test_taco_ttv_csr_schedule_verbatim(target):
    rng = np.random.default_rng(2)
    B = rng.integers(1, 5, (20, 15, 10)) * (rng.random((20, 15, 10)) < 0.1)
    c = rng.random(10)
    k = ucf.compile(
        "A(i,j) = B(i,j,k) * c(k)",
        formats={"A": "csr", "B": "csf"},
        schedule="assemble(A,Insert); parallelize(i,CPUThread,NoRaces)",
        target=target,
    )
    got = k(B=ucf.from_numpy(B.astype(float), format="csf"), c=c).to_numpy()
    np.testing.assert_allclose(got, np.einsum("ijk,k->ij", B, c), rtol=1e-14)
    assert parallel_loops(k) == {"kernel_assemble": ["i"], "kernel": ["i"]}


@pytest.mark.parametrize("target", TARGETS)
def test_query_and_compute_passes_are_scheduled_apart(target):
    B, C = matrices(7)
    both = "assemble(A,Insert,true); parallelize(qi,CPUThread,NoRaces)"
    k = ucf.compile("A(i,j) = B(i,j) + C(i,j)", formats=CSR3, schedule=both, target=target)
    assert parallel_loops(k) == {"kernel_assemble": ["i"], "kernel": []}
    assert abs(k(B=B, C=C).to_scipy() - (B + C)).max() == 0
    split = "assemble(A,Insert,true); split(qi,qi0,qi1,16); parallelize(qi0,CPUThread,NoRaces)"
    k = ucf.compile("A(i,j) = B(i,j) + C(i,j)", formats=CSR3, schedule=split, target=target)
    assert parallel_loops(k) == {"kernel_assemble": ["qi0"], "kernel": []}
    assert abs(k(B=B, C=C).to_scipy() - (B + C)).max() == 0
    shared = "assemble(A,Insert); parallelize(i,CPUThread,NoRaces)"
    k = ucf.compile("A(i,j) = B(i,j) + C(i,j)", formats=CSR3, schedule=shared, target=target)
    assert parallel_loops(k) == {"kernel_assemble": ["i"], "kernel": ["i"]}


@pytest.mark.parametrize("target", TARGETS)
def test_append_builds_in_loop_order(target):
    B, C = matrices(9)
    k = ucf.compile(
        "A(i,j) = B(i,j) + C(i,j)", formats=CSR3, schedule="assemble(A,Append)", target=target
    )
    assert abs(k(B=B, C=C).to_scipy() - (B + C)).max() == 0
    assert "assembled by Append" in k.cin


def test_a_variable_named_q_is_not_a_query_loop():
    """A conv-style variable q stays a compute loop after assemble(..., true)."""
    k = ucf.compile(
        "A(p,q) = B(p,q) * C(p,q)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        schedule="assemble(A,Insert,true); parallelize(p,CPUThread,NoRaces); "
        "parallelize(qp,CPUThread,NoRaces)",
    )
    assert parallel_loops(k) == {"kernel_assemble": ["p"], "kernel": ["p"]}


@pytest.mark.parametrize(
    "schedule,message",
    [
        ("assemble(B,Insert)", "B is not the output; the output is A"),
        ("assemble(A,Foo)", "unknown strategy 'Foo'"),
        ("assemble(A,Insert,maybe)", "the third argument is true or false"),
        ("assemble(A)", "assemble takes"),
        ("assemble(A,Insert); assemble(A,Append)", "already chosen"),
        ("assemble(A,Append); parallelize(i,CPUThread,NoRaces)", "appends A's entries in loop"),
        ("assemble(A,Insert,true); pos(qi,p,B)", "put it before the assemble command"),
        ("assemble(A,Insert,true); parallelize(qz,CPUThread,NoRaces)", "unknown index variable"),
    ],
)
def test_refusals_name_the_reason(schedule, message):
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile("A(i,j) = B(i,j) + C(i,j)", formats=CSR3, schedule=schedule)


def test_a_dense_output_needs_no_assembly():
    with pytest.raises(ucf.ScheduleError, match="output A is dense"):
        ucf.compile("A(i,j) = B(i,j) + C(i,j)", formats={"B": "csr"}, schedule="assemble(A,Insert)")


def test_fluent_schedule():
    text = str(
        ucf.Schedule().assemble("A", "Insert", True).parallelize("qi", "CPUThread", "NoRaces")
    )
    assert text == "assemble(A, Insert, true); parallelize(qi, CPUThread, NoRaces)"


@pytest.mark.parametrize("target", TARGETS)
def test_an_unordered_output_takes_the_workspace_list_as_it_arrived(target):
    """A ``UQ`` output of SpGEMM is what scipy's product is (unsorted rows): the
    workspace's list is appended without the sort a ``csr`` output needs."""
    B, _ = matrices(7, 100, 80)
    C = sp.random(80, 110, density=0.08, format="csr", random_state=8)
    k = ucf.compile("A(i,j) = B(i,k) * C(k,j)", formats={**CSR3, "A": "UQ"}, target=target)
    got = k(B=B, C=C)
    got.validate()
    assert str(got.format) == "UQ"
    assert "ucf_sort_i64" not in "".join(map(str, k.llir))
    pos, crd = got.levels[1]["pos"], got.levels[1]["crd"]
    rows = [crd[a:b] for a, b in zip(pos[:-1], pos[1:], strict=True)]
    assert any(np.any(np.diff(r) < 0) for r in rows)  # the order is the arrival order
    s = got.to_scipy()  # scipy's CSR with unsorted rows, sharing the arrays
    assert np.shares_memory(s.indices, crd) and not s.has_sorted_indices
    assert abs(s - B @ C).max() < 1e-12
    sorted_k = ucf.compile("A(i,j) = B(i,k) * C(k,j)", formats=CSR3, target=target)
    assert "ucf_sort_i64" in "".join(map(str, sorted_k.llir))


def test_an_unordered_output_of_a_merge_is_appended():
    B, C = matrices(9)
    got = ucf.compile("A(i,j) = B(i,j) + C(i,j)", formats={**CSR3, "A": "UQ"})(B=B, C=C)
    got.validate()
    assert abs(got.to_scipy() - (B + C)).max() == 0
