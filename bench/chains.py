"""Chains of products, ``y = A@B@x`` (and ``s = x'@A@B@z``, ``A@B@C@x``, ``Y = A@B@X``,
``Y = X@A@B``), against scipy: the contraction order the default picks.

Run from the repository root:

    python bench/chains.py                        # 20,000 rows, 10 nonzeros a row
    python bench/chains.py --rows 2000 --repeats 3   # a smoke test: seconds

Every matrix is CSR with ``--per-row`` nonzeros a row in random columns; x and z are
dense, X is dense with 1, 8 or 64 columns, or CSR with 8 columns half full. Each
kernel is checked against scipy before it is timed; then all are timed in turns,
round after round, on one thread, and the medians compared:

- scipy: ``A @ (B @ x)`` (the order a user who knows it writes; one thread), ``(X @
  A) @ B`` for X on the left; the scalar's last dot product is numpy's ``(x *
  v).sum()``, since ``x @ v`` goes to a BLAS whose threads took 20 ms for it on a
  busy machine;
- ucf default: ``ucf.compile(stmt, formats)`` with no schedule (the model's plan,
  whose ``k.cin`` line is printed);
- ucf plain: the plain nest (``reorder`` to the statement's own loop order, which
  forms no workspace): every path ``(i, j, k)`` of the chain, the cliff of issue 34.
  Before the two-dimensional workspace, ``A@B@X`` and ``X@A@B`` ran it by default.

``--threads 2`` runs ucf's kernels on two threads (scipy stays on one) and adds, for
``y = A@B@x`` and ``Y = A@B@X`` (8 columns), the producer on threads too: the
default's workspace with ``parallelize(i, ...)`` and ``parallelize(j, ...)``, which
the default does not take yet (on a busy machine it was slower); for information.

Targets (issue 34), each the default's time over scipy's on 1 thread: ``y = A@B@x``
within 1.5x; ``Y = A@B@X`` (8 dense columns, ``W(j,l) = B@X`` first) within 1.5x;
and on every row the default no slower than the plain nest (1.1x, for noise).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sparse_add import matrix  # noqa: E402  (run as a script, bench/ is on the path)
from sum_of_products import timed  # noqa: E402

import ucf  # noqa: E402

#: (statement, operands besides the matrices, the plain nest's loop order, scipy's call)
CHAINS = {
    "y = A@B@x": ("y(i) = A(i,j)*B(j,k)*x(k)", "x", "i,j,k", lambda m, v: m[0] @ (m[1] @ v["x"])),
    "s = x'@A@B@z": (
        "s = x(i)*A(i,j)*B(j,k)*z(k)",
        "xz",
        "i,j,k",
        lambda m, v: float((v["x"] * (m[0] @ (m[1] @ v["z"]))).sum()),
    ),
    "y = A@B@C@x": (
        "y(i) = A(i,j)*B(j,k)*C(k,l)*x(l)",
        "x",
        "i,j,k,l",
        lambda m, v: m[0] @ (m[1] @ (m[2] @ v["x"])),
    ),
    **{
        f"Y = A@B@X ({n} columns)": (
            "Y(i,l) = A(i,j)*B(j,k)*X(k,l)",
            f"X{n}",
            "i,j,k,l",
            lambda m, v, n=n: m[0] @ (m[1] @ v[f"X{n}"]),
        )
        for n in (1, 8, 64)
    },
    "Y = A@B@X (X CSR, 8 columns)": (
        "Y(i,l) = A(i,j)*B(j,k)*X(k,l)",
        "Xs",
        "i,j,k,l",
        lambda m, v: (m[0] @ (m[1] @ v["Xs"])).toarray(),
    ),
    "Y = X@A@B (8 rows)": (
        "Y(i,l) = X(i,k)*A(k,j)*B(j,l)",
        "Xt",
        "i,k,j,l",
        lambda m, v: np.asarray((v["Xt"] @ m[0]) @ m[1]),
    ),
}
#: The rows that also time the producer on threads (``--threads 2``): its workspace.
PRODUCERS = {
    "y = A@B@x": "precompute(B(j,k)*x(k), j, j, w)",
    "Y = A@B@X (8 columns)": "precompute(B(j,k)*X(k,l), {j,l}, {j,l}, w)",
}
#: (row, limit): t_default / t_scipy at 1 thread
TARGETS = (("y = A@B@x", 1.5), ("Y = A@B@X (8 columns)", 1.5))
#: The default against the plain nest on every row, noise allowed.
PLAIN_LIMIT = 1.1


def operands(n: int, per_row: int) -> tuple[list, dict]:
    """The chains' matrices and their other operands (the name an entry of CHAINS uses:
    ``X8`` is X with 8 dense columns, ``Xs`` a CSR X, ``Xt`` 8 dense rows)."""
    mats = [matrix(n, per_row, seed) for seed in range(3)]
    rng = np.random.default_rng(7)
    vecs = {name: rng.random(n) for name in "xz"}
    vecs |= {f"X{c}": rng.random((n, c)) for c in (1, 8, 64)}
    vecs["Xs"] = sp.random(n, 8, density=0.5, format="csr", random_state=rng)
    vecs["Xt"] = rng.random((8, n))
    return mats, vecs


def run(n: int, per_row: int, repeats: int, threads: int) -> dict[str, tuple[float, float]]:
    """Each chain's default/scipy and default/plain ratios at ``n`` rows, ucf on
    ``threads``."""
    mats, vecs = operands(n, per_row)
    ratios = {}
    ucf.set_num_threads(threads)
    for label, (stmt, dense, order, reference) in CHAINS.items():
        used = [name for name in "ABC" if f"{name}(" in stmt]
        ops = {name: ucf.from_scipy(m) for name, m in zip(used, mats, strict=False)}
        formats = dict.fromkeys(used, "csr")
        for name in dense if len(dense) == 1 or dense == "xz" else [dense]:
            value = vecs[name]
            tensor = name[0] if name.startswith("X") else name
            if sp.issparse(value):
                ops[tensor], formats[tensor] = ucf.from_scipy(value), "csr"
            else:
                ops[tensor] = value
        kernels = {
            "default": ucf.compile(stmt, formats=formats),
            "plain": ucf.compile(stmt, formats=formats, schedule=f"reorder({order})"),
        }
        if threads > 1 and label in PRODUCERS:
            both = "; ".join(f"parallelize({v}, CPUThread, NoRaces)" for v in "ij")
            schedule = f"{PRODUCERS[label]}; {both}"
            kernels["producer"] = ucf.compile(stmt, formats=formats, schedule=schedule)
        want = reference(mats, vecs)
        calls = {"scipy": lambda r=reference: r(mats, vecs)}
        for name, k in kernels.items():
            got = np.asarray(k(**ops))
            if not np.allclose(got, want, rtol=1e-9):
                raise SystemExit(f"ucf {name} differs from scipy for {stmt} at n={n}")
            calls[name] = lambda k=k, ops=ops: k(**ops)
        chosen = [
            s.strip()
            for s in kernels["default"].cin.splitlines()
            if "default: precompute" in s or "default: the plain nest" in s
        ]
        print(f"{label}: {stmt}, {n} rows, {per_row} nonzeros a row (CSR), {threads} thread(s):")
        print(f"  {chosen[-1] if chosen else 'no workspace'}")
        times = timed(calls, {name: 1 if name == "scipy" else threads for name in calls}, repeats)
        base = times["scipy"]
        print(f"  scipy: {base * 1e3:8.3f} ms (1 thread)")
        for name in kernels:
            print(f"  ucf {name:8s} {times[name] * 1e3:8.3f} ms  {times[name] / base:5.2f}x scipy")
        ratios[label] = (times["default"] / base, times["default"] / times["plain"])
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--per-row", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15, help="rounds of timing")
    parser.add_argument("--threads", type=int, default=1, help="ucf's threads (scipy: 1)")
    args = parser.parse_args()
    ratios = run(args.rows, args.per_row, args.repeats, args.threads)
    if args.threads != 1:
        print(f"\n(ucf on {args.threads} threads: the targets are for 1 thread)")
        return
    print("\ntargets (issue 34):")
    for label, limit in TARGETS:
        ratio = ratios[label][0]
        print(
            f"  n={args.rows}, 1 thread: {label} default/scipy {ratio:5.2f}x  "
            f"(target <= {limit}x)  {'met' if ratio <= limit else 'NOT met'}"
        )
    worst = max(ratios, key=lambda label: ratios[label][1])
    ratio = ratios[worst][1]
    print(
        f"  n={args.rows}, 1 thread: every row, default/plain nest at most {ratio:5.2f}x "
        f"({worst}) (target <= {PLAIN_LIMIT}x)  {'met' if ratio <= PLAIN_LIMIT else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
