"""Statements over dense operands, ucf's default (no schedule) against numpy (OpenBLAS)
on the same number of threads (issue 34: a user's first test is often all dense).

Run from the repository root:

    nice -n 5 python bench/dense.py                  # 1000 x 1000, one thread, 9 rounds
    python bench/dense.py --threads 2
    python bench/dense.py --n 300 --repeats 3        # a smoke test: seconds

numpy's BLAS is held to ``--threads`` (``OPENBLAS_NUM_THREADS`` and friends, set before
numpy loads). Every ucf kernel is checked against numpy first; then, row by row, each
round calls ucf and numpy in turns (the order rotating), so both find the operands in
the same caches, and the medians are compared. Times are
process CPU time on one thread (steadier on a busy machine), wall time on more.
GFLOP/s counts 2 flops per multiply-add (GEMM, GEMV) and 1 per element (row max/sum).

Targets (issue 34, one thread, 1000^3): dense GEMM within 1.5x of numpy's ``A @ B``
(float32 and float64); GEMV ``A @ x`` and the row max ``A.max(axis=1)`` within 1.2x.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--n", type=int, default=1000, help="the square extent")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--repeats", type=int, default=9, help="rounds of timing")
ARGS = ap.parse_args() if __name__ == "__main__" else ap.parse_args([])
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from sparse_add import timed  # noqa: E402
from spmv_spmm import fresh_kernel_cache  # noqa: E402

import ucf  # noqa: E402

GEMM_TARGET, VECTOR_TARGET = 1.5, 1.2


def rows(n: int):
    """(label, statement, dtype, operand shapes, numpy's call, flops, target or None)."""
    out = []
    for dt in ("float32", "float64"):
        out.append(
            (
                f"GEMM {n}^3",
                "C(i,j) = A(i,k) * B(k,j)",
                dt,
                {"A": (n, n), "B": (n, n)},
                lambda o: o["A"] @ o["B"],
                2.0 * n**3,
                GEMM_TARGET,
            )
        )
    for dt in ("float32", "float64"):
        m, k, c = 20 * n, 128, 64
        out.append(
            (
                f"GEMM tall {m}x{k}x{c}",
                "C(i,j) = A(i,k) * B(k,j)",
                dt,
                {"A": (m, k), "B": (k, c)},
                lambda o: o["A"] @ o["B"],
                2.0 * m * k * c,
                None,
            )
        )
    odd = n + 23
    out.append(
        (
            f"GEMM {odd}^3",
            "C(i,j) = A(i,k) * B(k,j)",
            "float32",
            {"A": (odd, odd), "B": (odd, odd)},
            lambda o: o["A"] @ o["B"],
            2.0 * odd**3,
            None,
        )
    )
    for dt in ("float32", "float64"):
        out.append(
            (
                f"GEMV {n}^2",
                "y(i) = A(i,j) * x(j)",
                dt,
                {"A": (n, n), "x": (n,)},
                lambda o: o["A"] @ o["x"],
                2.0 * n * n,
                VECTOR_TARGET,
            )
        )
        out.append(
            (
                f"row max {n}^2",
                "y(i) = max(j, A(i,j))",
                dt,
                {"A": (n, n)},
                lambda o: o["A"].max(axis=1),
                1.0 * n * n,
                VECTOR_TARGET,
            )
        )
        out.append(
            (
                f"row sum {n}^2",
                "y(i) = A(i,j)",
                dt,
                {"A": (n, n)},
                lambda o: o["A"].sum(axis=1),
                1.0 * n * n,
                None,
            )
        )
    return out


def main() -> int:
    ucf.set_num_threads(ARGS.threads)
    clock = time.process_time if ARGS.threads == 1 else time.perf_counter
    rng = np.random.default_rng(0)
    print(
        f"load average at start: {os.getloadavg()[0]:.2f}; threads {ARGS.threads}; "
        f"{'CPU' if ARGS.threads == 1 else 'wall'} time, medians of {ARGS.repeats}"
    )
    table, times = [], {}
    for label, stmt, dt, shapes, ref, flops, target in rows(ARGS.n):
        ops = {t: rng.standard_normal(s).astype(dt) for t, s in shapes.items()}
        k = ucf.compile(stmt, dtype=dt)
        got, want = np.asarray(k(**ops)), ref(ops)
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max()):
            raise SystemExit(f"ucf {stmt} ({dt}) differs from numpy")
        name = f"{label} {dt}"
        calls = {
            name + " ucf": lambda k=k, ops=ops: k(**ops),
            name + " numpy": lambda ref=ref, ops=ops: ref(ops),
        }
        times |= timed(calls, clock, ARGS.repeats)
        table.append((name, flops, target))
    print(f"{'row':34s} {'ucf ms':>9s} {'numpy ms':>9s} {'ratio':>6s} {'GFLOP/s':>8s}  target")
    for name, flops, target in table:
        t, tn = times[name + " ucf"], times[name + " numpy"]
        ratio = t / tn
        verdict = (  # the targets are for one thread
            ""
            if target is None or ARGS.threads != 1
            else f"<= {target}x  {'met' if ratio <= target else 'NOT met'}"
        )
        rate = flops / t / 1e9
        print(f"{name:34s} {t * 1e3:9.3f} {tn * 1e3:9.3f} {ratio:6.2f} {rate:8.1f}  {verdict}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    with fresh_kernel_cache("ucf-dense-bench-"):
        sys.exit(main())
