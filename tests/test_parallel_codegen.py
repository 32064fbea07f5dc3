"""Parallel loops as generated: the runtime work threshold, and no-alias bodies."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.codegen.c import _Emitter
from ucf.ir import nodes as ir
from ucf.lower.parallel import WORK_THRESHOLD, work_estimate

PAR = "parallelize(i,CPUThread,NoRaces)"


@pytest.fixture
def two_threads():
    ucf.set_num_threads(2)
    yield
    ucf.set_num_threads(2)


@pytest.fixture
def default_threshold(monkeypatch):
    """The threshold ucf ships with (conftest sets 0 for the other tests)."""
    monkeypatch.setenv("UCF_WORK_THRESHOLD", str(WORK_THRESHOLD))


def _csr(rows: int, cols: int, per_row: int, seed: int) -> sp.csr_matrix:
    return sp.random(
        rows, cols, density=per_row / cols, format="csr", random_state=np.random.default_rng(seed)
    )


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("above", [False, True])
def test_parallel_kernels_below_and_above_the_threshold(
    target, above, two_threads, default_threshold
):
    rows = WORK_THRESHOLD // 10 + 1000 if above else 7
    a = _csr(rows, 300, 10, seed=rows)
    assert (rows + a.nnz >= WORK_THRESHOLD) == above  # the SpMV's work estimate
    rng = np.random.default_rng(1)
    x, b = rng.random(300), rng.random((300, 5))
    spmv = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=PAR, target=target)
    spmm = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr"}, schedule=PAR, target=target
    )
    np.testing.assert_allclose(spmv(A=a, x=x).to_numpy(), a @ x, rtol=1e-12)
    np.testing.assert_allclose(spmm(A=a, B=b).to_numpy(), a @ b, rtol=1e-12)


def test_the_threshold_is_in_the_generated_code(default_threshold):
    c = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=PAR, target="c")
    pragma = next(line for line in c.source.splitlines() if "omp parallel" in line)
    assert " if(" in pragma and f"INT64_C({WORK_THRESHOLD})" in pragma
    llvm = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=PAR)
    call = re.search(r"call void @\"?GOMP_parallel\"?\(.*?, i32 (%\S+), i32 0\)", llvm.source)
    assert call is not None, "the team size is not a computed value"
    threads = call.group(1)
    select = re.search(rf"{re.escape(threads)} = select\s+i1 (%\S+), i32 0, i32 1", llvm.source)
    assert select is not None
    cond = re.escape(select.group(1))
    assert re.search(rf"{cond} = icmp sge i64 %\S+, {WORK_THRESHOLD}\b", llvm.source)


def _parallel_loop(kernel: ucf.Kernel) -> ir.For:
    body = kernel.llir[-1].body
    return next(s for s in _walk(body) if isinstance(s, ir.For) and s.parallel == "CPUThread")


def _walk(stmts):
    for s in stmts:
        yield s
        for name in s.BLOCKS:
            yield from _walk(getattr(s, name))


@pytest.mark.parametrize(
    ("stmt", "fmt", "schedule", "expected"),
    [
        # rows, plus the entries of the rows, each times the columns of B
        (
            "C(i,k) = A(i,j) * B(j,k)",
            "csr",
            PAR,
            "(n_i + (((n_i > INT64_C(0)) ? (((int64_t)A1_pos[n_i]) - "
            "((int64_t)A1_pos[INT64_C(0)])) : INT64_C(0)) * n_k))",
        ),
        # a dense matrix: rows times columns
        ("y(i) = A(i,j) * x(j)", "dense", PAR, "(n_i * n_j)"),
        # a split: blocks times the block size
        (
            "y(i) = A(i,j) * x(j)",
            "csr",
            "split(i,i0,i1,64); parallelize(i0,CPUThread,NoRaces)",
            "((((i_hi - i_lo) + INT64_C(63)) / INT64_C(64)) * INT64_C(64))",
        ),
    ],
)
def test_work_estimate(stmt, fmt, schedule, expected):
    k = ucf.compile(stmt, formats={"A": fmt}, schedule=schedule, target="c")
    assert _Emitter().expr(work_estimate(_parallel_loop(k))) == expected


def test_llvm_parallel_body_takes_arrays_as_noalias_arguments():
    """Loaded from the closure struct, the arrays would lose the kernel's no-alias
    promise (and with it vectorization); the outlined body takes them as noalias
    arguments instead."""
    k = ucf.compile("C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr"}, schedule=PAR)
    head = next(
        line for line in k.source.splitlines() if line.startswith("define") and ".omp1.body" in line
    )
    for array in ("A1_pos", "A1_crd", "A_vals", "B_vals", "C_vals"):
        assert re.search(rf'noalias %"?{array}"?\b', head), array


def test_the_threshold_setting_is_part_of_the_kernel(monkeypatch):
    sources = set()
    for setting in ("0", "12345"):
        monkeypatch.setenv("UCF_WORK_THRESHOLD", setting)
        k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=PAR, target="c")
        assert f"INT64_C({setting})" in k.source
        sources.add(k.source)
    assert len(sources) == 2
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "lots")
    with pytest.raises(ucf.UcfError, match="UCF_WORK_THRESHOLD='lots'"):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=PAR)
