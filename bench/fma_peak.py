"""This CPU's float32 fused multiply-add peak, measured: the yardstick for the block
products (bench/peers.py's bcsr rows and bench/tesa_formats.py quote their GFLOP/s
as a share of it).

    python bench/fma_peak.py                 # 1 and 2 threads
    python bench/fma_peak.py --threads 1 2 4 --seconds 0.5

Each thread runs 12 independent chains of 8-lane float32 FMAs held in registers
(no loads, no stores inside the loop): FMA3's latency is 4 to 5 cycles and a core
issues up to 2 a cycle, so 12 chains keep both pipes full whatever the latency. A
multiply-add is 2 flops, so one instruction is 16. The kernel is C compiled with
``cc -O2 -march=native -fopenmp`` (``UCF_CC`` picks the compiler); the best of
``--repeat`` runs is kept, since nothing but the machine's load can make a
register-only loop slower.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHAINS = 12
LANES = 8

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>

/* Runs `iters` steps of CHAINS independent 8-lane FMA chains on each of `threads`
   threads; returns a sum of the chains so the compiler must compute them. */
float fma_peak(long iters, int threads) {
  float sink = 0.0f;
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 a[CHAINS];
    for (int q = 0; q < CHAINS; q++) a[q] = _mm256_set1_ps(1.0f + q * 0.01f + omp_get_thread_num());
    for (long n = 0; n < iters; n++) {
      #pragma GCC unroll 16
      for (int q = 0; q < CHAINS; q++) a[q] = _mm256_fmadd_ps(a[q], m, c);
    }
    float lanes[8];
    __m256 s = a[0];
    for (int q = 1; q < CHAINS; q++) s = _mm256_add_ps(s, a[q]);
    _mm256_storeu_ps(lanes, s);
    for (int l = 0; l < 8; l++) sink += lanes[l];
  }
  return sink;
}
"""


def build() -> ctypes.CDLL:
    """The kernel as a shared library in a temporary directory."""
    cc = shlex.split(os.environ.get("UCF_CC", "cc"))
    tmp = Path(tempfile.mkdtemp(prefix="fma-peak-"))
    src, lib = tmp / "fma_peak.c", tmp / "fma_peak.so"
    src.write_text(SOURCE)
    cmd = [
        *cc,
        "-O2",
        "-march=native",
        "-fopenmp",
        "-fPIC",
        "-shared",
        f"-DCHAINS={CHAINS}",
        "-o",
        str(lib),
        str(src),
    ]
    subprocess.run(cmd, check=True)
    dll = ctypes.CDLL(str(lib))
    dll.fma_peak.argtypes = [ctypes.c_long, ctypes.c_int]
    dll.fma_peak.restype = ctypes.c_float
    return dll


def peak_gflops(
    threads: int, seconds: float = 0.3, repeat: int = 5, dll: ctypes.CDLL | None = None
) -> float:
    """Best GFLOP/s of the register-only FMA loop on ``threads`` threads, each run about
    ``seconds`` long."""
    dll = dll or build()
    iters = 1 << 16
    while True:  # calibrate on one run
        t0 = time.perf_counter()
        dll.fma_peak(iters, threads)
        took = time.perf_counter() - t0
        if took > seconds / 4:
            break
        iters *= 2
    iters = int(iters * seconds / took)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        dll.fma_peak(iters, threads)
        best = min(best, time.perf_counter() - t0)
    return 2 * CHAINS * LANES * iters * threads / best / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=0.3, help="length of one run")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    dll = build()
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print("| threads | float32 FMA peak |")
    print("|---|---|")
    for t in args.threads:
        print(f"| {t} | {peak_gflops(t, args.seconds, args.repeat, dll):.1f} GFLOP/s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
