"""Products with a transposed operand (``A.T@B``, ``A@B.T``, ``A.T@B.T``, all CSR) and a
sum of two SpMVs, ucf's default against scipy, one thread.

Run from the repository root:

    python bench/transposed.py                      # 4000 rows (products), 20k (SpMVs)
    python bench/transposed.py --rows 1000 --repeats 3   # a smoke test: seconds

Each operand holds ``--per-row`` nonzeros in random columns of each row, and is a ucf
tensor converted once beforehand, as scipy's are its own CSR. Every kernel is checked
against scipy before it is timed; then all are timed in turns, round after round, and
the medians compared, on the calling thread's CPU time (one thread: neither starts
another, and other processes' time slices on a shared machine then do not count). ucf
converts a transposed operand on every call (a ``ConversionWarning`` says so), and
that is in its time. A dense output is compared
with scipy's sparse product, as a user would choose between them (scipy's
``.toarray()`` of it is printed beside); ``A.T@B.T`` is also computed into CSC, the
format scipy returns it in (``(B@A).T``: a CSR product, transposed for free; a CSR
result costs ucf a conversion of each operand, or of its much larger output); dense
outputs are left out above 4000 rows (3.2 GB each at 20,000). A dense output of 4000 x 4000
is 128 MB to write: zeroing it alone takes about 0.8x scipy's whole sparse product, so
the plain product ``C(i,k) = A(i,j)*B(j,k)`` into dense is printed beside them as their
floor (a reference, not a target). The masked statement
``C(i,k) = A(i,k)*A(i,j)*B(k,j)`` is scipy's ``A.multiply(A @ B.T)``; the SpMV sums are
``A@x + B@x``. The copies ``C(j,i) = A(i,j)`` into CSR and ``C(i,j) = A(i,j)`` into CSC
are scipy's ``A.T.tocsr()`` and ``A.tocsc()``: ucf's default returns the conversion of
``A`` it reads, relabelled (``ucf.cin.relabelled``).

Targets (issue 34): every product within 1.5x of scipy at one thread, the masked one,
the copies and ``A(i,j)*x(j) + B(i,j)*x(j)`` too.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sparse_add import matrix, timed  # noqa: E402  (run as a script, bench/ is on the path)

import ucf  # noqa: E402

TARGET = 1.5  # t_ucf / t_scipy at one thread
#: Dense outputs (and the reference's ``.toarray()``) are left out above this many
#: entries: 20,000 rows would take 3.2 GB each.
MAX_DENSE = 4000 * 4000

PRODUCTS = [
    ("C(i,k) = A(j,i)*B(j,k)", "A.T@B", lambda a, b: a.T @ b),
    ("C(i,k) = A(i,j)*B(k,j)", "A@B.T", lambda a, b: a @ b.T),
    ("C(i,k) = A(j,i)*B(k,j)", "A.T@B.T", lambda a, b: a.T @ b.T),
    ("C(i,k) = A(i,k)*A(i,j)*B(k,j)", "A.multiply(A@B.T)", lambda a, b: a.multiply(a @ b.T)),
]
SPMVS = "y(i) = A(i,j)*x(j) + B(i,j)*x(j)"
#: The product with no operand transposed, into a dense output: the dense rows' floor
PLAIN = "C(i,k) = A(i,j)*B(j,k)"
#: Copies into another layout: (statement, the output's format, scipy's spelling, call)
COPIES = [
    ("C(j,i) = A(i,j)", "csr", "A.T.tocsr()", lambda a: a.T.tocsr()),
    ("C(i,j) = A(i,j)", "csc", "A.tocsc()", lambda a: a.tocsc()),
]


def close(got, want) -> bool:
    """``got`` (a ucf result, sparse or dense) equals scipy's ``want`` to rounding."""
    got = got.to_scipy() if hasattr(got, "to_scipy") else np.asarray(got)
    return abs(got - want).max() <= 1e-9 * max(abs(want).max(), 1.0)


def products(n: int, per_row: int, repeats: int) -> list[tuple[str, float]]:
    a, b = matrix(n, per_row, 0), matrix(n, per_row, 1)
    ops = {"A": ucf.from_scipy(a), "B": ucf.from_scipy(b)}
    calls: dict = {}
    rows = []
    outs = ("csr", "dense") if n * n <= MAX_DENSE else ("csr",)
    for stmt, spelled, ref in PRODUCTS:
        want = ref(a, b)
        calls[spelled] = lambda ref=ref: ref(a, b)
        if "dense" in outs:
            calls[f"{spelled}.toarray()"] = lambda ref=ref: ref(a, b).toarray()
        # scipy's A.T@B.T is (B@A).T, a CSC result: ucf's into CSC beside its CSR
        for out in outs + (("csc",) if spelled == "A.T@B.T" else ()):
            k = ucf.compile(stmt, formats={"A": "csr", "B": "csr", "C": out})
            got = k(**ops)  # compiles the model's plan for these operands
            if not close(got, want):
                raise SystemExit(f"ucf {stmt} (C {out}) differs from scipy at n={n}")
            name = f"{stmt}, C {out}"
            calls[name] = lambda k=k: k(**ops)
            rows.append((name, spelled))
            chosen = [ln.strip() for ln in k.cin.splitlines() if "loop order" in ln]
            print(f"  {name}: {chosen[0]}")
    if "dense" in outs:  # the floor of the dense rows: no operand transposed
        plain = ucf.compile(PLAIN, formats={"A": "csr", "B": "csr", "C": "dense"})
        if not close(plain(**ops), a @ b):
            raise SystemExit(f"ucf {PLAIN} (C dense) differs from scipy at n={n}")
        calls[PLAIN] = lambda: plain(**ops)
        calls["A@B"] = lambda: a @ b
    times = timed(calls, time.thread_time, repeats)
    if PLAIN in times:
        print(
            f"  reference (no target): {PLAIN}, C dense {times[PLAIN] * 1e3:.2f} ms, scipy A@B "
            f"{times['A@B'] * 1e3:.2f} ms: {times[PLAIN] / times['A@B']:.2f}x"
        )
    out = []
    for name, spelled in rows:
        ratio = times[name] / times[spelled]
        dense_ref = times.get(spelled + ".toarray()")
        shown = f" ({dense_ref * 1e3:.2f} ms with .toarray())" if dense_ref else ""
        print(
            f"  {name:42s} {times[name] * 1e3:8.2f} ms   scipy {spelled} "
            f"{times[spelled] * 1e3:7.2f} ms{shown}  {ratio:5.2f}x"
        )
        out.append((f"n={n} {name}", ratio))
    return out


def copies(n: int, per_row: int, repeats: int) -> list[tuple[str, float]]:
    a = matrix(n, per_row, 0)
    ops = {"A": ucf.from_scipy(a)}
    calls: dict = {}
    for stmt, out, spelled, ref in COPIES:
        k = ucf.compile(stmt, formats={"A": "csr", "C": out})
        if not close(k(**ops), ref(a)):
            raise SystemExit(f"ucf {stmt} (C {out}) differs from scipy at n={n}")
        chosen = [ln.strip() for ln in k.cin.splitlines() if "relabelled" in ln] or ["copies"]
        print(f"  {stmt}, C {out}: {chosen[0][:60]}")
        calls[stmt] = lambda k=k: k(**ops)
        calls[spelled] = lambda ref=ref: ref(a)
    times = timed(calls, time.thread_time, repeats)
    rows = []
    for stmt, out, spelled, _ in COPIES:
        ratio = times[stmt] / times[spelled]
        print(
            f"  {stmt + ', C ' + out:42s} {times[stmt] * 1e3:8.3f} ms   scipy {spelled} "
            f"{times[spelled] * 1e3:7.3f} ms  {ratio:5.2f}x"
        )
        rows.append((f"n={n} {stmt}, C {out}", ratio))
    return rows


def spmvs(n: int, per_row: int, repeats: int) -> list[tuple[str, float]]:
    a, b = matrix(n, per_row, 2), matrix(n, per_row, 3)
    x = np.random.default_rng(4).random(n)
    ops = {"A": ucf.from_scipy(a), "B": ucf.from_scipy(b), "x": x}
    k = ucf.compile(SPMVS, formats={"A": "csr", "B": "csr"})
    if not np.allclose(k(**ops), a @ x + b @ x):
        raise SystemExit(f"ucf {SPMVS} differs from scipy at n={n}")
    print(f"  {SPMVS}: {[ln.strip() for ln in k.cin.splitlines() if 'loop order' in ln][0]}")
    times = timed(
        {"ucf": lambda: k(**ops), "scipy": lambda: a @ x + b @ x},
        time.thread_time,
        repeats,
    )
    ratio = times["ucf"] / times["scipy"]
    print(
        f"  {SPMVS:42s} {times['ucf'] * 1e3:8.3f} ms   scipy A@x + B@x "
        f"{times['scipy'] * 1e3:7.3f} ms  {ratio:5.2f}x"
    )
    return [(f"n={n} {SPMVS}", ratio)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4000, help="rows of the products")
    parser.add_argument("--spmv-rows", type=int, default=20000, help="rows of the SpMVs")
    parser.add_argument("--per-row", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=9, help="rounds of timing")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ucf.ConversionWarning)
    ucf.set_num_threads(1)
    print(f"products, {args.rows} rows, {args.per_row} nonzeros a row (CSR), one thread:")
    rows = products(args.rows, args.per_row, args.repeats)
    print(f"copies, {args.rows} rows:")
    rows += copies(args.rows, args.per_row, args.repeats * 5)
    print(f"SpMV sums, {args.spmv_rows} rows:")
    rows += spmvs(args.spmv_rows, args.per_row, args.repeats * 5)
    print("\ntargets (issue 34):")
    for label, ratio in rows:
        met = "met" if ratio <= TARGET else "NOT met"
        print(f"  {label:52s} {ratio:5.2f}x scipy  (target <= {TARGET}x)  {met}")


if __name__ == "__main__":
    main()
