"""What a kernel call costs in Python, over the compiled function it ends in.

Run from the repository root:

    python bench/overhead.py                # a few seconds
    python bench/overhead.py --profile      # and the top of a cProfile of the calls

The kernel ``y(i) = A(i,j) * x(j) + z(i) * w(i)`` has four operands (A in CSR,
the others dense numpy arrays) and tiny ones, so the machine code does next
to nothing.  The floor is the same compiled function called through ctypes
with its arguments already built: the difference is the binding overhead
(checking operands, finding extents, allocating the output, building the
argument list).  The target is 5 microseconds or less.  A call that repeats
with the same operands ends in a trampoline taking its arguments packed in one
array (``ucf.toolchain.trampoline``), cheaper than the ctypes floor; that call is timed
too, for reference.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import scipy.sparse as sp  # noqa: E402

import ucf  # noqa: E402
from ucf.toolchain.trampoline import Packed  # noqa: E402

STATEMENT = "y(i) = A(i,j) * x(j) + z(i) * w(i)"
TARGET_US = 5.0


def per_call(cases: dict[str, Callable[[], object]], number: int, repeat: int) -> dict[str, float]:
    """For each case, the best over ``repeat`` batches of the mean time of ``number``
    calls, in µs. The cases take turns batch by batch, so a busy spell of a shared
    machine slows them all alike, and the fastest batch is the one least disturbed."""
    best = dict.fromkeys(cases, float("inf"))
    for fn in cases.values():
        for _ in range(100):  # warm: a replayed call packs its arguments after a few
            fn()
    for _ in range(repeat):
        for label, fn in cases.items():
            t = time.perf_counter()
            for _ in range(number):
                fn()
            best[label] = min(best[label], (time.perf_counter() - t) / number * 1e6)
    return best


def raw_args(kernel: ucf.Kernel, n: int, A, x, z, w, y) -> tuple[object, list[int]]:
    """The compiled function and its argument list, built once, outside the timing."""
    fn = kernel.llir[-1]
    values = {"n_i": n, "n_j": n, "A_dim0": n, "A_dim1": n, "x_dim0": n, "z_dim0": n}
    values |= {"w_dim0": n, "y_dim0": n}
    arrays = {"A1_pos": A.levels[1]["pos"], "A1_crd": A.levels[1]["crd"], "A_vals": A.vals}
    arrays |= {"x_vals": x, "z_vals": z, "w_vals": w, "y_vals": y}
    args = [values[p.name] if p.name in values else arrays[p.name].ctypes.data for p in fn.params]
    return kernel._functions[fn.name], args


def packed_call(compiled, args: list[int]):
    """The same call through the trampoline a replayed call uses once it repeats
    (``ucf.toolchain.trampoline``): the arguments in one C array, no ctypes conversions."""
    signature = [t is ctypes.c_void_p for t in compiled.argtypes]
    packed = Packed(compiled, signature, args)
    return lambda: packed.call(packed.address, packed.args_at)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=5000, help="calls per batch")
    ap.add_argument("--repeat", type=int, default=7, help="batches per case")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    n = 4
    rng = np.random.default_rng(0)
    A = ucf.from_scipy(sp.random(n, n, density=0.5, format="csr", random_state=rng))
    x, z, w = rng.random(n), rng.random(n), rng.random(n)
    y = np.zeros(n)
    k = ucf.compile(STATEMENT, formats={"A": "csr"}, schedule="")
    np.testing.assert_allclose(k(A=A, x=x, z=z, w=w).to_numpy(), A.to_numpy() @ x + z * w)
    compiled, raw = raw_args(k, n, A, x, z, w, y)
    cases = {
        "raw ctypes call (floor)": lambda: compiled(*raw),
        "packed call (trampoline)": packed_call(compiled, raw),
        "k(A=, x=, z=, w=)": lambda: k(A=A, x=x, z=z, w=w),
        "k(..., out=y)": lambda: k(A=A, x=x, z=z, w=w, out=y),
    }
    times = per_call(cases, args.number, args.repeat)
    floor = times["raw ctypes call (floor)"]
    print(f"{STATEMENT}, A csr {n}x{n}; best of {args.repeat} batches of {args.number} calls")
    print(f"{'call':<26}{'µs/call':>10}{'overhead µs':>13}")
    for label, t in times.items():
        extra = f"{t - floor:>13.2f}" if label.startswith("k(") else f"{'':>13}"
        print(f"{label:<26}{t:>10.2f}{extra}")
    worst = max(t for label, t in times.items() if label.startswith("k(")) - floor
    print(f"target: overhead <= {TARGET_US} µs: {'met' if worst <= TARGET_US else 'not met'}")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(lambda: [cases["k(..., out=y)"]() for _ in range(args.number)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
