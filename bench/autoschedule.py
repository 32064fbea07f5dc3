"""Fast without a hand-written schedule? ucf's default and tuned kernels against its best hand
schedule, scipy and MKL on a suite of matrices and 3-tensors (issue 17, Performance).

Run from the repository root:

    python bench/autoschedule.py                     # 21 matrices of 50k rows, 1 and 2 threads
    python bench/autoschedule.py --rows 200000 --threads 2 --json /tmp/a.json --plot /tmp/a.png
    python bench/autoschedule.py --mtx web-Google.mtx --kernels spmv,spmm32 --trials 20
    python bench/autoschedule.py --rows 2000 --quick # smoke test: seconds
    python bench/autoschedule.py --search-formats --threads 1 --clock cpu --kernels spmv,spmm32
    python bench/autoschedule.py --headroom         # the tuner where the default leaves headroom

``--headroom`` runs the suite of ``headroom.py`` instead (its options follow): SDDMM,
MTTKRP, TTV, SpGEMM, a sum of two SpGEMMs, batch-1 convolutions and wide SpMM, each
tuned with 50 trials and measured against an exhaustive sweep of the same space.

Users write a statement and formats, not the schedules of ``parallel.py``,
so what they get is ucf's default.  Every kernel here is therefore timed in
five columns side by side, in one process, on the same operands, the runs
interleaved: ucf with no schedule, ucf tuned (``ucf.tune`` with ``--trials``
trials), ucf's best hand schedule (the tables of ``parallel.py``; the
kernels it does not cover have theirs below), scipy (numpy where scipy has
no kernel) and MKL through ``sparse_dot_mkl`` where MKL has the kernel
(SpMV, SpMM, SpGEMM).  Every result is checked against scipy's before any
timing; a wrong one is reported, never timed.

``ucf.tune`` is expected as ``ucf.tune(stmt, formats=..., trials=50,
seed=0, storage=..., **operands) -> Tuned`` with ``.schedule``, ``.time``,
``.default_time`` and ``.kernel`` (the compiled best); each study gets a
fresh in-memory Optuna storage so no study resumes another matrix's.
Without ``ucf.tune`` the tuned column reads "not available".  A study that
keeps the default (``Tuned.is_default``) returns the default kernel, so its
column shows the default column's samples (``kept_default`` in the JSON): two
timings of one kernel differ by up to 25 % on a busy machine, and that noise
would be read as a speed-up or a loss.

``--search-formats`` adds a sixth column, tuned over the inputs' formats as
well as the schedule (``search_formats=True``: ``bcsr`` block shapes and ``ell``
where the matrix fills them, and a dense factor in the mode order the loops walk,
SDDMM's ``D`` column-major).  Its kernel is timed on operands converted once
beforehand, so ``t_default/t_tuned+formats`` compares kernel times; the
conversion (timed with ``--clock``) and the number of calls it takes to pay for
itself are reported beside it, and the grades get a row for its geomean.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import re
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import parallel as par  # noqa: E402
from spmv_spmm import load_mkl  # noqa: E402

import ucf  # noqa: E402

base = par.base
med = par.med
RowError = par.RowError

DTYPE = "float64"
SDDMM_K = 32  # inner dimension of SDDMM's dense factors
MTTKRP_R = 32  # rank of MTTKRP's factor matrices
UCF_COLUMNS = ("default", "tuned", "hand")
TUNED_FORMATS = "tuned_formats"  # the --search-formats column
#: Canonical formats by the names a reader knows (``format_name``).
FORMAT_NAMES = (
    (r"UCUU:0/(\d+),1/(\d+),0%\d+,1%\d+", "bcsr({},{})"),
    (r"UCUU:0,1/(\d+),0%1,1%\d+", "bcsr(1,{})"),
    (r"UCUU:0/(\d+),1,0%\d+,1%1", "bcsr({},1)"),
    (r"UF(\d+)", "ell({})"),
    (r"UU:1,0", "column-major"),
    (r"UC", "csr"),
    (r"UC:1,0", "csc"),
    (r"CC", "dcsr"),
    (r"CC:1,0", "dcsc"),
)

# Targets of issue 17.
DEFAULT_VS_HAND_MAX = 1.15  # t_default / t_hand on every row
TUNED_VS_DEFAULT_MIN = 1.3  # geomean t_default / t_tuned (WACO's bar)
TUNE_SECONDS_MAX = 60.0  # one 50-trial SpMM study on a 200k-row matrix
TUNE_TARGET_ROWS = 200_000
TUNE_TARGET_TRIALS = 50
MKL_TARGET_KERNELS = ("spmv", "spmm32", "spmm128")
MKL_TARGET_THREADS = 2
PILOT_SHARE = 1000  # SpGEMM's too-slow guard runs 1/PILOT_SHARE of the rows, and half that
PILOT_ROWS = 8  # the least of the smaller share
LOAD_SECONDS = 0.05  # more than loading a kernel takes
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # --clock


# --------------------------------------------------------------------------- inputs


def from_pairs(n_rows: int, n_cols: int, rows: np.ndarray, cols: np.ndarray, rng) -> sp.csr_matrix:
    """Canonical CSR from unsorted (row, col) pairs, duplicates dropped, random values."""
    keys = np.sort(rows.astype(np.int64) * n_cols + cols.astype(np.int64))
    keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if len(keys) else keys
    return base._csr(n_rows, n_cols, keys // n_cols, keys % n_cols, rng)


def by_lengths(n_rows: int, n_cols: int, lengths: np.ndarray, rng, cols=None) -> sp.csr_matrix:
    """Rows with the given lengths; columns uniform unless ``cols`` draws them."""
    lengths = np.minimum(lengths.astype(np.int64), n_cols)
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), lengths)
    c = rng.integers(0, n_cols, size=len(rows)) if cols is None else cols(len(rows))
    return from_pairs(n_rows, n_cols, rows, c, rng)


def powerlaw(n: int, a: float, scale: int, rng) -> sp.csr_matrix:
    """Zipf(a) row lengths times ``scale``, capped at n/10: a few very long rows."""
    return by_lengths(n, n, np.minimum(rng.zipf(a, n) * scale, max(1, n // 10)), rng)


def zipf_columns(n: int, per_row: int, rng) -> sp.csr_matrix:
    """Even rows, but columns drawn from a Zipf law: x is read very unevenly."""
    perm = rng.permutation(n)
    return by_lengths(n, n, np.full(n, per_row), rng, lambda k: perm[(rng.zipf(1.6, k) - 1) % n])


def block_diagonal(n: int, block: int, density: float, rng) -> sp.csr_matrix:
    starts = np.arange(0, n, block)
    size = np.minimum(block, n - starts)
    k = int(density * block * block)
    b = np.repeat(np.arange(len(starts)), k)
    r = starts[b] + rng.integers(0, block, len(b)) % size[b]
    c = starts[b] + rng.integers(0, block, len(b)) % size[b]
    return from_pairs(n, n, r, c, rng)


def empty_rows(n: int, empty: float, per_row: int, rng) -> sp.csr_matrix:
    return by_lengths(n, n, np.where(rng.random(n) < empty, 0, per_row), rng)


def dense_rows(n: int, count: int, per_row: int, rng) -> sp.csr_matrix:
    lengths = np.full(n, per_row)
    lengths[rng.choice(n, size=count, replace=False)] = n
    m = by_lengths(n, n, lengths, rng)
    return m


def near_diagonal(n: int, extra: int, reach: int, rng) -> sp.csr_matrix:
    """The diagonal plus ``extra`` entries per row within ``reach`` of it."""
    rows = np.repeat(np.arange(n, dtype=np.int64), extra + 1)
    off = rng.integers(-reach, reach + 1, size=len(rows))
    off[:: extra + 1] = 0
    return from_pairs(n, n, rows, np.clip(rows + off, 0, n - 1), rng)


def arrowhead(n: int, width: int, rng) -> sp.csr_matrix:
    """Dense first ``width`` rows and columns and the diagonal."""
    d = np.arange(n, dtype=np.int64)
    head = np.arange(width, dtype=np.int64)
    rows = np.concatenate([d, np.repeat(head, n), np.tile(d, width)])
    cols = np.concatenate([d, np.tile(d, width), np.repeat(head, n)])
    return from_pairs(n, n, rows, cols, rng)


def clustered(n: int, runs: int, run: int, rng) -> sp.csr_matrix:
    """``runs`` runs of ``run`` consecutive columns per row at random places (mesh-like)."""
    rows = np.repeat(np.arange(n, dtype=np.int64), runs * run)
    starts = np.repeat(rng.integers(0, max(1, n - run), size=n * runs), run)
    return from_pairs(n, n, rows, starts + np.tile(np.arange(run), n * runs), rng)


def matrix_suite(n: int) -> dict[str, tuple[str, Callable[[Any], sp.csr_matrix]]]:
    """name -> (what it is, generator taking a seeded Generator); sizes scale with n rows."""
    scale = max(4, round(math.log2(n)))
    return {
        "uniform-10": ("10 random columns per row", lambda g: base.uniform(n, 10, g)),
        "uniform-3": ("3 random columns per row", lambda g: base.uniform(n, 3, g)),
        "uniform-40-n/4": ("n/4 rows, 40 per row", lambda g: base.uniform(n // 4, 40, g)),
        "uniform-5-2n": ("2n rows, 5 per row", lambda g: base.uniform(2 * n, 5, g)),
        "powerlaw-2.0": ("Zipf(2.0) row lengths x2", lambda g: powerlaw(n, 2.0, 2, g)),
        "powerlaw-2.5": ("Zipf(2.5) row lengths x5", lambda g: powerlaw(n, 2.5, 5, g)),
        "zipf-columns": ("10 per row, Zipf(1.6) columns", lambda g: zipf_columns(n, 10, g)),
        "rmat-8": (f"R-MAT 2^{scale}, edge factor 8", lambda g: base.rmat(scale, 8, g)),
        "rmat-16-mild": (
            f"R-MAT 2^{scale}, ef 16, a/b/c/d .45/.15/.15/.25",
            lambda g: base.rmat(scale, 16, g, (0.45, 0.15, 0.15, 0.25)),
        ),
        "banded-15": ("15 diagonals", lambda g: base.banded(n, 15, g)),
        "banded-63-n/4": ("n/4 rows, 63 diagonals", lambda g: base.banded(n // 4, 63, g)),
        "blockdiag-32": ("32x32 blocks, 50% full", lambda g: block_diagonal(n, 32, 0.5, g)),
        "blockdiag-256": ("256x256 blocks, 5% full", lambda g: block_diagonal(n, 256, 0.05, g)),
        "empty-rows-90": ("90% rows empty, 30 per row", lambda g: empty_rows(n, 0.9, 30, g)),
        "empty-rows-50": ("50% rows empty, 10 per row", lambda g: empty_rows(n, 0.5, 10, g)),
        "dense-rows": ("5 full rows, 4 per other row", lambda g: dense_rows(n, 5, 4, g)),
        "tall-skinny": (
            "n x n/32, 8 per row",
            lambda g: by_lengths(n, max(1, n // 32), np.full(n, 8), g),
        ),
        "short-wide": (
            "n/32 x n, 256 per row",
            lambda g: by_lengths(max(1, n // 32), n, np.full(max(1, n // 32), 256), g),
        ),
        "diagonal-ish": ("diagonal + 4 within 64", lambda g: near_diagonal(n, 4, 64, g)),
        "arrowhead": ("3 full rows and columns + diagonal", lambda g: arrowhead(n, 3, g)),
        "clustered": ("2 runs of 8 columns per row", lambda g: clustered(n, 2, 8, g)),
    }


def read_mtx(path: str) -> sp.csr_matrix:
    import scipy.io

    m = sp.csr_matrix(scipy.io.mmread(path), dtype=np.float64)
    m.sum_duplicates()
    m.sort_indices()
    return m


@dataclass
class Tensor3:
    """A sparse 3-tensor as sorted unique coordinates, with its ucf (csf) and matricized
    scipy forms built once."""

    shape: tuple[int, int, int]
    coords: np.ndarray  # (nnz, 3), lexicographically sorted
    vals: np.ndarray
    _ucf: Any = None
    _mat: Any = None

    @property
    def nnz(self) -> int:
        return len(self.vals)

    def ucf(self) -> ucf.Tensor:
        if self._ucf is None:
            self._ucf = ucf.from_coo(self.coords, self.vals, self.shape, format="csf")
        return self._ucf

    def matricized(self) -> sp.csr_matrix:
        """B(i,j,k) as the (I*J) x K matrix: TTV is then scipy's SpMV."""
        if self._mat is None:
            i, j, k = self.coords.T
            n_i, n_j, n_k = self.shape
            self._mat = base._csr(n_i * n_j, n_k, i * n_j + j, k, np.random.default_rng(0))
            self._mat.data[:] = self.vals
        return self._mat


def tensor3(n: int, nnz: int, skewed: bool, rng) -> Tensor3:
    """n^3 with about ``nnz`` entries; ``skewed`` draws the first mode from Zipf(1.5),
    so a few slices hold most entries."""
    c = rng.integers(0, n, size=(nnz, 3), dtype=np.int64)
    if skewed:
        c[:, 0] = rng.permutation(n)[(rng.zipf(1.5, nnz) - 1) % n]
    keys = np.sort((c[:, 0] * n + c[:, 1]) * n + c[:, 2])
    keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    coords = np.stack([keys // (n * n), keys // n % n, keys % n], axis=1)
    return Tensor3((n, n, n), coords, rng.uniform(-1.0, 1.0, len(keys)))


def tensor_suite(n_rows: int) -> dict[str, tuple[str, Callable[[Any], Tensor3]]]:
    n = max(16, n_rows // 50)
    nnz = 10 * n_rows
    return {
        "tensor-uniform": (f"{n}^3, {nnz} random entries", lambda g: tensor3(n, nnz, False, g)),
        "tensor-powerlaw": (f"{n}^3, Zipf(1.5) slices", lambda g: tensor3(n, nnz, True, g)),
    }


# --------------------------------------------------------------------------- kernels


@dataclass
class Case:
    """One kernel on one input: ucf's operands, the reference result, the scipy and MKL
    contenders, and (SpGEMM) two pilot problems for the too-slow guard: (rows, operands)
    with A cut to its first rows, fewer first."""

    operands: dict[str, Any]
    expect: Any  # ndarray, or a scipy sparse matrix for sparse results
    scipy: Callable[[], Any]
    mkl: Callable[[], Any] | None = None
    rows: int = 0
    pilots: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class Spec:
    name: str
    statement: str
    formats: dict[str, str]
    hand: dict[str, str]
    build: Callable[[Any, Any, Any], Case]  # (input, rng, mkl module or None) -> Case
    order: int = 2  # the inputs it runs on: 2 matrices, 3 tensors
    sparse_out: bool = False


def _hand(table: dict[str, str | None]) -> dict[str, str]:
    """A parallel.py table without its 'default' entry: the default is a column of its own."""
    return {k: v for k, v in table.items() if v is not None}


def _rows_then(chunks: tuple[int, ...], then: str = "", label: str = "") -> dict[str, str]:
    """The first loop in parallel, whole or split into ``chunks``, after the commands
    ``then`` (named ``label`` in the variant's name)."""
    out = {f"{label}par i": f"{then}parallelize(i,CPUThread,NoRaces)"}
    out.update({f"{label}split {c}": f"{then}{par.split_par(c)}" for c in chunks})
    return out


# Kernels parallel.py does not cover: row (first-mode) splits, with the dense width bound.
SDDMM_HAND = {
    **_rows_then((16, 256)),
    **_rows_then((64,), f"bound(k,kb,{SDDMM_K},MaxExact); ", "bound K, "),
}
TTV_HAND = _rows_then((16, 256))
MTTKRP_HAND = {
    **_rows_then((4, 64)),
    **_rows_then((4,), f"bound(j,jb,{MTTKRP_R},MaxExact); ", "bound R, "),
}


def _uniform(rng, shape) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape)


def dense_builder(n: int | None) -> Callable:
    """SpMV (``n`` None: a vector x) or SpMM with an N-column dense B, row-major."""

    def build(m: sp.csr_matrix, rng, mkl) -> Case:
        name = "x" if n is None else "B"
        b = _uniform(rng, m.shape[1] if n is None else (m.shape[1], n))
        return Case(
            {"A": ucf.from_scipy(m, format="csr"), name: b},
            m @ b,
            lambda: m @ b,
            None if mkl is None else (lambda: mkl.dot_product_mkl(m, b)),
            m.shape[0],
        )

    return build


def sddmm_numpy(m: sp.csr_matrix, rows: np.ndarray, b: np.ndarray, dt: np.ndarray):
    """C = A .* (B @ D) at A's nonzeros, in chunks so the gathered factors stay small."""
    out = np.empty(m.nnz)
    step = 1 << 16
    for s in range(0, m.nnz, step):
        e = min(s + step, m.nnz)
        out[s:e] = m.data[s:e] * np.einsum("ik,ik->i", b[rows[s:e]], dt[m.indices[s:e]])
    return sp.csr_matrix((out, m.indices, m.indptr), shape=m.shape)


def build_sddmm(m: sp.csr_matrix, rng, mkl) -> Case:
    b = _uniform(rng, (m.shape[0], SDDMM_K))
    d = _uniform(rng, (SDDMM_K, m.shape[1]))
    dt = np.ascontiguousarray(d.T)
    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    return Case(
        {"A": ucf.from_scipy(m, format="csr"), "B": b, "D": d},
        sddmm_numpy(m, rows, b, dt),
        lambda: sddmm_numpy(m, rows, b, dt),
        rows=m.shape[0],
        note="scipy column: numpy gather + einsum at A's nonzeros",
    )


def spgemm_operand(m: sp.csr_matrix) -> sp.csr_matrix:
    """A itself when square, else its transpose (so A @ B is defined)."""
    if m.shape[0] == m.shape[1]:
        return m
    t = m.T.tocsr()
    t.sort_indices()
    return t


def spgemm_flops(a: sp.csr_matrix, b: sp.csr_matrix) -> int:
    """Multiply-adds of A @ B: the sum over j of nnz(A[:, j]) * nnz(B[j, :])."""
    col = np.bincount(a.indices, minlength=a.shape[1])
    return int(np.dot(col.astype(np.int64), np.diff(b.indptr).astype(np.int64)))


def build_spgemm(m: sp.csr_matrix, rng, mkl, max_flops: float = math.inf) -> Case:
    b = spgemm_operand(m)
    flops = spgemm_flops(m, b)
    if flops > max_flops:
        raise RowError(
            "skipped",
            f"A @ B needs {flops:.1e} multiply-adds (limit {max_flops:.0e}, --spgemm-max-flops)",
        )
    # The pilots multiply A's first rows by the whole of B: a plan that co-iterates every
    # (i, k) pair costs as much per row there as at full size, so scaling by rows is fair.
    bt = ucf.from_scipy(b, format="csr")
    pilots = []
    share = max(PILOT_ROWS, m.shape[0] // (2 * PILOT_SHARE))
    for p in (share, 2 * share):
        pa = m[:p]
        pilots.append((pa.shape[0], {"A": ucf.from_scipy(pa, format="csr"), "B": bt}))
    return Case(
        {"A": ucf.from_scipy(m, format="csr"), "B": ucf.from_scipy(b, format="csr")},
        m @ b,
        lambda: m @ b,
        None if mkl is None else (lambda: mkl.dot_product_mkl(m, b)),
        m.shape[0],
        pilots,
        note="A @ A, or A @ A.T when A is not square",
    )


def build_ttv(t: Tensor3, rng, mkl) -> Case:
    c = _uniform(rng, t.shape[2])
    mat = t.matricized()
    return Case(
        {"B": t.ucf(), "c": c},
        (mat @ c).reshape(t.shape[:2]),
        lambda: (mat @ c).reshape(t.shape[:2]),
        rows=t.shape[0],
        note="scipy column: SpMV on the (I*J) x K matricization",
    )


def mttkrp_numpy(t: Tensor3, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    """A(i,:) = sum over B's nonzeros (i,k,l) of B(i,k,l) * C(k,:) * D(l,:), in chunks."""
    out = np.zeros((t.shape[0], c.shape[1]))
    i, k, lv = t.coords.T
    step = 1 << 16
    for s in range(0, t.nnz, step):
        e = min(s + step, t.nnz)
        prod = t.vals[s:e, None] * c[k[s:e]] * d[lv[s:e]]
        ii = i[s:e]
        starts = np.flatnonzero(np.concatenate(([True], ii[1:] != ii[:-1])))
        out[ii[starts]] += np.add.reduceat(prod, starts, axis=0)
    return out


def build_mttkrp(t: Tensor3, rng, mkl) -> Case:
    c = _uniform(rng, (t.shape[1], MTTKRP_R))
    d = _uniform(rng, (t.shape[2], MTTKRP_R))
    return Case(
        {"B": t.ucf(), "C": c, "D": d},
        mttkrp_numpy(t, c, d),
        lambda: mttkrp_numpy(t, c, d),
        rows=t.shape[0],
        note="scipy column: numpy, chunked over the nonzeros",
    )


def kernel_specs(max_flops: float) -> dict[str, Spec]:
    csr = {"A": "csr"}
    return {
        "spmv": Spec("spmv", par.SPMV, csr, _hand(par.SPMV_SCHEDULES), dense_builder(None)),
        "spmm32": Spec("spmm32", par.SPMM, csr, _hand(par.spmm_schedules(32)), dense_builder(32)),
        "spmm128": Spec(
            "spmm128", par.SPMM, csr, _hand(par.spmm_schedules(128)), dense_builder(128)
        ),
        "sddmm": Spec(
            "sddmm",
            "C(i,j) = A(i,j) * B(i,k) * D(k,j)",
            {"A": "csr", "C": "csr"},
            SDDMM_HAND,
            build_sddmm,
            sparse_out=True,
        ),
        "spgemm": Spec(
            "spgemm",
            par.SPMM,
            {"A": "csr", "B": "csr", "C": "csr"},
            {label: sched for label, sched, c in par.SPGEMM_SCHEDULES.values() if c == "csr"},
            lambda m, g, mkl: build_spgemm(m, g, mkl, max_flops),
            sparse_out=True,
        ),
        "ttv": Spec("ttv", "A(i,j) = B(i,j,k) * c(k)", {"B": "csf"}, TTV_HAND, build_ttv, 3),
        "mttkrp": Spec(
            "mttkrp",
            "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)",
            {"B": "csf"},
            MTTKRP_HAND,
            build_mttkrp,
            3,
        ),
    }


# --------------------------------------------------------------------------- checking


def agrees(got: Any, expect: Any) -> tuple[bool, float]:
    """Whether a result matches the reference (np.allclose on values; for sparse results the
    difference matrix), and the largest error relative to the largest reference magnitude."""
    rtol, atol = par.TOL[DTYPE]
    if sp.issparse(expect):
        got = sp.csr_matrix(got)
        if got.shape != expect.shape:
            return False, math.inf
        scale = float(abs(expect).max()) if expect.nnz else 1.0
        diff = abs(got - expect)
        err = (float(diff.max()) if diff.nnz else 0.0) / (scale or 1.0)
        return err <= rtol + atol, err
    got = np.asarray(got)
    if got.shape != expect.shape:
        return False, math.inf
    return par.close(got, expect, DTYPE), base._relerr(got, expect)


def as_result(t: Any, sparse: bool) -> Any:
    """A ucf result as scipy (sparse outputs) or numpy."""
    return t.to_scipy() if sparse else t.to_numpy()


# --------------------------------------------------------------------------- measuring


@dataclass
class Tools:
    """What the run found: MKL (sparse_dot_mkl) or why not, ucf.tune or None."""

    mkl: Any = None
    mkl_note: str = ""
    tune: Callable | None = None
    kernels: dict[tuple, ucf.Kernel] = field(default_factory=dict)


def set_threads(n: int, tools: Tools) -> None:
    ucf.set_num_threads(n)
    if tools.mkl is not None:
        tools.mkl.mkl_set_num_threads(n)


def compiled(spec: Spec, schedule: str | None, tools: Tools) -> ucf.Kernel:
    key = (spec.name, schedule)
    if key not in tools.kernels:
        tools.kernels[key] = ucf.compile(
            spec.statement, formats=spec.formats, schedule=schedule, dtype=DTYPE
        )
    return tools.kernels[key]


def call(k: Any, case: Case) -> Callable[[], Any]:
    return lambda: k(**case.operands)


def pilot_seconds(k: Any, operands: dict[str, Any]) -> float:
    """The least of up to three calls after an untimed one, stopping at one that takes
    longer than loading a kernel: the first call may compile (the default schedule picks
    a kernel per input size, and the pilots are smaller than the input), and any call
    may lose a time slice on a busy machine."""
    k(**operands)
    t = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        k(**operands)
        t = min(t, time.perf_counter() - t0)
        if t > LOAD_SECONDS:
            break
    return t


def guard_slow(k: Any, case: Case, runs: int, budget: float) -> float | None:
    """Estimate ``runs`` calls at full size from the pilots and refuse to time a plan over
    ``budget`` seconds: one that co-iterates every (i, k) pair would take hours.

    The larger pilot scaled by rows is an upper bound (it counts the per-call cost, such
    as allocating a workspace, once per share of rows); only when that is over budget is
    the smaller pilot run too, and the cost split into a per-call and a per-row part. The
    larger pilot's seconds, or None without pilots."""
    if not case.pilots:
        return None
    (p1, ops1), (p2, ops2) = case.pilots
    t2 = pilot_seconds(k, ops2)
    if t2 * case.rows / p2 * runs <= budget:
        return t2
    t1 = pilot_seconds(k, ops1)
    per_row = max(t2 - t1, 0.0) / (p2 - p1)
    estimate = (t2 - per_row * p2 + per_row * case.rows) * runs
    if estimate > budget:
        raise RowError(
            "too slow",
            f"{t1:.3f} s for the first {p1} rows, {t2:.3f} s for {p2}; ~{estimate:.0f} s "
            f"for {runs} calls on all {case.rows} (budget {budget:.0f} s, --budget)",
        )
    return t2


def checked(fn: Callable[[], Any], case: Case, sparse: bool, ucf_result: bool) -> float:
    """Run once and compare with the reference; RowError 'wrong' if it differs."""
    got = fn()
    ok, err = agrees(as_result(got, sparse) if ucf_result else got, case.expect)
    if not ok:
        raise RowError("wrong", f"differs from scipy: max relative error {err:.1e}")
    return err


def attempt(cell: dict, column: str, fn: Callable[[], Callable[[], Any]]) -> Callable | None:
    """Build one contender; a failure is recorded in the cell and the others go on."""
    try:
        return fn()
    except RowError as e:
        cell[column] = {"status": e.kind, "message": str(e)}
    except ucf.UcfError as e:
        cell[column] = {"status": "unsupported", "message": f"{type(e).__name__}: {e}"}
    except Exception as e:  # a ucf bug must not hide the other columns
        cell[column] = {"status": "error", "message": f"{type(e).__name__}: {e}"}
    return None


def measure(spec: Spec, case: Case, threads: int, tools: Tools, args) -> dict:
    """All columns of one (input, kernel, threads) cell, checked, then timed interleaved."""
    cell: dict[str, Any] = {}
    runs = args.repeat + args.pilot + 2
    contenders: dict[str, Callable[[], Any]] = {"scipy": case.scipy}
    cell["scipy"] = {"status": "ok"}

    if case.mkl is not None:

        def mkl() -> Callable:
            checked(case.mkl, case, spec.sparse_out, False)
            return case.mkl

        if f := attempt(cell, "mkl", mkl):
            contenders["mkl"] = f
            cell["mkl"] = {"status": "ok"}
    else:
        why = tools.mkl_note if tools.mkl is None else "MKL has no such kernel"
        cell["mkl"] = {"status": "n/a", "message": why}

    def default() -> Callable:
        k = compiled(spec, None, tools)
        cell["default"] = {"status": "ok", "cin": k.cin}
        pilot = guard_slow(k, case, runs, args.budget)
        err = checked(call(k, case), case, spec.sparse_out, True)
        cell["default"].update(max_rel_err=err, pilot_s=pilot)
        return call(k, case)

    if f := attempt(cell, "default", default):
        contenders["default"] = f

    def hand() -> Callable:
        variants, refused, wrong = {}, {}, {}
        for label, schedule in spec.hand.items():
            try:
                k = compiled(spec, schedule, tools)
                guard_slow(k, case, runs, args.budget)
                checked(call(k, case), case, spec.sparse_out, True)
                variants[label] = call(k, case)
            except RowError as e:
                (wrong if e.kind == "wrong" else refused)[label] = f"{e.kind}: {e}"
            except ucf.UcfError as e:
                refused[label] = f"{type(e).__name__}: {e}"
        cell["hand"] = {"status": "ok", "refused": refused, "wrong": wrong}
        if not variants:
            slow = refused and all(v.startswith("too slow") for v in refused.values())
            kind = "wrong" if wrong else ("too slow" if slow else "unsupported")
            raise RowError(kind, next(iter({**wrong, **refused}.values()), "no hand schedule"))
        best, pilot = par.fastest(variants, args.pilot, CLOCKS[args.clock])
        cell["hand"].update(variant=best, schedule=spec.hand[best], pilot_s=pilot)
        return variants[best]

    if f := attempt(cell, "hand", hand):
        contenders["hand"] = f

    tuned = tuned_column(spec, case, cell, tools, args)
    # A study that kept the default returns the default kernel: timing it a second time
    # would only add the machine's noise to the ratio (0.8x to 1.25x on a busy machine).
    kept = [c for c in tuned if cell[c].get("kept_default") and "default" in contenders]
    contenders.update({c: f for c, f in tuned.items() if c not in kept})
    samples = par.median_of(contenders, args.repeat, CLOCKS[args.clock])
    samples.update({c: samples["default"] for c in kept})
    for name, s in samples.items():
        cell[name].update(seconds=med(s), samples=s)
    return cell


def tuned_column(spec: Spec, case: Case, cell: dict, tools: Tools, args) -> dict:
    """The tuned column (schedules only) and, with ``--search-formats``, the column tuned
    over the inputs' formats too, each a callable to time."""
    columns = ("tuned", TUNED_FORMATS) if args.search_formats else ("tuned",)
    why = None
    if tools.tune is None:
        why = {"status": "not available", "message": "ucf.tune does not exist yet"}
    elif args.trials < 1:
        why = {"status": "not run", "message": "--trials 0"}
    elif cell["default"].get("status") == "too slow":
        why = {
            "status": "skipped",
            "message": "the default is too slow to time, and tune times it as its baseline",
        }
    if why is not None:
        cell.update({c: dict(why) for c in columns})
        return {}
    found = {}
    for column in columns:
        f = attempt(cell, column, lambda c=column: tuned_cell(spec, case, cell, tools, args, c))
        if f is not None:
            found[column] = f
    return found


def tuned_cell(spec: Spec, case: Case, cell: dict, tools: Tools, args, column: str) -> Callable:
    """Tune (over formats too for the TUNED_FORMATS column) and check the result. A result
    in other formats is timed on the operands converted once, beforehand: its time is the
    kernel's, and the conversion (timed with --clock) is reported beside it."""
    extra: dict[str, Any] = {}
    if "storage" in inspect.signature(tools.tune).parameters:
        import optuna  # tune needs it anyway; a fresh study per cell, never resumed

        extra["storage"] = optuna.storages.InMemoryStorage()
    if column == TUNED_FORMATS:
        extra["search_formats"] = True
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = tools.tune(
            spec.statement,
            formats=spec.formats,
            trials=args.trials,
            seed=0,
            **extra,
            **case.operands,
        )
    spent = time.perf_counter() - t0
    cell[column] = {
        "status": "ok",
        "schedule": res.schedule,
        "kept_default": res.is_default,
        "tune_s": spent,
        "trials": args.trials,
        "tune_time": res.time,
        "tune_default_time": res.default_time,
    }
    operands = case.operands
    if column == TUNED_FORMATS:
        clock = CLOCKS[args.clock]
        c0 = clock()
        operands = res.operands(**case.operands)
        given = {n: given_format(t) for n, t in case.operands.items()}
        changed = {n: f for n, f in res.formats.items() if n in given and f != given[n]}
        cell[column].update(
            formats={n: format_name(f) for n, f in changed.items()},
            conversion_s=clock() - c0 if changed else 0.0,
            tune_conversion_s=res.conversion_time,
        )
    checked(lambda: res.kernel(**operands), case, spec.sparse_out, True)
    return lambda: res.kernel(**operands)


def given_format(operand: Any) -> str:
    """An operand's canonical format: a ucf Tensor's own, a numpy array's dense one."""
    if isinstance(operand, ucf.Tensor):
        return str(operand.format)
    return "U" * np.ndim(operand)


def format_name(spelled: str) -> str:
    """A canonical format by its usual name where it has one (``bcsr(4,4)``, ``ell(8)``)."""
    for pattern, name in FORMAT_NAMES:
        m = re.fullmatch(pattern, spelled)
        if m:
            return name.format(*m.groups())
    return spelled


# --------------------------------------------------------------------------- report


def t_of(cell: dict, col: str) -> float | None:
    c = cell.get(col, {})
    return c.get("seconds") if c.get("status") == "ok" else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def ratios(row: dict) -> dict[str, float | None]:
    out = {
        "t_default/t_hand": ratio(t_of(row, "default"), t_of(row, "hand")),
        "t_default/t_tuned": ratio(t_of(row, "default"), t_of(row, "tuned")),
        "t_mkl/t_tuned": ratio(t_of(row, "mkl"), t_of(row, "tuned")),
    }
    if TUNED_FORMATS in row:
        out[f"t_default/t_{TUNED_FORMATS}"] = ratio(t_of(row, "default"), t_of(row, TUNED_FORMATS))
    return out


def break_even(row: dict) -> float | None:
    """Calls of the format-tuned kernel after which its conversion has paid for itself:
    0 without a conversion, inf when it saves nothing per call."""
    c = row.get(TUNED_FORMATS, {})
    t_def, t_fmt = t_of(row, "default"), t_of(row, TUNED_FORMATS)
    if t_def is None or t_fmt is None:
        return None
    if not c.get("conversion_s"):
        return 0.0
    return math.ceil(c["conversion_s"] / (t_def - t_fmt)) if t_def > t_fmt else math.inf


def grades(rows: list[dict], args) -> list[dict]:
    """The Performance targets of issue 17 that this script measures, met or not."""
    out = []
    cells = [r for r in rows if r.get("status") == "ok"]
    pairs = [(r, r["ratios"]["t_default/t_hand"]) for r in cells]
    measured = [(r, x) for r, x in pairs if x is not None]
    failed_default = [
        r for r in cells if r["default"]["status"] != "ok" and r["hand"]["status"] == "ok"
    ]
    within = [r for r, x in measured if x <= DEFAULT_VS_HAND_MAX]
    worst = max(measured, key=lambda p: p[1], default=None)
    out.append(
        {
            "measure": "ucf default vs best hand schedule",
            "target": f"t_default/t_hand <= {DEFAULT_VS_HAND_MAX} on every row",
            "value": f"{len(within)} of {len(measured) + len(failed_default)} rows within"
            + (f"; worst {worst[1]:.2f}x ({_cell_name(worst[0])})" if worst else "")
            + (f"; default not timed on {len(failed_default)} rows" if failed_default else ""),
            "met": bool(measured) and len(within) == len(measured) and not failed_default,
        }
    )
    out.append(_tuned_grade(cells, "tuned", "tuned vs default", f"{args.trials} trials"))
    if args.search_formats:
        out.append(
            _tuned_grade(
                cells,
                TUNED_FORMATS,
                "tuned over formats and schedules vs default (kernel time)",
                f"{args.trials} trials; conversion apart, see break-even",
            )
        )
    mkl_rows = [
        r for r in cells if r["kernel"] in MKL_TARGET_KERNELS and r["threads"] == MKL_TARGET_THREADS
    ]
    vs = [(r, r["ratios"]["t_mkl/t_tuned"]) for r in mkl_rows]
    have = [(r, x) for r, x in vs if x is not None]
    if not mkl_rows:
        value, met = f"no SpMV/SpMM rows at {MKL_TARGET_THREADS} threads", None
    elif not have:
        value, met = "tuned or MKL not measured", None
    else:
        wins = sum(x > 1 for _, x in have)
        lo = min(have, key=lambda p: p[1])
        value = (
            f"faster on {wins} of {len(mkl_rows)} rows; slowest t_mkl/t_tuned "
            f"{lo[1]:.2f} ({_cell_name(lo[0])})"
        )
        met = wins == len(mkl_rows)
    out.append(
        {
            "measure": f"tuned vs MKL, SpMV and SpMM at {MKL_TARGET_THREADS} threads",
            "target": "faster on every matrix",
            "value": value,
            "met": met,
        }
    )
    studies = [
        (r, r["tuned"]["tune_s"])
        for r in cells
        if r["kernel"].startswith("spmm") and r["tuned"].get("tune_s") is not None
    ]
    target_size = [
        (r, s)
        for r, s in studies
        if r["shape"][0] >= TUNE_TARGET_ROWS and r["tuned"]["trials"] >= TUNE_TARGET_TRIALS
    ]
    if target_size:
        slow = max(target_size, key=lambda p: p[1])
        value = f"slowest {slow[1]:.1f} s ({_cell_name(slow[0])})"
        met = slow[1] <= TUNE_SECONDS_MAX
    elif studies:
        slow = max(studies, key=lambda p: p[1])
        value = (
            f"not at the target size: slowest SpMM study {slow[1]:.1f} s with "
            f"{slow[0]['tuned']['trials']} trials on {slow[0]['shape'][0]} rows "
            f"(run --rows {TUNE_TARGET_ROWS} --trials {TUNE_TARGET_TRIALS})"
        )
        met = None
    else:
        value, met = "no SpMM study ran", None
    out.append(
        {
            "measure": "tuning time",
            "target": f"<= {TUNE_SECONDS_MAX:.0f} s for a {TUNE_TARGET_TRIALS}-trial SpMM study "
            f"on a {TUNE_TARGET_ROWS // 1000}k-row matrix",
            "value": value,
            "met": met,
        }
    )
    out.append(
        {
            "measure": "ResNet-50 convolutions, no schedule given",
            "target": ">= 1.0x oneDNN at 91 % and >= 2.5x at 98 %",
            "value": "measured by bench/conv.py (its 'no schedule' column and summary)",
            "met": None,
        }
    )
    return out


def _tuned_grade(cells: list[dict], column: str, measure: str, how: str) -> dict:
    """The geomean of t_default over the ``column``'s time, against WACO's bar."""
    key = f"t_default/t_{column}"
    found = [r["ratios"][key] for r in cells if r["ratios"].get(key) is not None]
    g = geomean(found)
    return {
        "measure": measure,
        "target": f"geomean {key} >= {TUNED_VS_DEFAULT_MIN}",
        "value": f"{column} not measured"
        if g is None
        else f"{g:.2f}x over {len(found)} rows ({how})",
        "met": None if g is None else g >= TUNED_VS_DEFAULT_MIN,
    }


def _cell_name(r: dict) -> str:
    return f"{r['input']} {r['kernel']} {r['threads']}t"


def _fmt_time(c: dict) -> str:
    if c.get("status") == "ok":
        return f"{c['seconds'] * 1e3:.3f}"
    return c.get("status", "-")


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(rows: list[dict]) -> str:
    head = (
        "| input | kernel | thr | default ms | tuned ms | hand ms (variant) | scipy ms | MKL ms "
        "| t_def/t_hand | t_def/t_tuned | t_mkl/t_tuned |"
    )
    formats = any(TUNED_FORMATS in r for r in rows)
    if formats:
        head += (
            " tuned+formats ms (formats) | t_def/t_tuned+formats | conversion ms "
            "| break-even calls |"
        )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(
                f"| {r['input']} | {r['kernel']} | {r.get('threads', '-')} | "
                f"{r.get('status')}: {r.get('message', '')} |" + " |" * (head.count("|") - 5)
            )
            continue
        hand = _fmt_time(r["hand"])
        if r["hand"].get("status") == "ok":
            hand += f" ({r['hand']['variant']})"
        x = r["ratios"]
        line = (
            f"| {r['input']} | {r['kernel']} | {r['threads']} | {_fmt_time(r['default'])} | "
            f"{_fmt_time(r['tuned'])} | {hand} | {_fmt_time(r['scipy'])} | "
            f"{_fmt_time(r['mkl'])} | {_fmt_ratio(x['t_default/t_hand'])} | "
            f"{_fmt_ratio(x['t_default/t_tuned'])} | {_fmt_ratio(x['t_mkl/t_tuned'])} |"
        )
        if formats:
            c = r.get(TUNED_FORMATS, {})
            chosen = ", ".join(f"{n}={f}" for n, f in c.get("formats", {}).items()) or "as given"
            conv = c.get("conversion_s")
            even = break_even(r)
            line += (
                f" {_fmt_time(c)} ({chosen}) | "
                f"{_fmt_ratio(x.get(f't_default/t_{TUNED_FORMATS}'))} | "
                f"{'-' if conv is None else f'{conv * 1e3:.2f}'} | "
                f"{'-' if even is None else even} |"
            )
        lines.append(line)
    return "\n".join(lines)


def grade_table(gs: list[dict]) -> str:
    lines = ["| measure | target | this run | met |", "|---|---|---|---|"]
    for g in gs:
        met = {True: "yes", False: "NO", None: "-"}[g["met"]]
        lines.append(f"| {g['measure']} | {g['target']} | {g['value']} | {met} |")
    return "\n".join(lines)


def notes(rows: list[dict]) -> list[str]:
    """Why columns are missing: the first message of each kind, once."""
    seen: dict[str, str] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        for col in ("default", "tuned", TUNED_FORMATS, "hand", "mkl"):
            c = r.get(col, {})
            if c.get("status") not in (None, "ok"):
                key = f"{col} {c['status']}"
                seen.setdefault(key, f"{_cell_name(r)}: {c.get('message', '')}")
    return [f"{k}: {v.splitlines()[0] if v else ''}" for k, v in seen.items()]


def plot(rows: list[dict], path: Path) -> None:
    """Speed-up over scipy (scipy time / column time) per input, one panel per kernel and
    thread count, log scale."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in rows if r.get("status") == "ok"]
    kernels = list(dict.fromkeys(r["kernel"] for r in ok))
    threads = sorted({r["threads"] for r in ok})
    if not kernels:
        return
    fig = Figure(figsize=(7 * len(threads), 3.2 * len(kernels)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(kernels), len(threads), squeeze=False)
    cols = ("default", "tuned", "hand", "mkl")
    for a, kern in enumerate(kernels):
        for b, th in enumerate(threads):
            ax = axes[a][b]
            sel = [r for r in ok if r["kernel"] == kern and r["threads"] == th]
            names = [r["input"] for r in sel]
            xs = np.arange(len(sel))
            for n, col in enumerate(cols):
                ys = [ratio(t_of(r, "scipy"), t_of(r, col)) or 0.0 for r in sel]
                ax.bar(xs + (n - 1.5) * 0.2, ys, 0.2, label=col)
            ax.axhline(1.0, color="k", linewidth=0.8)
            ax.set_yscale("log")
            ax.set_xticks(xs, names, rotation=70, fontsize=6)
            ax.set_title(f"{kern}, {th} thread{'s' if th > 1 else ''}", fontsize=9)
            ax.set_ylabel("speed-up over scipy")
    axes[0][0].legend(fontsize=7)
    fig.savefig(path, format="png", dpi=110)


# --------------------------------------------------------------------------- main


def inputs(args) -> Iterator[tuple[str, str, int, int, Callable[[], Any]]]:
    """(name, description, order, seed, maker) of every selected input, generated when
    used; the seed does not depend on which inputs are selected."""
    suite = matrix_suite(args.rows)
    tensors = tensor_suite(args.rows)
    wanted = set(args.matrices.split(",")) if args.matrices else None
    for seed, (name, (what, gen)) in enumerate({**suite, **tensors}.items()):
        if wanted is not None and name not in wanted:
            continue
        order = 3 if name in tensors else 2
        yield name, what, order, seed, lambda g=gen, s=seed: g(np.random.default_rng([17, s]))
    for n, path in enumerate(args.mtx):
        yield Path(path).stem, f"Matrix Market file {path}", 2, 1000 + n, lambda p=path: read_mtx(p)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--headroom" in argv:
        import headroom

        return headroom.main([a for a in argv if a != "--headroom"])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=50_000, help="rows of the suite (%(default)s)")
    p.add_argument("--mtx", nargs="*", default=[], help="Matrix Market files to add")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts")
    p.add_argument("--trials", type=int, default=None, help="ucf.tune trials (50; 3 quick)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per column (5; 2 quick)")
    p.add_argument("--pilot", type=int, default=None, help="runs per hand schedule (2; 1 quick)")
    p.add_argument("--budget", type=float, default=None, help="s per ucf column (60; 10 quick)")
    p.add_argument("--spgemm-max-flops", type=float, default=1e8, help="skip larger A@B")
    p.add_argument("--matrices", help="comma-separated input names (default: all)")
    p.add_argument("--kernels", help="comma-separated kernels (default: all)")
    p.add_argument("--quick", action="store_true", help="fewer runs and trials")
    p.add_argument(
        "--search-formats",
        action="store_true",
        help="add a column tuned over the sparse inputs' formats too (ucf.tune(..., "
        "search_formats=True): bcsr and ell where the matrix fills them), timed on operands "
        "converted beforehand, with the conversion and its break-even calls beside it",
    )
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="what a time is: wall (default) or cpu, the process's CPU time, which time "
        "slices taken by other processes do not inflate (for 1-thread rows on a busy "
        "machine; at 2 threads it sums both threads)",
    )
    p.add_argument("--json", default=str(HERE / "results" / "autoschedule.json"))
    p.add_argument("--plot", help="write a PNG of the speed-ups over scipy")
    args = p.parse_args(argv)
    q = args.quick
    args.trials = args.trials if args.trials is not None else (3 if q else 50)
    args.repeat = max(1, args.repeat if args.repeat is not None else (2 if q else 5))
    args.pilot = max(1, args.pilot if args.pilot is not None else (1 if q else 2))
    args.budget = args.budget if args.budget is not None else (10.0 if q else 60.0)
    specs = kernel_specs(args.spgemm_max_flops)
    if args.kernels:
        bad = sorted(set(args.kernels.split(",")) - set(specs))
        if bad:
            raise SystemExit(f"unknown kernels {bad}; choose from {', '.join(specs)}")
        specs = {k: v for k, v in specs.items() if k in args.kernels.split(",")}

    set_threads(args.threads[0], Tools())  # libgomp first, so MKL's GNU layer shares it
    tools = Tools(tune=getattr(ucf, "tune", None))
    tools.mkl, tools.mkl_note = load_mkl()
    res: dict[str, Any] = {
        "config": {
            "rows": args.rows,
            "threads": args.threads,
            "trials": args.trials,
            "search_formats": args.search_formats,
            "repeat": args.repeat,
            "pilot": args.pilot,
            "budget_s": args.budget,
            "dtype": DTYPE,
            "timing": "median of repeat interleaved runs after one warm-up, "
            f"time.{CLOCKS[args.clock].__name__}",
            "ucf": ucf.__version__,
            "ucf_path": str(Path(ucf.__file__).parent),
            "tune": tools.tune is not None,
            "mkl": tools.mkl_note,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
    }
    rows: list[dict] = []
    cpu_start = par.cpu_snapshot()
    with base.fresh_kernel_cache("ucf-bench-auto-"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        for name, what, order, seed, make in inputs(args):
            todo = [s for s in specs.values() if s.order == order]
            if not todo:
                continue
            x = make()
            desc = {"input": name, "what": what, "shape": list(x.shape), "nnz": int(x.nnz)}
            print(f"{name}: {x.shape}, {x.nnz} nnz", file=sys.stderr)
            for spec in todo:
                rng = np.random.default_rng([17, seed, zlib.crc32(spec.name.encode())])
                try:
                    case = spec.build(x, rng, tools.mkl)
                except RowError as e:
                    rows.append({**desc, "kernel": spec.name, "status": e.kind, "message": str(e)})
                    continue
                for th in args.threads:
                    set_threads(th, tools)
                    print(f"  {spec.name}, {th} threads ...", file=sys.stderr)
                    row = {**desc, "kernel": spec.name, "threads": th, "note": case.note}
                    t0 = time.perf_counter()
                    row.update(
                        par.guarded({}, lambda s=spec, c=case, t=th: measure(s, c, t, tools, args))
                    )
                    row.setdefault("status", "ok")
                    row["wall_s"] = time.perf_counter() - t0  # the cell, tuning included
                    if row["status"] == "ok":
                        row["ratios"] = ratios(row)
                    rows.append(row)
                    print(table([row]).splitlines()[-1], file=sys.stderr)  # a long run's rows
                del case
            del x
        res["config"]["openmp_runtimes"] = par.openmp_runtimes()
    res["cpu"] = par.cpu_contention(cpu_start, par.cpu_snapshot())
    res["rows"] = rows
    res["grades"] = grades(rows, args)

    print(table(rows))
    print()
    print(grade_table(res["grades"]))
    for line in notes(rows):
        print(f"- {line}")
    if tools.mkl is None:
        print(f"- {tools.mkl_note}")
    busy = res["cpu"]
    if busy:
        print(
            f"- machine: {busy['cpus']} CPUs; during the {busy['wall_s']:.0f} s run other "
            f"processes used {busy['other_cpu_s']:.1f} CPU-s, steal {busy['steal_s']:.1f} CPU-s"
        )
    if len(res["config"]["openmp_runtimes"]) > 1:
        print(f"- warning: several OpenMP runtimes loaded: {res['config']['openmp_runtimes']}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(f"\nresults written to {out}")
    if args.plot:
        plot(rows, Path(args.plot))
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
