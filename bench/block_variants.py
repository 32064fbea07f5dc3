"""Variants of ucf's own bcsr(32,32) SpMM kernel, 1024^3 float32, in a C harness
(issue 38, item 3): what the call would cost with B read in place instead of packed
into panels, and with each block row's slice of C accumulated in a per-thread buffer
that stays in L2, the row's last block writing C once.

    python bench/block_variants.py                         # 1 and 2 threads, 90 % and 50 %
    python bench/block_variants.py --zero 0.9 --threads 2 --repeat 101

The harness takes the C source ucf generates for the default kernel on two threads
(``target="c"``, ``k.c_source``) and derives each variant from it by replacing a few of
its statements (an assertion fails, naming the statement, if ucf's source no longer has
it), so every variant keeps ucf's tiles, first-block zeros, team cache and prefetches
except where it says:

- ``base``: ucf's kernel as generated where it packs every panel
  (``block_rows.IN_PLACE_USES`` 0);
- ``in place``: the tiles read B's rows where they are (no panel is packed; the
  prefetch of the next block's B rows, which ucf emits for a panel not yet packed,
  runs before every block): what ucf's kernel does where the call stores at most
  ``IN_PLACE_USES`` blocks a block column;
- ``scratch``: the panels as generated, and each block row's slice of C (32 rows of
  C's columns) accumulated in a buffer of the thread's, the row's last block storing
  its tiles into C with streaming stores;
- ``both``: in place and scratch;
- ``both, plain stores``: in place and scratch, the last block storing C with plain
  stores.

The operands are block_peak.py's (the same seeds, B 16 bytes off a 64-byte boundary as
numpy's allocation puts it), checked against numpy before timing. Each round calls
every variant once, in turn, each call after a 64 MB read-and-write sweep ("cold":
B, C and the panels out of the caches, dirty lines in them, as torch's matmul leaves
them in block_peak.py) or right after the same call ("warm"). The loop over block rows
is shared out statically with each thread's CPU time in it taken on its own clock, so
the larger thread's CPU time is the call's critical path as the OS's descheduling
does not inflate it (meaningful on a loaded machine, where wall time at 2 threads is
not); the wall time is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import fma_peak  # noqa: E402
from spmv_spmm import fresh_kernel_cache  # noqa: E402
from tesa_formats import BLOCK, SPMM, block_sparse  # noqa: E402

import ucf  # noqa: E402
from ucf.schedule import block_rows  # noqa: E402

VARIANTS = ("base", "in place", "scratch", "both", "both, plain stores")

#: The tile's load of B from its panel, and the same place of B itself.
PANEL_LOAD = (
    "(*(const ucf_f32x16_u*)&B_panel0[{open}(panel_at0 + ((((j_tile0 - (j_chunk0 * "
    "INT64_C(4096))) * INT64_C(32)) + k_in) * INT64_C(32))){plus}])"
)
IN_PLACE_LOAD = "(*(const ucf_f32x16_u*)&B_vals[(((k_blk * 32) + k_in) * B_dim2) + j_vec0{plus}])"
#: The test before packing a panel (its tag stale), which ``in place`` makes false.
PACK_TEST = re.compile(
    r"\n(\s*)if \((\(\(\(\(k_blk \* .*?__atomic_load_n\(&panel_tags0\[panel_slot0\], "
    r"__ATOMIC_ACQUIRE\))"
)
#: A tile's place in C, by its row (0 to 7) and vector (0 or 1); and in the scratch.
C_PLACE = (
    "((((i_blk * INT64_C(32)) + i_in_r{r}) * C_dim2) + j_vec0)",
    "(((((i_blk * INT64_C(32)) + i_in_r{r}) * C_dim2) + j_vec0) + INT64_C(16))",
)
S_PLACE = ("((i_in_r{r} * C_dim2) + j_vec0)", "((i_in_r{r} * C_dim2) + j_vec0 + 16)")


def must_replace(text: str, old: str, new: str, count: int = -1) -> str:
    """``text`` with ``old`` replaced; ucf's source must hold it."""
    if old not in text:
        raise SystemExit(f"ucf's C source no longer holds {old!r}: update bench/block_variants.py")
    return text.replace(old, new, count)


def in_place(kernel: str) -> str:
    """``kernel`` reading B's rows in place, packing nothing."""
    for opened, plus in (("", ""), ("(", " + INT64_C(16))")):
        old = PANEL_LOAD.format(open=opened, plus=plus)
        new = IN_PLACE_LOAD.format(plus=" + 16" if plus else "")
        kernel = must_replace(kernel, old, new)
    m = PACK_TEST.search(kernel)
    if m is None:
        raise SystemExit("ucf's C source no longer tests a panel's tag before packing it")
    return kernel[: m.start()] + f"\n{m.group(1)}if (0 && {m.group(2)}" + kernel[m.end() :]


def scratch(kernel: str, stream: bool = True) -> str:
    """``kernel`` accumulating each block row's slice of C in the thread's buffer ``S``,
    the row's last block storing C (with streaming stores if ``stream``)."""
    kernel = must_replace(
        kernel,
        'UCF_OMP("omp for',
        "float* S = (float*)aligned_alloc(64, 32 * C_dim2 * sizeof(float) + 64);\n"
        '    UCF_OMP("omp for',
        1,
    )
    kernel = must_replace(
        kernel, "    h85_tcpu[", "    _mm_sfence();\n    free(S);\n    h85_tcpu[", 1
    )
    kernel = must_replace(
        kernel,
        "int64_t first_block0 =",
        "int64_t last_block0 = (pA1 == ((int64_t)A1_pos[(pA0 + INT64_C(1))]) - 1);\n"
        "        int64_t first_block0 =",
        1,
    )
    for r in range(8):
        for v in range(2):
            c, s, acc = C_PLACE[v].format(r=r), S_PLACE[v].format(r=r), f"acc{2 * r + v}"
            load = f"{acc} = (*(const ucf_f32x16_u*)&C_vals[{c}]);"
            kernel = must_replace(kernel, load, f"{acc} = (*(const ucf_f32x16*)&S[{s}]);")
            out = (
                f"_mm512_stream_ps(&C_vals[{c}], (__m512){acc});"
                if stream
                else f"(*(ucf_f32x16_u*)&C_vals[{c}]) = {acc};"
            )
            store = f"(*(ucf_f32x16_u*)&C_vals[{c}]) = {acc};"
            new = f"if (last_block0) {out} else (*(ucf_f32x16*)&S[{s}]) = {acc};"
            kernel = must_replace(kernel, store, new)
    return kernel


def timed(kernel: str, name: str, schedule: str) -> str:
    """``kernel`` renamed ``name``, its loop over block rows shared out by ``schedule``
    without the closing barrier, each thread's CPU time in the region kept in
    ``h85_tcpu``."""
    kernel = must_replace(kernel, "void kernel(", f"void {name}(", 1)
    kernel = must_replace(kernel, 'UCF_OMP("omp for schedule(', 'UCF_OMP("omp for schedule(', 1)
    kernel = re.sub(r"omp for schedule\([^)]*\)", f"omp for schedule({schedule}) nowait", kernel)
    kernel = must_replace(
        kernel,
        "  {\n    int64_t ucf_bytes_B_panel1",
        "  {\n    double h85_t0 = h85_tc();\n    int64_t ucf_bytes_B_panel1",
        1,
    )
    return must_replace(
        kernel,
        "    free(ucf_raw_B_panel1);",
        "    h85_tcpu[omp_get_thread_num()] = h85_tc() - h85_t0;\n    free(ucf_raw_B_panel1);",
        1,
    )


DRIVER = r"""
#define _GNU_SOURCE
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef void (*kfn)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
  int64_t, int64_t, int64_t, const int32_t*, const int32_t*, const float*, int64_t, int64_t,
  int64_t, const float*, int64_t, int64_t, int64_t, float*);
extern double h85_tcpu[64];
%(decls)s
static void* load(const char* dir, const char* name, size_t* n, size_t off) {
  char p[4096]; snprintf(p, sizeof p, "%%s/%%s", dir, name);
  FILE* f = fopen(p, "rb"); if (!f) { perror(p); exit(2); }
  fseek(f, 0, SEEK_END); *n = ftell(f); fseek(f, 0, SEEK_SET);
  char* b = aligned_alloc(4096, (*n + off + 4095) / 4096 * 4096); b += off;
  if (fread(b, 1, *n, f) != *n) exit(2); fclose(f); return b;
}
static double now(clockid_t c) {
  struct timespec t; clock_gettime(c, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmp(const void* a, const void* b) {
  double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y;
}
int main(int argc, char** argv) {
  const char* dir = argv[1]; int rounds = atoi(argv[2]), cold = atoi(argv[3]);
  size_t c_off = (size_t)atoi(argv[4]);
  size_t n, nb;
  float* B = load(dir, "B.bin", &n, 16);
  int32_t* pos = load(dir, "pos.bin", &n, 0);
  int32_t* crd = load(dir, "crd.bin", &nb, 0); nb /= 4;
  float* vals = load(dir, "vals.bin", &n, 0);
  float* ref = load(dir, "ref.bin", &n, 0);
  float* C = (float*)((char*)aligned_alloc(4096, 1024 * 1024 * 4 + 4096) + c_off);
  size_t sweep_n = (64 << 20) / 4; float* sweep = aligned_alloc(64, sweep_n * 4);
  memset(sweep, 0, sweep_n * 4);
  kfn ks[] = {%(names)s}; int K = sizeof ks / sizeof *ks;
  double* wall = malloc(sizeof(double) * K * rounds);
  double* cpu = malloc(sizeof(double) * K * rounds);
  double* crit = malloc(sizeof(double) * K * rounds);
  int threads = omp_get_max_threads();
#define CALL(f) f(32, 32, 32, 32, 1024, 1024, 1024, 32, 32, 32, 32, pos, crd, vals, \
                  32, 32, 1024, B, 32, 32, 1024, C)
  for (int r = -2; r < rounds; r++)
    for (int q = 0; q < K; q++) {
      int v = (q + (r < 0 ? 0 : r)) %% K;
      if (cold) { for (size_t i = 0; i < sweep_n; i += 16) sweep[i] += 1.0f; }
      else CALL(ks[v]);
      double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
      CALL(ks[v]);
      double w1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_PROCESS_CPUTIME_ID);
      double most = 0;
      for (int t = 0; t < threads; t++) {
        if (h85_tcpu[t] > most) most = h85_tcpu[t];
        h85_tcpu[t] = 0;
      }
      if (r < 0) {
        for (int i = 0; i < 1024 * 1024; i++)
          if (fabs(C[i] - ref[i]) > 1e-4 * (fabs(ref[i]) + 1)) {
            printf("variant %%d wrong at %%d\n", v, i);
            return 1;
          }
        memset(C, 0x7f, 1024 * 1024 * 4);  /* NaNs: a variant must write every element */
        continue;
      }
      wall[v * rounds + r] = w1 - w0; cpu[v * rounds + r] = c1 - c0; crit[v * rounds + r] = most;
    }
  for (int v = 0; v < K; v++) {
    qsort(wall + v * rounds, rounds, sizeof(double), cmp);
    qsort(cpu + v * rounds, rounds, sizeof(double), cmp);
    qsort(crit + v * rounds, rounds, sizeof(double), cmp);
    printf("%%d %%.6f %%.6f %%.6f %%.6f\n", v, wall[v * rounds + rounds / 4],
           wall[v * rounds + rounds / 2], cpu[v * rounds + rounds / 2],
           crit[v * rounds + rounds / 2]);
  }
  return 0;
}
"""

PRELUDE = r"""
#include <immintrin.h>
#include <omp.h>
#include <time.h>
double h85_tcpu[64];
static double h85_tc(void) {
  struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
"""


def sources(schedule: str) -> str:
    """The variants' C, one function each, from ucf's source of the 2-thread kernel
    that packs at every density (``block_rows.IN_PLACE_USES`` 0; the kernel cache is the
    run's own, so no kernel compiled with another value is taken)."""
    block_rows.IN_PLACE_USES = 0
    ucf.set_num_threads(2)
    k = ucf.compile(SPMM, formats={"A": f"bcsr({BLOCK},{BLOCK})"}, dtype="float32", target="c")
    head, body = k.c_source.split("void kernel(", 1)
    body = "void kernel(" + body
    out = [head, PRELUDE]
    for i, name in enumerate(VARIANTS):
        if name == "base":
            text = timed(body, f"k{i}", schedule)
        elif name == "in place":
            text = timed(in_place(body), f"k{i}", schedule)
        elif name == "scratch":
            text = scratch(timed(body, f"k{i}", schedule))
        elif name == "both":
            text = scratch(timed(in_place(body), f"k{i}", schedule))
        else:
            text = scratch(timed(in_place(body), f"k{i}", schedule), stream=False)
        out.append(text)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zero", type=float, nargs="+", default=[0.9, 0.5])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=41)
    ap.add_argument("--schedule", default="static", help="the OpenMP schedule of block rows")
    ap.add_argument(
        "--c-offset",
        type=int,
        default=0,
        help="C's bytes past a 4 KB boundary (B's are 16, as numpy's allocation puts them)",
    )
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="block-variants-"))
    (tmp / "kernels.c").write_text(sources(args.schedule))
    names = [f"k{i}" for i in range(len(VARIANTS))]
    (tmp / "main.c").write_text(
        DRIVER
        % {
            "decls": " ".join(f"void {n}();" for n in names),
            "names": ", ".join(f"(kfn){n}" for n in names),
        }
    )
    cc = os.environ.get("UCF_CC", "cc").split()
    exe = tmp / "variants"
    flags = ["-O3", "-march=native", "-fopenmp", "-w"]
    subprocess.run(
        [*cc, *flags, "-o", str(exe), str(tmp / "main.c"), str(tmp / "kernels.c"), "-lm"],
        check=True,
    )
    rng = np.random.default_rng(0)  # block_peak.py's operands: B, then A at 90 %, at 50 %
    b = rng.random((1024, 1024), dtype=np.float32)
    print(f"{fma_peak.cpu_name()}; load average at start: {os.getloadavg()[0]:.2f}\n")
    print(
        "| zero blocks | threads | caches | variant | larger thread's CPU (ms) | over base | "
        "process CPU (ms) | wall, median / q25 (ms) | GFLOP/s (larger thread) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for zero in (0.9, 0.5):
        a = block_sparse(rng, 1024, BLOCK, zero)
        if not any(abs(zero - z) < 1e-9 for z in args.zero):
            continue
        t = ucf.from_numpy(a, format=f"bcsr({BLOCK},{BLOCK})")
        data = tmp / f"z{zero}"
        data.mkdir()
        b.tofile(data / "B.bin")
        for name, arr in zip(("pos", "crd", "vals"), t.arrays, strict=True):
            arr.tofile(data / f"{name}.bin")
        (a.astype(np.float64) @ b).astype(np.float32).tofile(data / "ref.bin")
        flops = 2.0 * t.vals.size * 1024
        for threads in args.threads:
            for cold in (1, 0):
                env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "passive"}
                run = subprocess.run(
                    [str(exe), str(data), str(args.repeat), str(cold), str(args.c_offset)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rows = [line.split() for line in run.stdout.splitlines()]
                base = float(rows[0][4])
                for v, q25, wall, cpu, crit in rows:
                    crit_s = float(crit)
                    print(
                        f"| {zero:.0%} | {threads} | {'cold' if cold else 'warm'} | "
                        f"{VARIANTS[int(v)]} | {crit_s * 1e3:.3f} | {crit_s / base:.2f}x | "
                        f"{float(cpu) * 1e3:.3f} | "
                        f"{float(wall) * 1e3:.3f} / {float(q25) * 1e3:.3f} | "
                        f"{flops / crit_s / 1e9:.0f} |"
                    )
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    with fresh_kernel_cache("ucf-block-variants-"):
        sys.exit(main())
