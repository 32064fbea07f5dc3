"""Issue 34's cliffs: statements a user writes with no schedule, against scipy, one thread.

Run from the repository root:

    python bench/cliffs.py                        # 20,000 x 20,000 CSR, 10 nonzeros a row
    python bench/cliffs.py --rows 2000 --repeats 5   # a smoke test: seconds
    python bench/cliffs.py total "2*A"            # only the rows whose names contain these

Every row is the default kernel (``ucf.compile`` with no schedule) on scipy operands as
a user passes them, checked against scipy before it is timed; then ucf and scipy are
called in turns, round after round, and the medians of the process's CPU time per call
compared (one thread: ``ucf.set_num_threads(1)``; scipy has no other). The ``k.cin``
line that says what the default chose is printed under each row. Target (issue 34,
the lead's sweep): each row within 1.5x of scipy.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import scipy.sparse as sp

import ucf

TARGET = 1.5  # t_ucf / t_scipy


def cases(n: int) -> list[tuple]:
    """(name, statement, formats, operands, scipy's answer as a callable, the k.cin words
    that say what the default chose)."""
    rng = np.random.default_rng(0)
    a = sp.random(n, n, density=10 / n, format="csr", random_state=1)
    b = sp.random(n, n, density=10 / n, format="csr", random_state=2)
    m = sp.random(n, n, density=10 / n, format="csr", random_state=4)
    x = rng.random(n)
    xt = np.ascontiguousarray(rng.random((16, n)))
    xsp = sp.random(n, 1, density=0.01, format="csc", random_state=5)
    xv = ucf.from_numpy(xsp.toarray().ravel(), format="C")
    csr = {"A": "csr"}
    out = {"A": "csr", "C": "csr"}
    return [
        ("total", "s = A(i,j)", csr, dict(A=a), lambda: a.sum(), "flat pass"),
        ("2*A", "C(i,j) = 2*A(i,j)", out, dict(A=a), lambda: 2 * a, "flat pass"),
        ("A.*A", "C(i,j) = A(i,j)*A(i,j)", out, dict(A=a), lambda: a.multiply(a), "flat pass"),
        (
            "SpMV sparse x",
            "y(i) = A(i,j)*x(j)",
            {"A": "csr", "x": "C"},
            dict(A=a, x=xv),
            lambda: (a @ xsp).toarray().ravel(),
            "sparse vector x",
        ),
        (
            "A@x + A.T@x",
            "y(i) = A(i,j)*x(j) + A(j,i)*x(j)",
            csr,
            dict(A=a, x=x),
            lambda: a @ x + a.T @ x,
            "scattering",
        ),
        (
            "SpMM X^T given",
            "Y(i,k) = A(i,j)*X(k,j)",
            csr,
            dict(A=a, X=xt),
            lambda: a @ xt.T,
            "loop order",
        ),
        (
            "A*B+M elementwise",
            "C(i,j) = A(i,j)*B(i,j)+M(i,j)",
            {"A": "csr", "B": "csr", "M": "csr", "C": "csr"},
            dict(A=a, B=b, M=m),
            lambda: a.multiply(b) + m,
            "intersected",
        ),
    ]


def as_reference(r):
    """A result as scipy or numpy holds it: sparse matrices stay sparse (a dense copy of
    a 20,000 x 20,000 result is 3.2 GB)."""
    if isinstance(r, ucf.Tensor):
        r = r.to_scipy() if r.order == 2 else r.to_numpy()
    return sp.csr_matrix(r) if sp.issparse(r) else np.asarray(r, dtype=float).reshape(-1)


def difference(got, want) -> float | None:
    """The largest difference between two results, or None where they agree (as
    ``np.allclose`` with rtol 1e-9, atol 1e-12, entry by entry)."""
    got, want = as_reference(got), as_reference(want)
    if sp.issparse(got) != sp.issparse(want):
        got, want = (g.toarray().ravel() if sp.issparse(g) else g for g in (got, want))
    if sp.issparse(got):
        diff = abs(got - want)
        excess = diff - 1e-9 * abs(want)
        return None if excess.max() <= 1e-12 else float(diff.max())
    if np.allclose(got, want, rtol=1e-9, atol=1e-12):
        return None
    return float(np.abs(got - want).max())


def cpu_medians(calls: dict, repeats: int) -> dict[str, float]:
    """Median CPU seconds per call of each entry, called in turns (the order rotates)."""
    samples: dict[str, list[float]] = {k: [] for k in calls}
    names = list(calls)
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.process_time()
            calls[k]()
            samples[k].append(time.process_time() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="only rows whose names contain one of these")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args()
    warnings.simplefilter("ignore", ucf.ConversionWarning)
    ucf.set_num_threads(1)
    met_all = True
    print(f"{args.rows} x {args.rows}, 10 nonzeros a row, 1 thread, CPU-time medians")
    for name, stmt, formats, ops, ref, word in cases(args.rows):
        if args.names and not any(s in name for s in args.names):
            continue
        k = ucf.compile(stmt, formats=formats)
        wrong = difference(k(**ops), ref())
        if wrong is not None:
            print(f"{name:18s} WRONG: differs from scipy by {wrong:.3g}")
            met_all = False
            continue
        t = cpu_medians({"ucf": lambda k=k, ops=ops: k(**ops), "scipy": ref}, args.repeats)
        ratio = t["ucf"] / t["scipy"]
        met = ratio <= TARGET
        met_all &= met
        print(
            f"{name:18s} ucf {t['ucf'] * 1e3:8.3f} ms  scipy {t['scipy'] * 1e3:8.3f} ms  "
            f"ratio {ratio:5.2f}  target <= {TARGET}x  {'met' if met else 'NOT met'}"
        )
        chosen = [line.strip() for line in k.cin.splitlines() if word in line]
        print(f"{'':18s} {chosen[0] if chosen else '(no ' + repr(word) + ' line in k.cin)'}")
    return 0 if met_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
