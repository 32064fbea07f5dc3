"""``ucf demo``: a quick end-to-end check that ucf works on this machine.

It exercises the whole pipeline (parse, lower, JIT, bind) on four classic
kernels and compares against numpy/scipy, so a fresh install can be trusted
(and roughly sized up) in a few seconds without any data files or C compiler.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

SEED = 20240601
NNZ_PER_ROW = 10
SPMM_COLS = 32
MTTKRP_RANK = 16
TENSOR_DENSITY = 0.01
REPEATS = 5


@dataclass
class _Row:
    name: str
    ucf_ms: float
    ref_ms: float
    ok: bool


def best_ms(fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    """Best of several runs after a warm call, so JIT and first-touch costs are excluded
    (``ucf serve`` times its runs the same way)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def _sparse_close(a: Any, b: Any) -> bool:
    """Compare sparse results without densifying; a 20000^2 dense matrix would not fit."""
    if a.shape != b.shape:
        return False
    diff = (sp.csr_matrix(a) - sp.csr_matrix(b)).tocoo()
    scale = max(float(abs(b).max()) if b.nnz else 0.0, 1.0)
    return bool(np.allclose(diff.data, 0.0, atol=1e-12 * scale))


def _random_csr(rng: np.random.Generator, n: int) -> sp.csr_matrix:
    density = min(1.0, NNZ_PER_ROW / n)
    return sp.random(n, n, density=density, format="csr", random_state=rng, dtype=np.float64)


def _random_csf_coords(rng: np.random.Generator, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct random coordinates, so the COO reference needs no duplicate handling."""
    total = dim**3
    nnz = max(1, int(total * TENSOR_DENSITY))
    flat = rng.choice(total, size=nnz, replace=False)
    coords = np.stack(np.unravel_index(flat, (dim, dim, dim)), axis=1).astype(np.int64)
    return coords, rng.random(nnz)


def run_demo(size: int = 20000, target: str = "llvm") -> int:
    """Run the four kernels at ``size`` and print a table; return 1 if any check fails."""
    import ucf

    rng = np.random.default_rng(SEED)
    n = max(int(size), 2)
    dim = max(4, min(n, 100))
    rows: list[_Row] = []
    started = time.perf_counter()

    A = _random_csr(rng, n)
    B = _random_csr(rng, n)
    x = rng.random(n)
    X = rng.random((n, SPMM_COLS))
    uA = ucf.from_scipy(A, "csr")
    uB = ucf.from_scipy(B, "csr")

    def kernel(expr: str, formats: dict[str, str]) -> Any:
        return ucf.compile(expr, formats=formats, target=target)

    # SpMV
    k = kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    got = k(A=uA, x=x).to_numpy()
    rows.append(
        _Row(
            "SpMV   y = A x",
            best_ms(lambda: k(A=uA, x=x)),
            best_ms(lambda: A @ x),
            bool(np.allclose(got, A @ x)),
        )
    )

    # SpMM
    k2 = kernel("C(i,k) = A(i,j) * X(j,k)", {"A": "csr"})
    got = k2(A=uA, X=X).to_numpy()
    rows.append(
        _Row(
            f"SpMM   C = A X ({SPMM_COLS} cols)",
            best_ms(lambda: k2(A=uA, X=X)),
            best_ms(lambda: A @ X),
            bool(np.allclose(got, A @ X)),
        )
    )

    # Sparse add with a sparse (CSR) result
    k3 = kernel("S(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "S": "csr"})
    got = k3(A=uA, B=uB)
    rows.append(
        _Row(
            "Add    S = A + B (csr)",
            best_ms(lambda: k3(A=uA, B=uB)),
            best_ms(lambda: A + B),
            str(got.format) == "UC" and _sparse_close(got.to_scipy(), A + B),
        )
    )

    # MTTKRP on a CSF tensor
    coords, vals = _random_csf_coords(rng, dim)
    T = ucf.from_coo(coords, vals, (dim, dim, dim), "csf")
    C = rng.random((dim, MTTKRP_RANK))
    D = rng.random((dim, MTTKRP_RANK))
    k4 = kernel("M(i,j) = T(i,k,l) * C(k,j) * D(l,j)", {"T": "csf"})
    got = k4(T=T, C=C, D=D).to_numpy()
    # Reference: the mode-0 unfolding (CSR) times the Khatri-Rao product of C and D.
    unfold = sp.csr_matrix(
        (vals, (coords[:, 0], coords[:, 1] * dim + coords[:, 2])), shape=(dim, dim * dim)
    )

    def reference() -> np.ndarray:
        return unfold @ (C[:, None, :] * D[None, :, :]).reshape(dim * dim, MTTKRP_RANK)

    rows.append(
        _Row(
            f"MTTKRP {dim}^3 csf, rank {MTTKRP_RANK}",
            best_ms(lambda: k4(T=T, C=C, D=D)),
            best_ms(reference),
            bool(np.allclose(got, reference())),
        )
    )

    _print_table(rows, n, A.nnz, len(vals), target, time.perf_counter() - started)
    failed = [r.name.split()[0] for r in rows if not r.ok]
    if failed:
        print(
            f"ucf: error: demo results differ from numpy/scipy for {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


def _print_table(
    rows: list[_Row], n: int, nnz: int, tnnz: int, target: str, elapsed: float
) -> None:
    print(
        f"ucf demo: {n}x{n} csr matrices with {nnz} nonzeros, tensor with {tnnz} nonzeros, "
        f"target {target}"
    )
    width = max(len(r.name) for r in rows)
    print(f"{'kernel':<{width}}  {'ucf ms':>9}  {'scipy ms':>9}  {'scipy/ucf':>9}  check")
    for r in rows:
        ratio = r.ref_ms / r.ucf_ms if r.ucf_ms > 0 else float("inf")
        print(
            f"{r.name:<{width}}  {r.ucf_ms:>9.3f}  {r.ref_ms:>9.3f}  {ratio:>9.2f}  "
            f"{'OK' if r.ok else 'FAIL'}"
        )
    print(
        f"(times are the best of {REPEATS} runs after a warm call; "
        f"scipy/ucf > 1 means ucf is faster; total {elapsed:.1f} s)"
    )
