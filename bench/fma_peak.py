"""This CPU's float32 fused multiply-add peak, measured: the yardstick for the block
products (bench/block_peak.py quotes their GFLOP/s as a share of it).

    python bench/fma_peak.py                 # 1 and 2 threads
    python bench/fma_peak.py --threads 1 2 4 --seconds 0.5

Each thread runs 12 independent chains of 8-lane float32 FMAs held in registers
(no loads, no stores inside the loop): FMA3's latency is 4 to 5 cycles and a core
issues up to 2 a cycle, so 12 chains keep both pipes full whatever the latency. A
multiply-add is 2 flops, so one instruction is 16. Where the compiler targets
AVX-512, 24 chains of 16-lane vectors run too, and the peak is the faster of the two
(the same on Zen 4, which splits a 512-bit FMA in two; twice the 256-bit rate on a
core with full-width 512-bit FMA units, Zen 5's). The kernel is C compiled with
``cc -O2 -march=native -fopenmp`` (``UCF_CC`` picks the compiler); the best of
``--repeat`` runs is kept, since nothing but the machine's load can make a
register-only loop slower.

Where the compiler targets AVX-512, the library also holds ``tile_8x2``: ucf's register
tile for float32 blocks (8 rows x 2 vectors, 32 steps) on a packed panel in L2, which
bench/block_peak.py times beside the peak as the tile's rate without memory traffic.
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
from typing import Any

CHAINS = 12
LANES = 8

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>

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

#ifdef __AVX512F__
/* The same with 16-lane vectors: on a CPU with AVX-512 its 32 registers hold 24
   chains. Zen 4 splits each into two 8-lane halves (the same peak); a CPU with two
   full-width FMA units runs twice the flops. */
float fma_peak512(long iters, int threads) {
  float sink = 0.0f;
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a[2 * CHAINS];
    for (int q = 0; q < 2 * CHAINS; q++)
      a[q] = _mm512_set1_ps(1.0f + q * 0.01f + omp_get_thread_num());
    for (long n = 0; n < iters; n++) {
      #pragma GCC unroll 32
      for (int q = 0; q < 2 * CHAINS; q++) a[q] = _mm512_fmadd_ps(a[q], m, c);
    }
    __m512 s = a[0];
    for (int q = 1; q < 2 * CHAINS; q++) s = _mm512_add_ps(s, a[q]);
    sink += _mm512_reduce_add_ps(s);
  }
  return sink;
}

/* ucf's register tile for float32 blocks on AVX-512 (ucf.passes.registers: 8 rows x 2
   16-lane vectors of C, a reduction of 32 steps, each step 2 loads of the panel and 8
   broadcasts of A), run over a packed panel of 32 tiles (128 KB, in L2) into 8 rows of
   C (32 KB): the rate of the tile when nothing comes from memory. `tiles` tiles of
   16,384 flops on each of `threads` threads. */
float tile_8x2(long tiles, int threads) {
  float sink = 0.0f;
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    float *panel = aligned_alloc(64, 32 * 1024 * sizeof(float));
    float *c = aligned_alloc(64, 8 * 1024 * sizeof(float));
    float a[8 * 32];
    for (int q = 0; q < 32 * 1024; q++) panel[q] = 1e-3f * (q % 97);
    for (int q = 0; q < 8 * 1024; q++) c[q] = 0.0f;
    for (int q = 0; q < 8 * 32; q++) a[q] = 1e-2f * (q % 13);
    for (long n = 0; n < tiles; n++) {
      const float *p = panel + (n & 31) * 1024;
      float *t = c + (n & 31) * 32;
      __m512 acc[16];
      #pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {
        acc[2 * r] = _mm512_loadu_ps(t + r * 1024);
        acc[2 * r + 1] = _mm512_loadu_ps(t + r * 1024 + 16);
      }
      for (int k = 0; k < 32; k++) {
        const __m512 v0 = _mm512_load_ps(p + k * 32), v1 = _mm512_load_ps(p + k * 32 + 16);
        #pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
          const __m512 x = _mm512_set1_ps(a[r * 32 + k]);
          acc[2 * r] = _mm512_fmadd_ps(x, v0, acc[2 * r]);
          acc[2 * r + 1] = _mm512_fmadd_ps(x, v1, acc[2 * r + 1]);
        }
      }
      #pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {
        _mm512_storeu_ps(t + r * 1024, acc[2 * r]);
        _mm512_storeu_ps(t + r * 1024 + 16, acc[2 * r + 1]);
      }
    }
    sink += c[5];
    free(panel);
    free(c);
  }
  return sink;
}
#endif
"""

#: The flops of one tile of ``tile_8x2``: 8 rows x 32 columns x 32 steps, 2 each.
TILE_FLOPS = 2 * 8 * 32 * 32


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with its family and model: the hosts this runs
    on change between sessions, and the peak with them (AMD family 25 is Zen 3, without
    AVX-512, and Zen 4, whose 512-bit FMAs take two passes, so both loops peak alike;
    family 26 is Zen 5, whose 512-bit loop runs twice the 256-bit one)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU unknown"
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        found.setdefault(key.strip(), value.strip())
    name = found.get("model name", "CPU unknown")
    return f"{name} (family {found.get('cpu family', '?')}, model {found.get('model', '?')})"


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
    for name in ("fma_peak", "fma_peak512", "tile_8x2"):
        if hasattr(dll, name):
            getattr(dll, name).argtypes = [ctypes.c_long, ctypes.c_int]
            getattr(dll, name).restype = ctypes.c_float
    return dll


def widths(dll: ctypes.CDLL) -> dict[int, Any]:
    """The loops this CPU has, by vector width in bits: 256 (AVX2), and 512 where the
    compiler targets AVX-512."""
    found = {256: dll.fma_peak}
    if hasattr(dll, "fma_peak512"):
        found[512] = dll.fma_peak512
    return found


def lanes(width: int) -> int:
    """The float32 multiply-adds one step of the ``width``-bit loop does: ``CHAINS``
    chains of 8 lanes at 256 bits, twice the chains of twice the lanes at 512."""
    return {256: CHAINS * LANES, 512: 2 * CHAINS * 2 * LANES}[width]


def peak_gflops(
    threads: int,
    seconds: float = 0.3,
    repeat: int = 5,
    dll: ctypes.CDLL | None = None,
    width: int | None = None,
) -> float:
    """Best GFLOP/s of the register-only FMA loop on ``threads`` threads, each run about
    ``seconds`` long: of the ``width``-bit loop, or the best of every width the CPU has."""
    dll = dll or build()
    if width is None:
        return max(peak_gflops(threads, seconds, repeat, dll, w) for w in widths(dll))
    fn = widths(dll)[width]
    iters = 1 << 16
    while True:  # calibrate on one run
        t0 = time.perf_counter()
        fn(iters, threads)
        took = time.perf_counter() - t0
        if took > seconds / 4:
            break
        iters *= 2
    iters = int(iters * seconds / took)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(iters, threads)
        best = min(best, time.perf_counter() - t0)
    return 2 * lanes(width) * iters * threads / best / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=0.3, help="length of one run")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    dll = build()
    print(f"{cpu_name()}; load average: {os.getloadavg()[0]:.2f}")
    found = widths(dll)
    print("| threads | " + " | ".join(f"{w}-bit FMA" for w in found) + " | peak |")
    print("|---|" + "---|" * (len(found) + 1))
    for t in args.threads:
        got = [peak_gflops(t, args.seconds, args.repeat, dll, w) for w in found]
        cells = " | ".join(f"{g:.1f} GFLOP/s" for g in got)
        print(f"| {t} | {cells} | {max(got):.1f} GFLOP/s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
