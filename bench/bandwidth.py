"""This machine's memory bandwidth on 1 and 2 threads: the other half of the roofline
that bench/block_peak.py bounds the block products with (bench/fma_peak.py is the
arithmetic half).

    python bench/bandwidth.py                       # 1 and 2 threads, 4 MB and 256 MB
    python bench/bandwidth.py --threads 2 --mb 4 --repeat 41

Per array size and thread count, in GB/s of the array's bytes (the best of ``--repeat``
runs, the kinds interleaved: as for the FMA peak, only the machine's load slows a pass,
and a bound takes the best):

- read: torch's ``sum`` of a float32 array (vector loads, one pass);
- write, recycled: torch's ``fill_`` of an array written before (plain stores: a line
  not in the caches is read for ownership first, so memory carries it twice);
- write, fresh: the same into a new anonymous mapping each run (every 4 KB page
  faults, and the OS zeroes it, before the store lands): what a newly allocated
  output costs;
- memset: glibc's ``memset`` on the recycled array, split between the threads
  (``ctypes`` releases the GIL). Its large-size path writes past the caches without
  reading for ownership (``rep stosb`` on glibc 2.36, whose non-temporal threshold
  is 288 MB here; newer glibc uses non-temporal stores): what non-temporal stores of
  an output would move, against the plain stores above;
- copy: torch's ``copy_`` between two recycled arrays, counted as the bytes read
  plus the bytes written.

An array of a few MB (bcsr SpMM 1024^3's B and C are 4 MB each) sits in this CPU's
32 MB L3 once touched, so its rates are the L3's; 256 MB arrays measure DRAM. Which one
bounds a call depends on where its operands are when it starts: block_peak.py's ucf
call follows runs that touched B and C, so they are mostly in L3 there (unless other
processes evict them); an operand used once is in DRAM.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from spmv_spmm import timings  # noqa: E402

#: What each kind moves per byte of its array: copy reads one array and writes another.
MOVED = {"read": 1, "write, recycled": 1, "write, fresh": 1, "memset": 1, "copy": 2}


def runs(nbytes: int, threads: int, kinds=tuple(MOVED)) -> dict[str, object]:
    """A callable per kind of ``kinds`` (of :data:`MOVED`) over arrays of ``nbytes`` on
    ``threads`` threads (torch's intra-op threads, set here; a pool of Python threads
    for memset)."""
    import torch

    torch.set_num_threads(threads)
    n = nbytes // 4
    src = torch.rand(n, dtype=torch.float32)
    dst = torch.zeros(n, dtype=torch.float32)
    pool = ThreadPoolExecutor(threads)
    share = nbytes // threads
    base = dst.data_ptr()

    def fresh() -> None:
        with mmap.mmap(-1, nbytes) as m:
            t = torch.frombuffer(m, dtype=torch.float32)
            t.fill_(1.0)
            del t

    def memset() -> None:
        list(pool.map(lambda q: ctypes.memset(base + q * share, 0, share), range(threads)))

    every = {
        "read": lambda: float(src.sum()),
        "write, recycled": lambda: dst.fill_(1.0),
        "write, fresh": fresh,
        "memset": memset,
        "copy": lambda: dst.copy_(src),
    }
    return {k: every[k] for k in kinds}


def rates(nbytes: int, threads: int, repeat: int, kinds=tuple(MOVED)) -> dict[str, float]:
    """GB/s of each kind of ``kinds`` (its best run), interleaved."""
    got = timings(runs(nbytes, threads, kinds), repeat)
    return {k: MOVED[k] * nbytes / min(v) / 1e9 for k, v in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--mb", type=int, nargs="+", default=[4, 256], help="array sizes, MB")
    ap.add_argument("--repeat", type=int, default=21)
    args = ap.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.2f}\n")
    print("| array | threads | " + " | ".join(MOVED) + " |")
    print("|---|---|" + "---|" * len(MOVED))
    for mb in args.mb:
        for t in args.threads:
            repeat = args.repeat if mb <= 64 else max(5, args.repeat // 3)
            got = rates(mb << 20, t, repeat)
            print(f"| {mb} MB | {t} | " + " | ".join(f"{got[k]:.1f} GB/s" for k in MOVED) + " |")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.0f} s)")
    sys.exit(code)
