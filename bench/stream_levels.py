"""SpMV's stream prefetch into the L1, into the L2 (``streams(j, 2)``), or none, against
scipy, and what the default chose (issue 38; ``ucf.schedule.far_streams``).

    python bench/stream_levels.py                     # every row, 1 thread, 9 rounds
    python bench/stream_levels.py --rows uniform --threads 2 --repeat 15

Rows: bench/peers.py's matrices (``uniform``: 200k rows of 10 at random columns, x of
1.6 MB; ``banded``: 2M rows of 15 diagonals; ``rmat``: scale 20, its entries crowded
into a few columns), and uniform rows of 10 whose columns are drawn from the first
``c`` only (``uniform x=32K`` ...: x's part read takes that many bytes, 1M rows), where
the reads of x hit the L1 or L2 while A streams from memory. Each row prints ucf's
kernel with the stream prefetch into the L1 (``streams(j, 1)``, as without the command),
into the L2 (``streams(j, 2)``) and without it (``UCF_STREAM_PREFETCH=0``), the
default, and scipy's ``csr_matvec`` (into a zeroed y), as milliseconds and over scipy's
time. The default must be within ``CHOSEN`` of the faster of the two levels.

Each contender runs once untimed, then the contenders interleave ``--repeat`` rounds, each
timed call right after an untimed one of the same contender (as bench/peers.py: a call
then finds the allocator as its own last call left it), in
process CPU time (on 2 threads: both threads' time, not the wall's, which a loaded
machine makes meaningless), and the median is kept. The kernel cache is a fresh
directory, so compile time stays out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import scipy.sparse._sparsetools as sparsetools

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from spmv_spmm import banded, fresh_kernel_cache, rmat, timings, uniform  # noqa: E402

import ucf  # noqa: E402

SPMV = "y(i) = A(i,j) * x(j)"
#: The default's time over the faster level's, at most.
CHOSEN = 1.10
#: The contenders, as the table shows them.
COLUMNS = ("L1", "L2", "none", "default", "scipy")
#: The ``uniform x=`` rows: the bytes of x the columns are drawn from.
NARROW = {"uniform x=32K": 1 << 15, "uniform x=256K": 1 << 18, "uniform x=1M": 1 << 20}


def matrix(name: str, rng) -> sp.csr_matrix:
    if name == "uniform":
        return uniform(200_000, 10, rng)
    if name == "banded":
        return banded(2_000_000, 15, rng)
    if name == "rmat":
        return rmat(20, 16, rng)
    m = uniform(1_000_000, 10, rng)
    m.indices %= NARROW[name] // 8
    m.sort_indices()
    m.sum_duplicates()
    return m


def contenders(m: sp.csr_matrix, x: np.ndarray, threads: int) -> dict[str, callable]:
    """ucf's kernels for ``m`` (each called once, so the default has planned) and scipy's."""
    a = ucf.from_scipy(m, format="csr")
    par = "parallelize(i, CPUThread, NoRaces); " if threads > 1 else ""
    kernels = {
        "L1": ucf.compile(SPMV, formats={"A": "csr"}, schedule=f"{par}streams(j, 1)"),
        "L2": ucf.compile(SPMV, formats={"A": "csr"}, schedule=f"{par}streams(j, 2)"),
        "default": ucf.compile(SPMV, formats={"A": "csr"}),
    }
    os.environ["UCF_STREAM_PREFETCH"] = "0"
    try:
        kernels["none"] = ucf.compile(SPMV, formats={"A": "csr"}, schedule=par.strip("; "))
        kernels["none"](A=a, x=x)
    finally:
        del os.environ["UCF_STREAM_PREFETCH"]
    calls = {name: (lambda k=k: k(A=a, x=x)) for name, k in kernels.items()}
    calls["default"]()
    calls["default"].chosen = kernels["default"].schedule_used
    y = np.zeros(m.shape[0])

    def scipy_spmv():
        y[:] = 0.0
        sparsetools.csr_matvec(*m.shape, m.indptr, m.indices, m.data, x, y)

    calls["scipy"] = scipy_spmv
    return calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", default=["uniform", "banded", "rmat", *NARROW])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args(argv)
    ucf.set_num_threads(args.threads)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.threads} thread(s)")
    print(f"| row | {' | '.join(COLUMNS)} | default chose |")
    print("|---|---|---|---|---|---|---|")
    missed = []
    with fresh_kernel_cache("ucf-stream-levels-"):
        for seed, name in enumerate(args.rows):
            rng = np.random.default_rng([38, seed])
            m = matrix(name, rng)
            calls = contenders(m, rng.random(m.shape[1]), args.threads)
            chosen = calls["default"].chosen
            med = {
                k: float(np.median(v))
                for k, v in timings(calls, args.repeat, time.process_time, paired=True).items()
            }
            cells = [f"{med[k] * 1e3:.2f} ({med[k] / med['scipy']:.2f})" for k in COLUMNS]
            print(f"| {name} | " + " | ".join(cells) + f" | `{chosen}` |")
            if med["default"] > CHOSEN * min(med["L1"], med["L2"]):
                missed.append(name)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    for name in missed:
        print(f"NOT met: {name}: the default over {CHOSEN}x the faster level")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
