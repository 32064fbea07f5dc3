"""A sum of two sparse matrix products, ``C = A@B + D@E`` (all CSR), against scipy.

Run from the repository root:

    python bench/sum_of_products.py                  # 20k and 200k rows, 10 nonzeros a row
    python bench/sum_of_products.py --rows 2000 --repeats 3   # a smoke test: seconds

Each row of A, B, D and E holds ``--per-row`` nonzeros in random columns. Every
kernel is checked against scipy's ``a@b + d@e`` before it is timed, then all are
timed in turns, round after round, and the medians compared:

- scipy: ``a@b + d@e`` (one thread; scipy has no other);
- ucf default: ``ucf.compile(stmt, formats)`` with no schedule, at 1 and 2 threads
  (``ucf.set_num_threads``): the model's plan, whose ``k.cin`` line is printed;
- ucf one workspace: ``precompute(A*B + D*E, j, j, w)``, both products scattered into
  one row workspace in turn;
- ucf two workspaces: ``precompute(A*B, j, j, w); precompute(D*E, j, j, v)``, their
  lists merged when each row is appended.

The operands are ucf tensors converted once beforehand, as scipy's are its own CSR.
Targets (issue 34): the default within 1.5x of scipy on 1 thread, and faster than
scipy on 2 threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import scipy.sparse as sp

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sparse_add import matrix  # noqa: E402  (run as a script, bench/ is on the path)

import ucf  # noqa: E402

STATEMENT = "C(i,j) = A(i,k)*B(k,j) + D(i,l)*E(l,j)"
FORMATS = {name: "csr" for name in "ABCDE"}
ONE = "precompute(A(i,k)*B(k,j) + D(i,l)*E(l,j), j, j, w); parallelize(i, CPUThread, NoRaces)"
TWO = (
    "precompute(A(i,k)*B(k,j), j, j, w); precompute(D(i,l)*E(l,j), j, j, v); "
    "parallelize(i, CPUThread, NoRaces)"
)
ONE_THREAD_MAX = 1.5  # t_default / t_scipy at 1 thread
TWO_THREADS_MAX = 1.0  # t_default / t_scipy at 2 threads: faster than scipy


def timed(calls: dict, threads: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each entry, all timed in turns: each round calls every
    entry once, in an order that rotates, under its own thread count."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeats):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            ucf.set_num_threads(threads[name])
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


def close(got, want: sp.csr_matrix) -> bool:
    got = got.to_scipy() if hasattr(got, "to_scipy") else got
    return abs(got - want).max() <= 1e-9 * max(abs(want).max(), 1.0)


def run(n: int, per_row: int, repeats: int) -> list[tuple[str, float, float, bool]]:
    a, b, d, e = (matrix(n, per_row, seed) for seed in range(4))
    ops = {name: ucf.from_scipy(m) for name, m in zip("ABDE", (a, b, d, e), strict=True)}
    want = a @ b + d @ e
    default = ucf.compile(STATEMENT, formats=FORMATS)
    one = ucf.compile(STATEMENT, formats=FORMATS, schedule=ONE)
    two = ucf.compile(STATEMENT, formats=FORMATS, schedule=TWO)
    kernels = {"default": default, "one workspace": one, "two workspaces": two}
    calls: dict = {"scipy": lambda: a @ b + d @ e}
    threads = {"scipy": 1}
    for t in (1, 2):
        ucf.set_num_threads(t)
        for name, k in kernels.items():
            result = k(**ops)  # compiles the model's plan for these operands
            if not close(result, want):
                raise SystemExit(f"ucf {name} ({t} threads) differs from scipy at n={n}")
            calls[f"{name} {t}t"] = lambda k=k: k(**ops)
            threads[f"{name} {t}t"] = t
        chosen = [line for line in default.cin.splitlines() if "precompute" in line]
        print(f"  {t} thread(s): {chosen[-1].strip() if chosen else 'no workspace'}")
    times = timed(calls, threads, repeats)
    base = times["scipy"]
    print(f"  scipy a@b + d@e: {base * 1e3:9.1f} ms")
    for name, t in times.items():
        if name != "scipy":
            print(f"  ucf {name:17s} {t * 1e3:9.1f} ms  {t / base:5.2f}x scipy")
    return [
        (f"n={n}, 1 thread: default/scipy", times["default 1t"] / base, ONE_THREAD_MAX, True),
        (f"n={n}, 2 threads: default/scipy", times["default 2t"] / base, TWO_THREADS_MAX, False),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="20000,200000", help="comma-separated row counts")
    parser.add_argument("--per-row", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7, help="rounds of timing")
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.rows.split(",")):
        print(f"{STATEMENT}, {n} rows, {args.per_row} nonzeros a row (CSR):")
        rows += run(n, args.per_row, args.repeats)
    print("\ntargets (issue 34):")
    for label, ratio, limit, inclusive in rows:
        met = ratio <= limit if inclusive else ratio < limit
        bound = f"<= {limit}" if inclusive else f"< {limit}"
        print(f"  {label:36s} {ratio:5.2f}x  (target {bound}x)  {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
