"""Target cuda: GPU schedules lowered to CUDA, verified without a GPU.

Every kernel here runs under the CPU emulator (``emulate=True``: the same .cu
text built with g++ against runtime/ucf_cuda_emu.h, warp collectives in
lockstep) and is compared with numpy, and every generated source is compiled
with nvcc for sm_80, and for sm_90 in the slow run (skipped only when nvcc is
absent). The quick run checks a representative subset of shapes and sizes;
``-m slow`` runs the rest. The ``gpu``-marked tests run the same kernels on a
real device through pycuda.

The four SpMM algorithms of Sgap ("Sgap: towards efficient sparse tensor
algebra compilation for GPU") are written as ucf schedules in ``SGAP``; see
docs/cuda.md for how each maps onto the grid.
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.cli import main
from ucf.toolchain.cuda_build import EMULATION_FLAGS, NVCC_FLAGS, nvcc_check, nvcc_path

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
SPMM = "C(i,k) = A(i,j) * B(j,k)"
SPMV = "y(i) = A(i,j) * x(j)"


# ---------------------------------------------------------------- the Sgap schedules
def eb_sr(g: int) -> str:
    """{<g nnz, c col>, 1}: a thread takes g consecutive nonzeros and the columns of its
    lane (c = N / 4 of them, 4 lanes per nonzero chunk); products are added atomically."""
    return (
        f"fuse(i,j,f); pos(f,fpos,A); split(fpos,fb,f1,{8 * g}); split(f1,ft,nz,{g}); "
        "split(k,kc,kl,4); parallelize(fb,GPUBlock,IgnoreRaces); "
        "parallelize(ft,GPUThread,Atomics); parallelize(kl,GPUThread,NoRaces)"
    )


def rb_sr(g: int) -> str:
    """{<g row, c col>, 1}: a thread takes g rows and its lane's columns; each row's sum
    over j is serial."""
    return (
        f"reorder(i,k,j); split(i,ib,i1,{8 * g}); split(i1,it,ir,{g}); split(k,kc,kl,4); "
        "parallelize(ib,GPUBlock,NoRaces); parallelize(it,GPUThread,NoRaces); "
        "parallelize(kl,GPUThread,NoRaces)"
    )


def rb_pr(r: int) -> str:
    """{<1/g row, c col>, r}: a group of r lanes shares a row, each lane every r-th
    nonzero; the group's tree reduction (atomicAddGroup) writes the sum."""
    return (
        "reorder(i,k,j); split(i,ib,it,4); split(k,kc,kl,4); pos(j,jpos,A); "
        f"split(jpos,jpos0,jpos1,{r}); reorder(ib,it,kc,kl,jpos1,jpos0); "
        "parallelize(ib,GPUBlock,NoRaces); parallelize(it,GPUThread,NoRaces); "
        f"parallelize(kl,GPUThread,NoRaces); parallelize(jpos1,GPUGroup,{r},ParallelReduction)"
    )


def eb_seg(r: int) -> str:
    """{<1 nnz, c col>, r}: a lane takes one nonzero; a group of r lanes (consecutive
    nonzeros, possibly of several rows) reduces by segments (segReduceGroup)."""
    return (
        f"fuse(i,j,f); pos(f,fpos,A); split(fpos,fb,f1,{max(64, r)}); split(f1,fg,fl,{r}); "
        "split(k,kc,kl,4); parallelize(fb,GPUBlock,IgnoreRaces); "
        f"parallelize(fg,GPUThread,Atomics); parallelize(fl,GPUGroup,{r},Segment); "
        "parallelize(kl,GPUThread,NoRaces)"
    )


SGAP = {"eb_sr": eb_sr, "rb_sr": rb_sr, "rb_pr": rb_pr, "eb_seg": eb_seg}
SIZES = [4, 8, 16, 32]  # r (group size) for rb_pr/eb_seg, g (work per thread) for the others
COLUMNS = [4, 16, 46, 128]


def _values(rng, n):
    return (rng.integers(1, 10, n) * rng.choice([-1, 1], n)).astype(np.float64)


def matrices() -> dict[str, sp.csr_matrix]:
    """The matrices every algorithm must get right (small integer values: exact sums)."""
    rng = np.random.default_rng(7)
    rows, cols = 40, 48
    empty = sp.random(rows, cols, density=0.12, format="lil", random_state=3)
    for r in rng.choice(rows, 8, replace=False):
        empty[r, :] = 0
    dense_row = sp.random(rows, cols, density=0.03, format="lil", random_state=4)
    dense_row[17, :] = 1.0
    lengths = np.minimum(cols, (cols / np.arange(1, 65) ** 1.1).astype(int))
    rng.shuffle(lengths)
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    indices = np.concatenate([np.sort(rng.choice(cols, n, replace=False)) for n in lengths])
    power = sp.csr_matrix((np.ones(indptr[-1]), indices, indptr), shape=(64, cols))
    out = {}
    for name, m in (("empty_rows", empty), ("dense_row", dense_row), ("power_law", power)):
        m = sp.csr_matrix(m)
        m.data = _values(rng, m.nnz)
        out[name] = m
    return out


class Built(dict):
    """Kernels compiled when first asked for, so that the quick run (slow tests left out)
    builds only the ones it checks: g++ on the emulation header dominates this file."""

    def __init__(self, jobs: dict):
        super().__init__()
        self.jobs = jobs

    def __missing__(self, key):
        self[key] = ucf.compile(**self.jobs[key])
        return self[key]


SLOW = pytest.mark.slow
#: The sizes the quick run checks; the others are marked slow.
QUICK_SIZES = (4, 16)
SIZE_PARAMS = [s if s in QUICK_SIZES else pytest.param(s, marks=SLOW) for s in SIZES]


def build(jobs: dict) -> dict:
    """Compile kernels two at a time: most of the time is g++ on the emulation header."""
    with ThreadPoolExecutor(2) as pool:
        futures = {key: pool.submit(lambda a: ucf.compile(**a), args) for key, args in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


@pytest.fixture(scope="module")
def sgap_kernels():
    jobs = {
        (alg, n): dict(expr=SPMM, formats={"A": "csr"}, schedule=f(n), target="cuda", emulate=True)
        for alg, f in SGAP.items()
        for n in SIZES
    }
    return Built(jobs)


@pytest.mark.parametrize("columns", COLUMNS)
@pytest.mark.parametrize("size", SIZE_PARAMS)
@pytest.mark.parametrize("alg", list(SGAP))
def test_sgap_spmm_matches_numpy(sgap_kernels, alg, size, columns):
    k = sgap_kernels[alg, size]
    rng = np.random.default_rng(columns)
    for name, A in matrices().items():
        B = _values(rng, A.shape[1] * columns).reshape(A.shape[1], columns)
        got = k(A=A, B=B).to_numpy()
        assert np.array_equal(got, A @ B), (alg, size, columns, name)


def test_sgap_kernels_use_the_group_helpers(sgap_kernels):
    assert "atomicAddGroup<double, 16>(C_vals" in sgap_kernels["rb_pr", 16].source
    assert "segReduceGroup<double, 16>(C_vals" in sgap_kernels["eb_seg", 16].source
    assert "ucf_atomic_add(&C_vals[" in sgap_kernels["eb_sr", 4].source
    for alg in SGAP:
        k = sgap_kernels[alg, 4]
        assert "blockIdx.x" in k.source and "threadIdx.x" in k.source, alg


@pytest.mark.parametrize(
    "dtype", ["float32", pytest.param("int32", marks=SLOW), pytest.param("int64", marks=SLOW)]
)
def test_sgap_value_types(dtype):
    rng = np.random.default_rng(5)
    A = matrices()["power_law"].astype(dtype)
    B = rng.integers(-5, 6, (A.shape[1], 9)).astype(dtype)
    jobs = {
        alg: dict(
            expr=SPMM,
            formats={"A": "csr"},
            schedule=f(8),
            target="cuda",
            emulate=True,
            dtype=dtype,
            index_dtype="int64" if dtype == "int64" else "int32",
        )
        for alg, f in SGAP.items()
    }
    for alg, k in build(jobs).items():
        got = k(A=A, B=B).to_numpy()
        assert got.dtype == np.dtype(dtype)
        assert np.array_equal(got, (A @ B).astype(dtype)), alg


# ------------------------------------------------------- groups wider than their tile
def listing5(g: int, r: int, c: int = 4) -> str:
    """Sgap's Listing 5, {<1/g row, c col>, r}, as written there (the loop nesting of its
    CIN spelled as reorder, ParallelReduction as its text says), with p = 8g threads per
    block: warps take c (row, column) pairs each, and the r lanes of a group split a row's
    nonzeros g at a time, g/r per lane, into private sums that one tile reduction adds."""
    p = 8 * g
    return (
        f"reorder(i,k,j); fuse(i,k,io); split(io,ko,ki,{c * p // g}); "
        f"split(ki,warp,kii,{c}); pos(j,jpos,A); split(jpos,jpos0,jpos1,{g}); "
        "reorder(ko,warp,kii,jpos1,jpos0); parallelize(ko,GPUBlock,NoRaces); "
        f"parallelize(warp,GPUWarp,Atomics); parallelize(jpos1,GPUGroup,{r},ParallelReduction)"
    )


def rows_wide(g: int, r: int) -> str:
    """SpMV by rows: a group of r lanes takes a row's nonzeros g at a time (g/r per lane)
    into the running sum, which the group reduces after the row."""
    return (
        f"split(i,ib,it,8); pos(j,jpos,A); split(jpos,jpos0,jpos1,{g}); "
        "reorder(ib,it,jpos1,jpos0); parallelize(ib,GPUBlock,NoRaces); "
        f"parallelize(it,GPUThread,NoRaces); parallelize(jpos1,GPUGroup,{r},ParallelReduction)"
    )


def nnz_wide(g: int, r: int, columns: bool, reorder: bool = True) -> str:
    """{<g/r nnz, c col>, r}: a group takes g consecutive nonzeros, each lane g/r of them
    with a partial sum per row (flushed when the row changes), and the lanes' last rows
    meet in segReduceGroup. With ``reorder`` the column loops are outside the nonzeros,
    so one partial sum per lane suffices; without, the lanes step through the nonzeros
    r at a time and reduce at each step."""
    schedule = (
        f"fuse(i,j,f); pos(f,fpos,A); split(fpos,fb,f1,{8 * g}); split(f1,fg,fl,{g}); "
        "parallelize(fb,GPUBlock,IgnoreRaces); parallelize(fg,GPUThread,Atomics); "
        f"parallelize(fl,GPUGroup,{r},Segment)"
    )
    if columns:
        schedule += "; split(k,kc,kl,4); parallelize(kl,GPUThread,NoRaces)"
        schedule += "; reorder(fb,fg,kc,kl,fl)" if reorder else ""
    return schedule


GROUPS = [2, 4, 8, 16, 32]
WIDE = [(r, w * r) for r in GROUPS for w in (1, 2, 4, 8)]
WIDE_ALGS = {
    "spmv_rows": (SPMV, rows_wide),
    "spmv_nnz": (SPMV, lambda g, r: nnz_wide(g, r, columns=False)),
    "spmm_listing5": (SPMM, listing5),
    "spmm_nnz": (SPMM, lambda g, r: nnz_wide(g, r, columns=True)),
}
#: More shapes: lockstep steps (the column loop inside the group), g not a multiple of r.
WIDE_EXTRA = {
    ("spmm_nnz_steps", r, g): (SPMM, nnz_wide(g, r, columns=True, reorder=False))
    for r, g in [(2, 6), (4, 16), (8, 20), (32, 64)]
} | {
    (alg, r, g): (WIDE_ALGS[alg][0], WIDE_ALGS[alg][1](g, r))
    for alg in WIDE_ALGS
    for r, g in [(4, 6), (8, 20), (16, 40), (1, 16)]
}


def _wide_jobs() -> dict:
    cases = {(alg, r, g): (expr, f(g, r)) for alg, (expr, f) in WIDE_ALGS.items() for r, g in WIDE}
    return cases | WIDE_EXTRA


#: The shapes the quick run checks: each algorithm with a group as wide as its tile and
#: twice as wide, and the odd shapes (four times as wide, g not a multiple of r, one lane,
#: steps); the slow run checks every shape.
WIDE_QUICK = {(alg, r, g) for alg in WIDE_ALGS for r, g in [(8, 8), (2, 4)]} | {
    ("spmm_nnz_steps", 4, 16),
    ("spmm_nnz", 4, 16),
    ("spmv_nnz", 4, 6),
    ("spmm_listing5", 1, 16),
    ("spmv_rows", 16, 40),
}
WIDE_PARAMS = [pytest.param(k, marks=() if k in WIDE_QUICK else SLOW) for k in _wide_jobs()]


@pytest.fixture(scope="module")
def wide_kernels():
    jobs = {
        key: dict(expr=e, formats={"A": "csr"}, schedule=s, target="cuda", emulate=True)
        for key, (e, s) in _wide_jobs().items()
    }
    return Built(jobs)


def check_wide(k, expr: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for name, A in matrices().items():
        for columns in [3, 16, 46] if expr == SPMM else [1]:
            B = _values(rng, A.shape[1] * columns).reshape(A.shape[1], columns)
            got = k(A=A, B=B) if expr == SPMM else k(A=A, x=B[:, 0])
            want = A @ B if expr == SPMM else A @ B[:, 0]
            assert np.array_equal(got.to_numpy(), want), (name, columns)


@pytest.mark.parametrize("key", WIDE_PARAMS, ids=lambda k: "-".join(map(str, k)))
def test_groups_wider_than_their_tile(wide_kernels, key):
    check_wide(wide_kernels[key], _wide_jobs()[key][0], seed=key[2])


def test_wide_groups_keep_private_sums(wide_kernels):
    """One reduction per group after the lanes' own loops, none inside them."""
    for g in (8, 32):  # g = r too: the row's nonzeros are a serial loop inside the group
        listing = wide_kernels["spmm_listing5", 8, g].source
        assert "jpos1_acc1 = fma(A_vals[jpos], B_vals[" in listing  # a fused private sum
        assert listing.count("atomicAddGroup<double, 8>(") == 1
        assert "atomicAddGroup<double, 8>(C_vals, jpos1_cur1, jpos1_acc1)" in listing
    nnz = wide_kernels["spmm_nnz", 4, 16].source
    assert "ucf_atomic_add(&C_vals[fl_cur1], fl_acc1)" in nnz  # a finished row's sum
    assert "segReduceGroup<double, 4>(C_vals, fl_cur1, fl_acc1)" in nnz
    steps = wide_kernels["spmm_nnz_steps", 4, 16].source
    assert "fl_step" in steps and "fl_acc" not in steps


@pytest.mark.parametrize("r,g", [(8, 32), (2, 6), (32, 64)])
def test_wide_group_inside_padded_warps(r, g):
    """TACO's SDDMM with a wider group: the lanes past the group in each warp stay idle."""
    rng = np.random.default_rng(g)
    A = matrices()["empty_rows"]
    schedule = (
        "reorder(i,k,j); fuse(i,k,f); pos(f,fpos,B); split(fpos,block,fpos1,64); "
        f"split(fpos1,warp,nnz,16); split(j,dense_val,thread,{g}); "
        "parallelize(block,GPUBlock,IgnoreRaces); parallelize(warp,GPUWarp,Atomics); "
        f"parallelize(thread,GPUGroup,{r},ParallelReduction)"
    )
    expr = "A(i,k) = B(i,k) * C(i,j) * D(j,k)"
    k = ucf.compile(expr, formats={"B": "csr"}, schedule=schedule, target="cuda", emulate=True)
    for n in (5, g + 3):
        C, D = _values(rng, 40 * n).reshape(40, n), _values(rng, n * 48).reshape(n, 48)
        assert np.array_equal(k(B=A, C=C, D=D).to_numpy(), A.multiply(C @ D).toarray()), n


# ------------------------------------------------------- TACO-style SpMV, SDDMM, TTV
#: TACO's scheduleSpMMGPU (test/tests-scheduling-eval.cpp), verbatim with its defaults.
TACO_SPMM_GPU = (
    "reorder(i,j,k); fuse(i,j,f); pos(f,fpos,A); split(fpos,block,fpos1,64); "
    "split(fpos1,warp,nnz,8); split(k,dense_val_unbounded,thread,32); "
    "reorder(block,warp,thread,dense_val_unbounded,nnz); "
    "bound(dense_val_unbounded,dense_val,4,MaxExact); "
    "parallelize(block,GPUBlock,IgnoreRaces); parallelize(warp,GPUWarp,IgnoreRaces); "
    "parallelize(thread,GPUThread,Atomics)"
)


def _taco_cases():
    rng = np.random.default_rng(11)
    A = matrices()["empty_rows"]
    x = _values(rng, A.shape[1])
    C, D = _values(rng, 40 * 12).reshape(40, 12), _values(rng, 12 * 48).reshape(12, 48)
    T = rng.integers(1, 9, (9, 8, 11)) * (rng.random((9, 8, 11)) < 0.3)
    T[2] = 0
    T = T.astype(np.float64)
    c = _values(rng, 11)
    Tcsf = ucf.from_numpy(T, format="csf")
    ttv = np.einsum("ijk,k->ij", T, c)
    P = matrices()["power_law"]
    B = _values(rng, P.shape[1] * 128).reshape(P.shape[1], 128)
    return {
        # TACO's scheduleSpMMGPU: nonzeros over blocks and warps, 32 column lanes, and a
        # bound on the outer column loop (4 x 32 columns); Atomics covers the warps' rows.
        "spmm": (SPMM, {"A": "csr"}, TACO_SPMM_GPU, {"A": P, "B": B}, P @ B),
        # TACO's scheduleSpMVGPU: nonzeros split into blocks, warps and threads.
        "spmv": (
            SPMV,
            {"A": "csr"},
            "fuse(i,j,f); pos(f,fpos,A); split(fpos,block,fpos1,128); "
            "split(fpos1,warp,fpos2,64); split(fpos2,thread,thread_nz,2); "
            "parallelize(block,GPUBlock,IgnoreRaces); parallelize(warp,GPUWarp,IgnoreRaces); "
            "parallelize(thread,GPUThread,Atomics)",
            {"A": A, "x": x},
            A @ x,
        ),
        # TACO's scheduleSpMVRowsGPU: a warp's lanes split a row and reduce it.
        "spmv_rows": (
            SPMV,
            {"A": "csr"},
            "split(i,block,warp,4); pos(j,jpos,A); split(jpos,thread_nz,thread,32); "
            "reorder(block,warp,thread,thread_nz); parallelize(block,GPUBlock,NoRaces); "
            "parallelize(warp,GPUWarp,NoRaces); parallelize(thread,GPUThread,Temporary)",
            {"A": A, "x": x},
            A @ x,
        ),
        # TACO's scheduleSDDMMGPU: nonzeros of B per warp, j over the lanes.
        "sddmm": (
            "A(i,k) = B(i,k) * C(i,j) * D(j,k)",
            {"B": "csr"},
            "reorder(i,k,j); fuse(i,k,f); pos(f,fpos,B); split(fpos,block,fpos1,64); "
            "split(fpos1,warp,nnz,16); split(j,dense_val,thread,32); "
            "parallelize(block,GPUBlock,IgnoreRaces); parallelize(warp,GPUWarp,Atomics); "
            "parallelize(thread,GPUThread,ParallelReduction)",
            {"B": A, "C": C, "D": D},
            A.multiply(C @ D).toarray(),
        ),
        # TACO's scheduleTTVGPU: every nonzero of the CSF tensor, fused over its levels.
        "ttv": (
            "A(i,j) = B(i,j,k) * c(k)",
            {"B": "csf"},
            "fuse(i,j,f); fuse(f,k,g); pos(g,gpos,B); split(gpos,block,g1,64); "
            "split(g1,warp,g2,32); split(g2,thread,thread_nz,1); "
            "parallelize(block,GPUBlock,IgnoreRaces); parallelize(warp,GPUWarp,IgnoreRaces); "
            "parallelize(thread,GPUThread,Atomics)",
            {"B": Tcsf, "c": c},
            ttv,
        ),
        # Fibres (i, j) balanced over threads: each output entry has one writer.
        "ttv_fibres": (
            "A(i,j) = B(i,j,k) * c(k)",
            {"B": "csf"},
            "fuse(i,j,f); pos(f,fpos,B); split(fpos,block,f1,64); split(f1,thread,nz,2); "
            "parallelize(block,GPUBlock,NoRaces); parallelize(thread,GPUThread,NoRaces)",
            {"B": Tcsf, "c": c},
            ttv,
        ),
        # A scalar result: partial sums of a block's threads meet in one group reduction.
        "dot": (
            "s = a(i) * b(i)",
            {},
            "split(i,i0,i1,32); parallelize(i0,GPUBlock,Atomics); "
            "parallelize(i1,GPUGroup,32,ParallelReduction)",
            {"a": x, "b": x[::-1].copy()},
            x @ x[::-1],
        ),
    }


@pytest.fixture(scope="module")
def taco_kernels():
    cases = _taco_cases()
    jobs = {
        name: dict(expr=e, formats=f, schedule=s, target="cuda", emulate=True)
        for name, (e, f, s, _, _) in cases.items()
    }
    return {name: (k, cases[name][3], cases[name][4]) for name, k in build(jobs).items()}


@pytest.mark.parametrize("name", list(_taco_cases()))
def test_taco_style_gpu_schedules(taco_kernels, name):
    k, operands, expected = taco_kernels[name]
    assert np.allclose(k(**operands).to_numpy(), expected)


def test_taco_spmm_bound_is_checked_and_its_adds_are_atomic(taco_kernels):
    """The bounded column loop runs ceil(N / 32) = 4 times: N from 97 to 128. The warps'
    nonzeros may share a row, and Atomics on the column lanes makes those adds atomic
    (as in TACO, whose Atomics covers the reductions in the loop's body)."""
    k, operands, _ = taco_kernels["spmm"]
    assert "ucf_atomic_add(&C_vals[" in k.source
    A = operands["A"]
    rng = np.random.default_rng(3)
    B = _values(rng, A.shape[1] * 100).reshape(A.shape[1], 100)
    assert np.array_equal(k(A=A, B=B).to_numpy(), A @ B)
    with pytest.raises(ucf.ShapeError, match=re.escape("ceil(k / 32) times, which is 3")):
        k(A=A, B=B[:, :96])


# ------------------------------------------------------- differential: cuda vs llvm
DIFFERENTIAL = [
    # expression, formats, schedule, what k.cin says
    (SPMV, {"A": "csr"}, None, "loop i_blk runs in parallel (GPUBlock, NoRaces)"),
    # j first, a reduction: no output variable can move outside it, so it adds atomically
    (SPMV, {"A": "csc"}, None, "loop j_thr runs in parallel (GPUThread, Atomics)"),
    # the dense k moves outside the summing column blocks: a thread per column of C
    (SPMM, {"A": "bcsc(4,4)"}, None, "k moved outermost"),
    (SPMM, {"A": "csc"}, None, "k moved outermost"),
    (SPMM, {"A": "csr"}, eb_seg(8), "loop fl runs in parallel (GPUGroup, 8, Segment)"),
    ("M(i,j) = X(i,j,k) * v(k) + W(i,j)", {"X": "csf"}, None, "single GPU thread"),
    ("y(i) = A(i,j) * x(j) + z(i)", {"A": "csr"}, None, "(default schedule)"),
    # One launch per row from a host loop; each block's partial sum added atomically.
    (SPMV, {"A": "csr"}, "parallelize(j,GPUBlock,Atomics)", "loop j runs in parallel"),
    # A scalar output: every thread adds its partial sum atomically.
    (
        "s = a(i) * b(i)",
        {},
        "split(i,i0,i1,64); parallelize(i0,GPUBlock,Atomics); parallelize(i1,GPUThread,Atomics)",
        "loop i1 runs in parallel (GPUThread, Atomics)",
    ),
]


@pytest.mark.parametrize("expr,formats,schedule,note", DIFFERENTIAL)
def test_emulated_cuda_matches_llvm(expr, formats, schedule, note):
    rng = np.random.default_rng(13)
    shapes = {"A": (30, 20), "x": (20,), "z": (30,), "B": (20, 7), "X": (6, 5, 4)}
    shapes |= {"v": (4,), "W": (6, 5), "a": (300,), "b": (300,)}
    k = ucf.compile(expr, formats=formats, schedule=schedule, target="cuda", emulate=True)
    ref = ucf.compile(expr, formats=formats)
    names = sorted(set(re.findall(r"([A-Za-z]\w*)\(", expr.split("=")[1])))
    ops = {}
    for n in names:
        dense = rng.random(shapes[n]) * (rng.random(shapes[n]) < 0.4)
        ops[n] = ucf.from_numpy(dense, format=formats.get(n, "dense"))
    assert np.allclose(k(**ops).to_numpy(), ref(**ops).to_numpy())
    assert note in k.cin, k.cin


# ------------------------------------------------------- illegal GPU schedules
@pytest.mark.parametrize(
    "expr,schedule,message",
    [
        (
            SPMV,
            "split(i,b,t,32); parallelize(b,GPUBlock,NoRaces); parallelize(t,GPUGroup,12,Segment)",
            "power of two no larger than 32, got 12",
        ),
        (
            SPMV,
            "split(i,b,t,64); parallelize(b,GPUBlock,NoRaces); parallelize(t,GPUGroup,64,Segment)",
            "power of two no larger than 32, got 64",
        ),
        (SPMV, "split(i,b,t,32); parallelize(t,GPUThread,NoRaces)", "not inside a GPUBlock"),
        (
            SPMV,
            "split(i,b,t,32); parallelize(b,GPUThread,NoRaces); parallelize(t,GPUBlock,NoRaces)",
            "b is not inside a GPUBlock",
        ),
        (
            SPMM,
            "split(i,b,t,8); split(k,k0,k1,4); parallelize(b,GPUBlock,NoRaces); "
            "parallelize(t,GPUThread,NoRaces); parallelize(k1,GPUGroup,4,Segment)",
            "nothing to reduce",
        ),
        (
            SPMV,
            "parallelize(i,GPUBlock,NoRaces); parallelize(j,GPUThread,Atomics)",
            "no trip count known",
        ),
        (
            SPMV,
            "split(i,b,t,2048); parallelize(b,GPUBlock,NoRaces); parallelize(t,GPUThread,NoRaces)",
            "at most 1024",
        ),
        (
            SPMV,
            "pos(j,jpos,A); split(jpos,j0,j1,8); parallelize(i,GPUBlock,NoRaces); "
            "parallelize(j1,GPUThread,NoRaces)",
            "running sum t0",
        ),
        (
            SPMV,
            "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,t,64); "
            "parallelize(b,GPUBlock,IgnoreRaces); parallelize(t,GPUThread,NoRaces)",
            "j is a reduction variable",
        ),
        (
            SPMV,
            "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,t,64); "
            "parallelize(b,GPUBlock,IgnoreRaces); parallelize(t,GPUGroup,32,ParallelReduction)",
            "use Segment",
        ),
        (
            SPMV,
            "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,f1,64); split(f1,t,l,8); "
            "parallelize(b,GPUBlock,IgnoreRaces); parallelize(t,GPUThread,Atomics); "
            "parallelize(l,GPUGroup,8,ParallelReduction)",
            "use Segment",
        ),
        (
            SPMV,
            "split(i,b,t,32); parallelize(b,GPUBlock,NoRaces); parallelize(t,CPUThread,NoRaces)",
            "CPU units need target 'llvm' or 'c'",
        ),
        (
            SPMM,
            "split(i,b,w,8); split(k,k0,k1,64); parallelize(b,GPUBlock,NoRaces); "
            "parallelize(w,GPUWarp,NoRaces); parallelize(k1,GPUThread,NoRaces)",
            "a warp has 32 lanes",
        ),
    ],
)
def test_illegal_gpu_schedules(expr, schedule, message):
    with pytest.raises(ucf.ScheduleError, match=re.escape(message)):
        ucf.compile(expr, formats={"A": "csr"}, schedule=schedule, target="cuda")


def test_cuda_refuses_what_it_cannot_build():
    with pytest.raises(ucf.UnsupportedError, match="dense outputs only"):
        ucf.compile(
            "C(i,j) = A(i,j) + B(i,j)", formats={"A": "csr", "B": "csr", "C": "csr"}, target="cuda"
        )
    with pytest.raises(ucf.UnsupportedError, match="precompute"):
        ucf.compile(
            "C(i,k) = A(i,j) * B(j,k)",
            formats={"A": "csr"},
            target="cuda",
            schedule="precompute(A(i,j)*B(j,k),k,k,w)",
        )
    with pytest.raises(ucf.UcfError, match="needs target='cuda'"):
        ucf.compile(SPMV, target="llvm", emulate=True)


def test_running_on_a_gpu_without_pycuda_says_how_to_emulate():
    try:
        import pycuda  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pycuda is installed")
    k = ucf.compile(SPMV, formats={"A": "csr"}, target="cuda")
    assert "__global__" in k.source  # compiling needs neither pycuda nor nvcc
    A = matrices()["empty_rows"]
    with pytest.raises(ucf.UcfError, match=r"pycuda.*emulate=True"):
        k(A=A, x=np.ones(A.shape[1]))


# ------------------------------------------------------- saving and the command line
def test_save_writes_a_standalone_cu(tmp_path):
    k = ucf.compile(SPMM, formats={"A": "csr"}, schedule=eb_seg(8), target="cuda")
    cu, h = k.save(tmp_path / "spmm")
    assert cu.suffix == ".cu" and h.suffix == ".h"
    assert "int spmm(" in h.read_text() and "spmm_k0" in cu.read_text()
    assert (tmp_path / "ucf_cuda.cuh").exists() and (tmp_path / "ucf_cuda_emu.h").exists()
    cmd = ["g++", *EMULATION_FLAGS, "-Wall", "-Werror", "-x", "c++", "-c", "-o", "spmm.o"]
    proc = subprocess.run([*cmd, str(cu)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@needs_nvcc
def test_saved_cu_files_compile_with_nvcc_together(tmp_path):
    """Two kernels exported under their own names compile with nvcc (-c, no GPU
    needed) in one translation unit, so none of their symbols clash."""
    ucf.compile(SPMM, formats={"A": "csr"}, target="cuda").save(tmp_path / "spmm")
    ucf.compile(SPMV, formats={"A": "csr"}, target="cuda").save(tmp_path / "mv", name="spmv")
    (tmp_path / "both.cu").write_text('#include "spmm.cu"\n#include "mv.cu"\n')
    cmd = [nvcc_path(), "-c", "-arch=sm_80", *NVCC_FLAGS, "both.cu", "-o", "both.o"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "int spmv(" in (tmp_path / "mv.h").read_text()


def test_cli_runs_emulated_cuda(tmp_path, capsys):
    A = matrices()["dense_row"]
    sp.save_npz(tmp_path / "a.npz", A)
    np.save(tmp_path / "x.npy", np.arange(A.shape[1], dtype=np.float64))
    inputs = ["-f", "A:csr", "-i", f"A:{tmp_path / 'a.npz'}", "-i", f"x:{tmp_path / 'x.npy'}"]
    schedule = (
        "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,f1,64); split(f1,t,l,8); "
        "parallelize(b,GPUBlock,IgnoreRaces); parallelize(t,GPUThread,Atomics); "
        "parallelize(l,GPUGroup,8,Segment)"
    )
    argv = ["run", SPMV, *inputs, "-o", f"y:{tmp_path / 'y.npy'}", "-s", schedule]
    assert main([*argv, "--target", "cuda", "--emulate"]) == 0, capsys.readouterr().err
    assert np.array_equal(np.load(tmp_path / "y.npy"), A @ np.arange(A.shape[1]))
    try:
        import pycuda  # noqa: F401
    except ImportError:
        assert main(["run", SPMV, *inputs, "--target", "cuda"]) == 1
        assert "--emulate" in capsys.readouterr().err


# ------------------------------------------------------- nvcc
def _batch(sources: list[str]) -> str:
    """One translation unit from many kernels (nvcc's start-up dominates its time)."""
    return "\n".join(
        re.sub(r"\bkernel_(k\d+|launch)\b", rf"kernel{n}_\1", s) for n, s in enumerate(sources)
    )


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", pytest.param("sm_90", marks=SLOW)])
def test_generated_kernels_compile_with_nvcc(sgap_kernels, taco_kernels, arch):
    sources = [sgap_kernels[alg, n].source for alg in SGAP for n in QUICK_SIZES]
    sources += [k.source for k, _, _ in taco_kernels.values()]
    for dtype in ("float32", "int32", "int64"):
        for f in SGAP.values():
            k = ucf.compile(SPMM, formats={"A": "csr"}, schedule=f(16), target="cuda", dtype=dtype)
            sources.append(k.source)
    for expr, formats, schedule, _ in DIFFERENTIAL:
        sources.append(ucf.compile(expr, formats=formats, schedule=schedule, target="cuda").source)
    for held in ("float16", "int8", "uint8"):  # values widened on load (__half on a GPU)
        fmts = {"A": f"csr@{held}", "B": f"dense@{held}"}
        sources.append(ucf.compile(SPMM, formats=fmts, target="cuda", dtype="float32").source)
    for expr in ("y(i) = A(i,k) * x(k)", SPMM):  # the default over blocks and thread tiles
        sources.append(ucf.compile(expr, formats={"A": "bcsr(32,32)"}, target="cuda").source)
    nvcc_check(_batch(sources), arch)


@needs_nvcc
def test_wide_group_kernels_compile_with_nvcc(wide_kernels):
    nvcc_check(_batch([wide_kernels[key].source for key in sorted(WIDE_QUICK)]), "sm_80")


# ------------------------------------------------------- a real GPU (conftest's device)
@pytest.mark.gpu
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("alg", list(SGAP))
def test_sgap_spmm_on_a_gpu(device, alg, size):
    k = ucf.compile(SPMM, formats={"A": "csr"}, schedule=SGAP[alg](size), target="cuda")
    rng = np.random.default_rng(size)
    for columns in COLUMNS:
        for name, A in matrices().items():
            B = _values(rng, A.shape[1] * columns).reshape(A.shape[1], columns)
            assert np.array_equal(k(A=A, B=B).to_numpy(), A @ B), (alg, size, columns, name)


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(_wide_jobs()), ids=lambda k: "-".join(map(str, k)))
def test_groups_wider_than_their_tile_on_a_gpu(device, key):
    expr, schedule = _wide_jobs()[key]
    k = ucf.compile(expr, formats={"A": "csr"}, schedule=schedule, target="cuda")
    check_wide(k, expr, seed=key[2])


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(_taco_cases()))
def test_taco_style_on_a_gpu(device, name):
    expr, formats, schedule, operands, expected = _taco_cases()[name]
    k = ucf.compile(expr, formats=formats, schedule=schedule, target="cuda")
    assert np.allclose(k(**operands).to_numpy(), expected)
