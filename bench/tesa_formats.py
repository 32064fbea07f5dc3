"""TeSA storage benchmark: SparTA's 1024x1024 (sparse weights) x 1024x1024 (dense)
matmul in float32 with blocked storage, against torch dense matmul, scipy's BSR,
MKL's BSR (through sparse_dot_mkl, when installed) and ucf's own CSR.

    python bench/tesa_formats.py               # 1024^3, 2 threads
    python bench/tesa_formats.py --n 512 --repeat 3

Every timing is the best of ``--repeat`` interleaved runs, all peers in one
process on the same matrices (timed by bench/spmv_spmm.py's helpers); results
are checked against numpy. The fixed-width rows: ``nm(2,4)`` SpMM against
ucf's CSR SpMM on the same 2:4 matrix, and ``ell(w)`` SpMV against ucf's CSR
SpMV on a matrix whose rows all hold w nonzeros (``--ell-rows`` rows, since one
1024-row SpMV takes microseconds). The int8 row: the same 90 % block pattern
with int8 weights in ``bcsr(32,32)@int8`` times uint8 activations into an int32
C (exact, checked against numpy's integer product), against ucf's float32
``bcsr(32,32)``, timed 3x ``--repeat`` times, and again on one thread in CPU
time (the steadier measure on a shared machine). ``--unblocked`` adds the float32
``bcsr(32,32)`` kernel without register blocking (``UCF_REGISTER_BLOCKING=0``) to
the main table, timed in the same interleaved runs: what the micro-kernel gains,
side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spmv_spmm import best_of, fresh_kernel_cache, load_mkl, timings  # noqa: E402

import ucf  # noqa: E402

SPMM = "C(i,j) = A(i,k) * B(k,j)"
BLOCK = 32


def block_sparse(rng, n: int, block: int, zero_fraction: float) -> np.ndarray:
    """An n x n float32 matrix whose blocks are all zero with ``zero_fraction``."""
    keep = rng.random((n // block, n // block)) >= zero_fraction
    return (np.kron(keep, np.ones((block, block))) * rng.random((n, n))).astype(np.float32)


def two_of_four(rng, rows: int, cols: int, n: int = 2, m: int = 4) -> np.ndarray:
    """A float32 matrix with exactly n nonzeros in every group of m columns."""
    places = np.argsort(rng.random((rows, cols // m, m)), axis=2)[:, :, :n]
    a = np.zeros((rows, cols // m, m), dtype=np.float32)
    np.put_along_axis(a, places, rng.random(places.shape, dtype=np.float32) + 0.5, axis=2)
    return a.reshape(rows, cols)


def equal_rows(rng, rows: int, cols: int, w: int) -> np.ndarray:
    """A float32 matrix whose rows each hold exactly w nonzeros, in random columns."""
    a = np.zeros((rows, cols), dtype=np.float32)
    picked = np.argsort(rng.random((rows, cols)), axis=1)[:, :w]
    np.put_along_axis(a, picked, rng.random((rows, w), dtype=np.float32) + 0.5, axis=1)
    return a


def fixed_width_rows(rng, b: np.ndarray, args) -> list[tuple[str, float, float]]:
    """(case, ucf fixed-width time, ucf CSR time) for nm(2,4) SpMM and ell(w) SpMV."""
    a = two_of_four(rng, args.n, args.n)
    nm_kernel = ucf.compile(SPMM, formats={"A": "nm(2,4)"}, dtype="float32")
    csr_kernel = ucf.compile(SPMM, formats={"A": "csr"}, dtype="float32")
    an, ac = ucf.from_numpy(a, format="nm(2,4)"), ucf.from_numpy(a, format="csr")
    for k, t in ((nm_kernel, an), (csr_kernel, ac)):
        np.testing.assert_allclose(k(A=t, B=b).to_numpy(), a @ b, rtol=2e-3, atol=1e-2)
    spmm = best_of(
        {"nm": lambda: nm_kernel(A=an, B=b), "csr": lambda: csr_kernel(A=ac, B=b)}, args.repeat
    )
    w, spmv_expr = args.ell_width, "y(i) = A(i,k) * x(k)"
    e = equal_rows(rng, args.ell_rows, args.n, w)
    x = rng.random(args.n, dtype=np.float32)
    ell_kernel = ucf.compile(spmv_expr, formats={"A": f"ell({w})"}, dtype="float32")
    csr_spmv = ucf.compile(spmv_expr, formats={"A": "csr"}, dtype="float32")
    ae, ac = ucf.from_numpy(e, format=f"ell({w})"), ucf.from_numpy(e, format="csr")
    for k, t in ((ell_kernel, ae), (csr_spmv, ac)):
        np.testing.assert_allclose(k(A=t, x=x).to_numpy(), e @ x, rtol=2e-3, atol=1e-3)
    spmv = best_of(
        {"ell": lambda: ell_kernel(A=ae, x=x), "csr": lambda: csr_spmv(A=ac, x=x)},
        args.repeat * 3,
    )
    return [
        (f"nm(2,4) SpMM {args.n}^3", spmm["nm"], spmm["csr"]),
        (f"ell({w}) SpMV {args.ell_rows}x{args.n}", spmv["ell"], spmv["csr"]),
    ]


def peers(a: np.ndarray, b: np.ndarray, threads: int) -> dict[str, Callable[[], object]]:
    """The comparison runs available here, each a zero-argument callable."""
    runs: dict[str, Callable[[], object]] = {}
    try:
        import torch

        torch.set_num_threads(threads)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        runs["torch dense"] = lambda: ta @ tb
    except ImportError:
        pass
    bsr = sp.bsr_array(a, blocksize=(BLOCK, BLOCK))
    runs["scipy bsr"] = lambda: bsr @ b
    mkl, note = load_mkl()
    if mkl is None:
        print(note)
    else:
        mkl.mkl_set_num_threads(threads)
        mkl_bsr = sp.bsr_matrix(a, blocksize=(BLOCK, BLOCK))
        runs["mkl bsr"] = lambda: mkl.dot_product_mkl(mkl_bsr, b)
    return runs


@contextlib.contextmanager
def unblocked() -> Iterator[None]:
    """Kernels planned inside run without register blocking (a kernel plans at its
    first call on operands of new statistics, and keeps that plan)."""
    os.environ["UCF_REGISTER_BLOCKING"] = "0"
    try:
        yield
    finally:
        del os.environ["UCF_REGISTER_BLOCKING"]


def int8_row(rng, args) -> dict[str, float]:
    """Seconds of ``bcsr(32,32)@int8`` times uint8 into int32 (``int8``), and of the
    float32 ``bcsr(32,32)`` kernel (``fp32``), on the same 90 % block pattern: best of
    3 x ``--repeat`` interleaved calls (a call takes a few ms, and on a shared machine
    one run of 7 swung the ratio by 2x), on ``--threads`` threads in wall time and on
    one thread in the calling thread's CPU time (``int8 1t``, ``fp32 1t``: what the
    kernels cost, without the second thread's wake-up). ``gmacs``: multiply-adds the
    kernels do per call (live blocks x 32 x 32 x n), in billions."""
    blocked = f"bcsr({BLOCK},{BLOCK})"
    pattern = block_sparse(rng, args.n, BLOCK, 0.9) != 0
    a8 = np.where(pattern, rng.integers(-127, 128, pattern.shape), 0).astype(np.int8)
    b8 = rng.integers(0, 256, (args.n, args.n)).astype(np.uint8)
    k8 = ucf.compile(SPMM, formats={"A": f"{blocked}@int8", "B": "dense@uint8"}, dtype="int32")
    t8 = ucf.from_numpy(a8, format=f"{blocked}@int8")
    np.testing.assert_array_equal(
        k8(A=t8, B=b8).to_numpy(), a8.astype(np.int64) @ b8.astype(np.int64)
    )
    a32, b32 = a8.astype(np.float32), b8.astype(np.float32)
    k32 = ucf.compile(SPMM, formats={"A": blocked}, dtype="float32")
    t32 = ucf.from_numpy(a32, format=blocked)
    runs = {"int8": lambda: k8(A=t8, B=b8), "fp32": lambda: k32(A=t32, B=b32)}
    times = best_of(runs, 3 * args.repeat)
    ucf.set_num_threads(1)
    try:
        cpu = timings(runs, 3 * args.repeat, clock=time.thread_time)
    finally:
        ucf.set_num_threads(args.threads)
    times.update({f"{k} 1t": min(v) for k, v in cpu.items()})
    blocks = pattern.reshape(args.n // BLOCK, BLOCK, -1, BLOCK).any(axis=(1, 3)).sum()
    times["gmacs"] = blocks * BLOCK * BLOCK * args.n / 1e9
    return times


def _gmacs(times: dict[str, float], run: str) -> str:
    """A run's time and multiply-add rate."""
    return f"{times[run] * 1e3:.2f} ms, {times['gmacs'] / times[run]:.0f} GMAC/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024, help="matrix size (default 1024)")
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per case (default 7)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every peer (default 2)")
    ap.add_argument("--ell-rows", type=int, default=65536, help="ELL SpMV rows (default 65536)")
    ap.add_argument("--ell-width", type=int, default=16, help="nonzeros per ELL row (default 16)")
    ap.add_argument(
        "--unblocked",
        action="store_true",
        help="also time the bcsr kernel without register blocking, side by side",
    )
    args = ap.parse_args()
    ucf.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    b = rng.random((args.n, args.n)).astype(np.float32)
    csr_kernel = ucf.compile(SPMM, formats={"A": "csr"}, dtype="float32")
    blocked = f"bcsr({BLOCK},{BLOCK})"
    bcsr_kernel = ucf.compile(SPMM, formats={"A": blocked}, dtype="float32")
    rows = []
    for zero in (0.9, 0.5):
        a = block_sparse(rng, args.n, BLOCK, zero)
        ab, ac = ucf.from_numpy(a, format=blocked), ucf.from_numpy(a, format="csr")
        want = a @ b
        for k, t in ((bcsr_kernel, ab), (csr_kernel, ac)):
            np.testing.assert_allclose(k(A=t, B=b).to_numpy(), want, rtol=2e-3, atol=1e-2)
        runs = {
            f"ucf {blocked}": lambda ab=ab: bcsr_kernel(A=ab, B=b),
            "ucf csr": lambda ac=ac: csr_kernel(A=ac, B=b),
            **peers(a, b, args.threads),
        }
        if args.unblocked:
            with unblocked():
                plain = ucf.compile(SPMM, formats={"A": blocked}, dtype="float32")
                got = plain(A=ab, B=b).to_numpy()
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-2)
            runs["unblocked bcsr"] = lambda ab=ab, plain=plain: plain(A=ab, B=b)
        times = best_of(runs, args.repeat)
        rows.append((zero, times))
    fixed_width = fixed_width_rows(rng, b, args)
    print(f"SpMM {args.n}^3 float32, {args.threads} threads, best of {args.repeat}\n")
    print(f"{'zero blocks':>11}  " + "  ".join(f"{name:>16}" for name in rows[0][1]))
    for zero, times in rows:
        cells = "  ".join(f"{t * 1e3:13.2f} ms" for t in times.values())
        print(f"{zero:>10.0%}  {cells}")
    print()
    targets = [
        (0.9, "torch dense", 5.0, f"{blocked}, 90% zero blocks: >= 5x faster than torch dense"),
        (0.9, "mkl bsr", 1.0, f"{blocked}, 90%: not slower than MKL BSR"),
        (0.5, "torch dense", 1.5, f"{blocked}, 50%: >= 1.5x faster than torch dense"),
    ]
    for zero, peer, factor, what in targets:
        times = dict(rows)[zero]
        if peer not in times:
            print(f"  n/a   {what} ({peer} is not installed)")
            continue
        speedup = times[peer] / times[f"ucf {blocked}"]
        verdict = "PASS" if speedup >= factor else "FAIL"
        print(f"  {verdict}  {what}: {speedup:.2f}x")
    what = f"{blocked}@int8 x uint8, 90%: >= 2x faster than float32 {blocked}"
    q = int8_row(rng, args)
    verdict = "PASS" if q["fp32"] / q["int8"] >= 2.0 else "FAIL"
    ratio = q["fp32"] / q["int8"]
    print(f"  {verdict}  {what}: {ratio:.2f}x ({_gmacs(q, 'int8')} vs {_gmacs(q, 'fp32')})")
    print(
        f"        the same on 1 thread, CPU time: {q['fp32 1t'] / q['int8 1t']:.2f}x "
        f"({_gmacs(q, 'int8 1t')} vs {_gmacs(q, 'fp32 1t')})"
    )
    print(f"\n{'fixed width':>22}  {'ucf':>13}  {'ucf csr':>13}  speedup")
    for (case, fixed, csr), factor in zip(fixed_width, (1.5, 1.0), strict=True):
        verdict = "PASS" if csr / fixed >= factor else "FAIL"
        print(
            f"{case:>22}  {fixed * 1e3:10.3f} ms  {csr * 1e3:10.3f} ms  {csr / fixed:5.2f}x  "
            f"{verdict} (target >= {factor}x ucf CSR)"
        )


if __name__ == "__main__":
    with fresh_kernel_cache("ucf-tesa-"):
        main()
