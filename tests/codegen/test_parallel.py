"""Parallel loops as generated: the runtime work threshold, and no-alias bodies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.codegen.c import _Emitter
from ucf.ir import nodes as ir
from ucf.lower.work import WORK_THRESHOLD

PAR = "parallelize(i,CPUThread,NoRaces)"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_threads():
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
    call = re.search(r"call void @\"?ucf_parallel\"?\(.*?, i32 (%\S+), i32 0, ", llvm.source)
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
        # A's rows below a dense loop: each row of B walks all of them, so B's rows
        # times (A's rows plus A's entries)
        (
            "C(i,k) = B(i,j) * A(j,k)",
            "csr",
            PAR,
            "(n_i * (n_j + ((n_j > INT64_C(0)) ? (((int64_t)A1_pos[n_j]) - "
            "((int64_t)A1_pos[INT64_C(0)])) : INT64_C(0))))",
        ),
        # a dense matrix: rows times columns
        ("y(i) = A(i,j) * x(j)", "dense", PAR, "(n_i * n_j)"),
        # a split: the rows and their entries, as for the loop it was split from
        (
            "y(i) = A(i,j) * x(j)",
            "csr",
            "split(i,i0,i1,64); parallelize(i0,CPUThread,NoRaces)",
            "((i_hi - i_lo) + (((i_hi - i_lo) > INT64_C(0)) ? (((int64_t)A1_pos[i_hi]) - "
            "((int64_t)A1_pos[i_lo])) : INT64_C(0)))",
        ),
        # a split of a dense loop: rows times columns
        (
            "y(i) = A(i,j) * x(j)",
            "dense",
            "divide(i,i0,i1,8); parallelize(i0,CPUThread,NoRaces)",
            "((i_hi - i_lo) * n_j)",
        ),
        # fixed-width rows: rows times the width (the segment p*w .. p*w + w)
        ("y(i) = A(i,j) * x(j)", "ell(3)", PAR, "(n_i * INT64_C(3))"),
        ("C(i,j) = A(i,k) * B(k,j)", "nm(2,4)", PAR, "(n_i * (n_k_blk * (INT64_C(2) * n_j)))"),
        # a fused loop split over positions: blocks times the block size
        (
            "y(i) = A(i,j) * x(j)",
            "csr",
            "fuse(i,j,f); pos(f,fp,A); split(fp,f0,f1,64); parallelize(f0,CPUThread,Atomics)",
            "((((fp_hi - fp_lo) + INT64_C(63)) / INT64_C(64)) * INT64_C(64))",
        ),
    ],
)
def test_work_estimate(stmt, fmt, schedule, expected):
    k = ucf.compile(stmt, formats={"A": fmt}, schedule=schedule, target="c")
    # The estimate the kernel's threshold holds: taken from the loop as the schedule
    # shaped it (ucf.passes.row_groups reshapes fixed-width rows' loops afterwards).
    estimate = _parallel_loop(k).parallel_if.left
    assert _Emitter().expr(estimate) == expected


SPLIT_PAR = "split(i,i0,i1,64); parallelize(i0,CPUThread,NoRaces)"
SPLIT_KERNELS = {
    # name: (statement, dense operand's shape beyond A's columns, rows of the mid-size case)
    "spmv": ("y(i) = A(i,j) * x(j)", (), 2_000),
    "spmm": ("C(i,k) = A(i,j) * B(j,k)", (32,), 400),
}


def _value(e: ir.Expr, env: dict):
    """An LLIR expression's value, the kernel's scalars and arrays taken from ``env``."""
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Var):
        return env[e.name]
    if isinstance(e, ir.Cast):
        return int(_value(e.operand, env))
    if isinstance(e, ir.Load):
        return env[e.array.name][_value(e.index, env)]
    if isinstance(e, ir.Select):
        return _value(e.if_true if _value(e.cond, env) else e.if_false, env)
    ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}
    ops.update({">": int.__gt__, ">=": int.__ge__, "min": min})
    return ops[e.op](int(_value(e.left, env)), int(_value(e.right, env)))


@pytest.mark.parametrize("name", sorted(SPLIT_KERNELS))
def test_a_split_loop_counts_the_work_of_its_rows(name):
    """A split's outer loop (blocks of 64 rows) weighs what its rows hold: the rows,
    plus their entries times the dense columns."""
    stmt, dense, _ = SPLIT_KERNELS[name]
    a = _csr(3000, 300, 12, seed=3)
    k = ucf.compile(stmt, formats={"A": "csr"}, schedule=SPLIT_PAR, target="c")
    env = {"i_lo": 0, "i_hi": a.shape[0], "n_i": a.shape[0], "n_j": 300, "A1_pos": a.indptr}
    env["n_k"] = dense[0] if dense else 1
    assert _value(_parallel_loop(k).parallel_if.left, env) == a.shape[0] + a.nnz * env["n_k"]


@pytest.mark.parametrize("bound", [True, False])
def test_a_loop_between_the_rows_and_their_entries_multiplies_them(bound):
    """SpMM's register tile puts the outer loop of a split of C's columns (``kt``) between
    the parallel rows and A's entries: each of its iterations walks the row again, so
    the estimate counts the entries once per ``kt`` and each 16 times (``kr``)."""
    a = _csr(3000, 300, 12, seed=4)
    columns = (
        "bound(k, kb, 40, MaxExact); split(kb, kt, kr, 16)" if bound else ("split(k, kt, kr, 16)")
    )
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr"},
        schedule=f"{columns}; reorder(i, kt, j, kr); parallelize(i, CPUThread, NoRaces)",
        target="c",
    )
    env = {"n_i": a.shape[0], "n_j": 300, "n_k": 40, "A1_pos": a.indptr}
    assert _value(_parallel_loop(k).parallel_if.left, env) == a.shape[0] + 3 * a.nnz * 16


@pytest.mark.parametrize("op", ["+", "*"])
def test_a_merge_counts_the_entries_of_every_level_it_merges(op):
    """A sparse add (union) or product (intersection) of CSR matrices merges two rows per
    row in a ``while``: the threads start on the rows plus both operands' entries.
    Counting the rows alone kept a 100k-row add of long rows on one thread. The rows
    run in chunks of one pass (``ucf.lower.row_chunks``), whose loop starts its threads
    on the rows' loop's estimate."""
    a, b = _csr(400, 300, 30, seed=7), _csr(400, 300, 5, seed=8)
    k = ucf.compile(
        f"S(i,j) = A(i,j) {op} B(i,j)", formats={"A": "csr", "B": "csr", "S": "csr"}, target="c"
    )
    env = {"n_i": 400, "A1_pos": a.indptr, "B1_pos": b.indptr}
    loops = [s for fn in k.llir for s in _walk(fn.body) if isinstance(s, ir.For) and s.parallel]
    assert len(loops) >= 1
    for loop in loops:
        assert _value(loop.parallel_if.left, env) == 400 + a.nnz + b.nnz


def test_a_chain_of_compressed_levels_counts_the_work_under_its_last():
    """A filter-sparse convolution parallel over m (F in UCCC) does its multiply-adds under
    F's last level, once per pixel: the estimate counts each level's entries and the last
    one's times the pixel loops (clipped at the image's edges, counted whole). Counting
    only the first level's kept every such layer on one thread."""
    k = ucf.compile(
        "O(n,m,p,q) = I(n,c,p+r,q+s) * F(m,c,r,s)",
        formats={"F": "UCCC"},
        schedule="reorder(n,m,c,r,s,p,q); parallelize(m,CPUThread,NoRaces)",
        target="c",
    )
    rng = np.random.default_rng(5)
    f = rng.standard_normal((8, 6, 3, 3)) * (rng.random((8, 6, 3, 3)) < 0.3)
    levels = ucf.from_numpy(f, "UCCC").levels
    env = {f"F{d}_pos": levels[d]["pos"] for d in (1, 2, 3)}
    env.update(n_m=8, n_p=12, n_q=10)
    nonzero = np.count_nonzero
    entries = nonzero(f.any(axis=(2, 3))) + nonzero(f.any(axis=3)) + nonzero(f) * 12 * 10
    assert _value(_parallel_loop(k).parallel_if.left, env) == 8 + entries


THREADS_SEEN = """
import os, sys
import numpy as np, scipy.sparse as sp
import ucf
stmt, rows, target, cols = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ucf.set_num_threads(2)
k = ucf.compile(stmt, formats={"A": "csr"}, schedule=sys.argv[5], target=target)
rng = np.random.default_rng(0)
dense = {"x": rng.random(300)} if cols == 0 else {"B": rng.random((300, cols))}
for n in (7, rows):
    a = sp.random(n, 300, density=10 / 300, format="csr", random_state=rng)
    before = len(os.listdir("/proc/self/task"))
    got = k(A=ucf.from_scipy(a, format="csr"), **dense).to_numpy()
    np.testing.assert_allclose(got, a @ next(iter(dense.values())), rtol=1e-12)
    print(n, len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.parametrize("name", sorted(SPLIT_KERNELS))
def test_a_split_loop_starts_threads_when_its_rows_hold_enough_work(name, target):
    """Under the shipped threshold, a split and parallelized SpMV or SpMM of 7 rows runs
    on the calling thread, and one whose rows hold a few times the threshold's work
    (while its blocks number far fewer) starts the team. A fresh process, so the
    OpenMP team starts there, which its thread count shows."""
    stmt, dense, rows = SPLIT_KERNELS[name]
    assert rows // 64 * 64 < WORK_THRESHOLD < rows * 10 * (dense or (1,))[0]
    args = [stmt, str(rows), target, str(dense[0] if dense else 0), SPLIT_PAR]
    assert _threads_started(THREADS_SEEN, args) == {"7": "0", str(rows): "1"}


def _threads_started(script: str, args: list[str]) -> dict[str, str]:
    """The threads ``script`` saw each call start, under the shipped threshold, by the
    rows it gave the call."""
    env = {**os.environ, "UCF_WORK_THRESHOLD": str(WORK_THRESHOLD)}
    run = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(line.split() for line in run.stdout.split("\n") if line)


ENTRIES_SEEN = """
import os, sys
import numpy as np, scipy.sparse as sp
import ucf
target = sys.argv[1]
ucf.set_num_threads(2)
k = ucf.compile("C(i,k) = B(i,j) * A(j,k)", formats={"A": "csr"}, target=target)
rng = np.random.default_rng(0)
a = sp.random(96, 384, density=0.01, format="csr", random_state=rng)
for n in (7, 128):
    b = rng.standard_normal((n, 96))
    before = len(os.listdir("/proc/self/task"))
    got = k(B=b, A=ucf.from_scipy(a, format="csr")).to_numpy()
    np.testing.assert_allclose(got, (a.T @ b.T).T, rtol=1e-12, atol=1e-12)
    print(n, len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_parallel_loop_counts_the_entries_of_a_sparse_operand_below_it(target):
    """``C = B · A`` with A in CSR, parallel over B's rows (the default schedule): each
    row walks every entry of A, so 128 rows of B by 96 of A (12,288, below the
    threshold) holding 368 entries start the team, and 7 rows do not. A fresh
    process, so the OpenMP team starts there, which its thread count shows."""
    nnz = 96 * 384 // 100
    assert 128 * 96 < WORK_THRESHOLD <= 128 * (96 + nnz) and 7 * (96 + nnz) < WORK_THRESHOLD
    assert _threads_started(ENTRIES_SEEN, [target]) == {"7": "0", "128": "1"}


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
