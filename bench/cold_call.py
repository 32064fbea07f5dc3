"""What makes bench/block_peak.py's "ucf" call slower than "ucf warm" (issue 38): the
same bcsr(32,32) SpMM call, 1024^3 float32, timed right after each of several runs that
touch nothing of it, or only a part of it.

    python bench/cold_call.py                       # 90 % zero blocks, 1 thread, CPU time
    python bench/cold_call.py --zero 0.5 --repeat 41

Each round runs every predecessor once, each followed by the timed call; the table
gives the call's median, its excess over the call straight after itself ("the call
again"), and the predecessor's own median wall time. The predecessors:

- the call again: the operands, ucf's panels of B and C as the last call left them;
- time only: ``time.sleep``, and a busy-wait of Python (no memory worth speaking of);
- the register-only FMA loop of bench/fma_peak.py (touches no memory at all);
- torch's dense matmul, as block_peak.py runs it between the calls;
- a read-and-write sweep of 64 MB (twice the L3), then optionally one part of the
  call's memory written or read again: B (read), C (the output the call writes: the
  last call's, which its replay kept, or the one ucf's recycled pool hands it; written),
  or the panels (glibc's chunk of the panels' size: the call
  frees its panels on return and glibc hands that chunk to the next request of the
  size, the next call's; held over a call, that call faulted fresh pages in instead).

If the register-only loop costs the call as much as torch's matmul of the same length,
what makes the call cold is the time it waits, not what ran before it in this process:
on a shared host the L3 (and on a loaded guest the L1 and L2) lose the call's lines to
other tenants meanwhile, as they would in a real program. The sweep rows say which of
the call's arrays it pays for. One thread in process CPU time by default (steady on a
loaded machine); ``--threads 2`` times wall time.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
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
from ucf.exec import recycled  # noqa: E402
from ucf.ir import nodes as ir  # noqa: E402

#: The sweep that evicts the call's lines: twice this CPU's 32 MB L3.
SWEEP_BYTES = 64 << 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--zero", type=float, default=0.9, help="the share of zero blocks")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=31)
    ap.add_argument("--pause-ms", type=float, default=3.0, help="sleep and busy-wait length")
    args = ap.parse_args(argv)
    ucf.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    dll = fma_peak.build()
    import torch

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    b = rng.random((args.n, args.n), dtype=np.float32)
    a = block_sparse(rng, args.n, BLOCK, args.zero)
    kernel = ucf.compile(SPMM, formats={"A": f"bcsr({BLOCK},{BLOCK})"}, dtype="float32")
    t = ucf.from_numpy(a, format=f"bcsr({BLOCK},{BLOCK})")
    np.testing.assert_allclose(kernel(A=t, B=b).to_numpy(), a @ b, rtol=2e-3, atol=1e-2)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    big = np.ones(SWEEP_BYTES // 4, dtype=np.float32)
    pause = args.pause_ms / 1e3
    # the FMA loop's steps that take about as long as the pause
    steps = 1 << 16
    t0 = time.perf_counter()
    fma_peak.widths(dll)[256](steps, args.threads)
    steps = max(1, int(steps * pause / (time.perf_counter() - t0)))
    # the team's or a thread's: 32 slots of 128 KB, and the 64 bytes of ir.ALIGN, and where
    # that takes a huge page the huge page more that ir.Alloc.huge asks malloc for
    nbytes = 4 * args.n * args.n + ir.ALIGN
    panels = Panels(nbytes + (ir.HUGE_BYTES if nbytes >= ir.HUGE_BYTES else 0))

    def call():
        return kernel(A=t, B=b)

    def sweep():
        big.__iadd__(1.0)

    def output():  # the array the next call writes: the last one, which its replay kept
        # (the caller let go of it; ucf.exec.replay), else the one the pool hands it
        kept = [r.kept[1] for r in kernel._local.replays if getattr(r, "kept", None)]
        return kept[0] if kept else recycled._idle[args.n * args.n * 4][-1]

    call()
    print(f"{fma_peak.cpu_name()}; load average {os.getloadavg()[0]:.2f}")
    before = {
        "the call again": call,
        f"sleep {args.pause_ms:g} ms": lambda: time.sleep(pause),
        f"busy-wait {args.pause_ms:g} ms": lambda: busy(pause),
        "register-only FMA loop": lambda: fma_peak.widths(dll)[256](steps, args.threads),
        "torch dense matmul": lambda: ta @ tb,
        "64 MB sweep": sweep,
        "sweep, then B read": lambda: (sweep(), b.sum()),
        "sweep, then C written": lambda: (sweep(), output().fill(1)),
        "sweep, then the panels written": lambda: (sweep(), panels.write()),
        "sweep, then all three": lambda: (sweep(), b.sum(), output().fill(1), panels.write()),
    }
    took = {k: [] for k in before}
    own = {k: [] for k in before}
    for f in before.values():
        f()
        call()
    for _ in range(args.repeat):
        for k, f in before.items():
            t0 = time.perf_counter()
            f()
            own[k].append(time.perf_counter() - t0)
            t0 = clock()
            call()
            took[k].append(clock() - t0)
    flops = 2.0 * t.vals.size * args.n
    warm = float(np.median(took["the call again"]))
    kind = "process CPU time" if args.threads == 1 else "wall time"
    print(
        f"\nbcsr({BLOCK},{BLOCK}) SpMM {args.n}^3 float32, {args.zero:.0%} zero blocks, "
        f"{args.threads} thread(s), {kind}, median of {args.repeat}\n"
    )
    print("| before the call | call | excess over the call again | the run before (wall) |")
    print("|---|---|---|---|")
    for k in before:
        m = float(np.median(took[k]))
        print(
            f"| {k} | {m * 1e3:.3f} ms ({flops / m / 1e9:.0f} GFLOP/s) | "
            f"{(m - warm) * 1e3:+.3f} ms | {np.median(own[k]) * 1e3:.2f} ms |"
        )
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    return 0


def busy(seconds: float) -> None:
    """Wait ``seconds`` on the CPU."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Panels:
    """glibc's chunk of ``nbytes`` (the kernel's panels' allocation): the call frees its
    panels on return, and glibc hands the same chunk back to the next request of that
    size, so writing it here warms the lines (and pages) the next call's panels use."""

    def __init__(self, nbytes: int):
        self.libc = ctypes.CDLL(None)
        self.libc.malloc.restype = ctypes.c_void_p
        self.libc.malloc.argtypes = [ctypes.c_size_t]
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        self.nbytes = nbytes

    def write(self) -> None:
        p = self.libc.malloc(self.nbytes)
        self.libc.memset(p, 0, self.nbytes)
        self.libc.free(p)


if __name__ == "__main__":
    with fresh_kernel_cache("ucf-cold-call-"):
        sys.exit(main())
