"""SpMV's row walk as the default compiles it against the same walk as main compiled it
before issue 38's banded row was met, with scipy and MKL beside (issue 38; bench/README.md,
"Where banded SpMV's row loop lies").

    python bench/banded_spmv.py                          # every row, 1 thread, 15 rounds
    UCF_ADAPTIVE_TEAM=0 python bench/banded_spmv.py --threads 2 --rows banded

Rows: bench/peers.py's SpMV matrices (``banded``: 2M rows of 15 diagonals; ``uniform``:
200k rows of 10 at random columns; ``rmat``: scale 20). Contenders:

- ``default``: ucf's default kernel;
- ``8 KB, LLVM's placement``: the same kernel with the stream prefetches 8 KB ahead
  and no ``llvm.loop.align`` on the walks (``ucf.passes.streams``'s ``DISTANCE`` and
  ``LINE`` as they were), compiled into a kernel cache of its own;
- ``6 KB, LLVM's placement`` and ``8 KB, aligned``: one change at a time;
- ``scipy``: its ``csr_matvec`` into a zeroed y; ``mkl``: MKL's inspector-executor,
  its handle optimized at the run's thread count (bench/peer_libs.py), when
  sparse_dot_mkl is installed;
- ``read``: numpy's sum of A's values and of its coordinates (the bytes the walk
  streams, at the rate one pass of vector loads reads them: the ceiling).

Each contender runs once untimed, then ``--repeat`` interleaved rounds, each timed call
after an untimed one of its own (``timings(..., paired=True)``), in process CPU time
(on 2 threads both threads' time: wall time on a loaded machine says nothing), and the
median is printed in ms, over scipy's, and in GB/s of what SpMV moves (A's values,
coordinates and positions, x and y once).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import scipy.sparse._sparsetools as sparsetools

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from spmv_spmm import banded, fresh_kernel_cache, rmat, timings, uniform  # noqa: E402

import ucf  # noqa: E402
from ucf.passes import streams  # noqa: E402

SPMV = "y(i) = A(i,j) * x(j)"
#: The walks' settings each ucf contender compiles with: (``DISTANCE``, ``LINE``).
VARIANTS = {
    "default": (streams.DISTANCE, streams.LINE),
    "8 KB, LLVM's placement": (8192, 0),
    "6 KB, LLVM's placement": (6144, 0),
    "8 KB, aligned": (8192, 64),
}


def matrix(name: str, rng):
    return {
        "banded": lambda: banded(2_000_000, 15, rng),
        "uniform": lambda: uniform(200_000, 10, rng),
        "rmat": lambda: rmat(20, 16, rng),
    }[name]()


@contextmanager
def walk_settings(distance: int, line: int) -> Iterator[None]:
    """``ucf.passes.streams``'s ``DISTANCE`` and ``LINE`` set to these while the block
    compiles (into a kernel cache of its own: the cache does not key on them)."""
    saved = streams.DISTANCE, streams.LINE
    streams.DISTANCE, streams.LINE = distance, line
    try:
        yield
    finally:
        streams.DISTANCE, streams.LINE = saved


def ucf_kernel(a, x, want: np.ndarray, distance: int, line: int):
    """A call of the default kernel compiled with the walks' settings given; its
    ``walk`` says what the kernel's prefetch note says, after the timings too."""
    with walk_settings(distance, line), fresh_kernel_cache("ucf-banded-spmv-"):
        k = ucf.compile(SPMV, formats={"A": "csr"})
        np.testing.assert_allclose(np.asarray(k(A=a, x=x)), want, rtol=1e-12, atol=1e-12)
    call = lambda: k(A=a, x=x)  # noqa: E731
    call.walk = lambda: " ".join(
        line.split(" fetched ")[1] for line in k.cin.splitlines() if "# prefetch:" in line
    )
    return call


def contenders(m, x: np.ndarray, threads: int) -> dict[str, callable]:
    want = m @ x
    a = ucf.from_scipy(m, format="csr")
    calls = {name: ucf_kernel(a, x, want, *v) for name, v in VARIANTS.items()}
    y = np.zeros(m.shape[0])

    def scipy_spmv():
        y[:] = 0.0
        sparsetools.csr_matvec(*m.shape, m.indptr, m.indices, m.data, x, y)

    calls["scipy"] = scipy_spmv
    try:
        import peer_libs

        mkl = peer_libs.Mkl()
    except (ImportError, RuntimeError, KeyError) as e:
        print(f"mkl: not timed ({e})")
    else:
        mkl.threads(threads)
        mv = mkl.spmv(m)
        np.testing.assert_allclose(mv(x), want, rtol=1e-12, atol=1e-12)
        calls["mkl"] = lambda: mv(x)
    calls["read"] = lambda: (np.add.reduce(m.data), np.add.reduce(m.indices, dtype=np.int32))
    return calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", default=["banded", "uniform", "rmat"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    ucf.set_num_threads(args.threads)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.threads} thread(s)")
    for seed, name in enumerate(args.rows):
        rng = np.random.default_rng([38, seed])
        m = matrix(name, rng)
        x = rng.random(m.shape[1])
        calls = contenders(m, x, args.threads)
        moved = m.data.nbytes + m.indices.nbytes + m.indptr.nbytes + x.nbytes + 8 * m.shape[0]
        times = timings(calls, args.repeat, time.process_time, paired=True)
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(f"\n| {name} (load {os.getloadavg()[0]:.2f}) | ms | over scipy | GB/s | walk |")
        print("|---|---|---|---|---|")
        for k, t in med.items():
            gbs = (m.data.nbytes + m.indices.nbytes if k == "read" else moved) / t / 1e9
            walk = calls[k].walk() if hasattr(calls[k], "walk") else ""
            print(f"| {k} | {t * 1e3:.2f} | {t / med['scipy']:.2f} | {gbs:.1f} | {walk} |")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
