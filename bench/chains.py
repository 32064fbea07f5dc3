"""Chains of products, ``y = A@B@x`` (and ``s = x'@A@B@z``, ``A@B@C@x``), against scipy's
``A @ (B @ x)``: the contraction order the default picks.

Run from the repository root:

    python bench/chains.py                        # 20,000 rows, 10 nonzeros a row
    python bench/chains.py --rows 2000 --repeats 3   # a smoke test: seconds

Every matrix is CSR with ``--per-row`` nonzeros a row in random columns; x and z are
dense. Each kernel is checked against scipy before it is timed; then all are timed
in turns, round after round, on one thread, and the medians compared:

- scipy: ``A @ (B @ x)`` (the order a user who knows it writes; one thread); the
  scalar's last dot product is numpy's ``(x * v).sum()``, since ``x @ v`` goes to a
  BLAS whose threads took 20 ms for it on a busy machine;
- ucf default: ``ucf.compile(stmt, formats)`` with no schedule (the model's plan,
  whose ``k.cin`` line is printed);
- ucf plain: the plain nest (``reorder`` to the statement's own loop order, which
  forms no workspace): every path ``(i, j, k)`` of the chain, the cliff of issue 34.

``Y = A@B@X`` (X dense, 8 columns) is printed for information: the default leaves it
alone (``B@X`` would need a two-dimensional workspace).

Target (issue 34): the default's ``y = A@B@x`` within 1.5x of scipy on 1 thread.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

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
    # left alone: B(j,k)*X(k,l) has two free variables (no one-dimensional workspace)
    "Y = A@B@X (8 columns)": (
        "Y(i,l) = A(i,j)*B(j,k)*X(k,l)",
        "X",
        "i,j,k,l",
        lambda m, v: m[0] @ (m[1] @ v["X"]),
    ),
}
TARGET = ("y = A@B@x", 1.5)  # t_default / t_scipy at 1 thread


def run(n: int, per_row: int, repeats: int) -> dict[str, float]:
    """Each chain's default/scipy ratio at ``n`` rows."""
    mats = [matrix(n, per_row, seed) for seed in range(3)]
    rng = np.random.default_rng(7)
    vecs = {name: rng.random(n) for name in "xz"} | {"X": rng.random((n, 8))}
    ratios = {}
    ucf.set_num_threads(1)
    for label, (stmt, dense, order, reference) in CHAINS.items():
        used = [name for name in "ABC" if f"{name}(" in stmt]
        ops = {name: ucf.from_scipy(m) for name, m in zip(used, mats, strict=False)}
        ops |= {name: vecs[name] for name in dense}
        formats = dict.fromkeys(used, "csr")
        default = ucf.compile(stmt, formats=formats)
        plain = ucf.compile(stmt, formats=formats, schedule=f"reorder({order})")
        want = reference(mats, vecs)
        calls = {"scipy": lambda r=reference: r(mats, vecs)}
        for name, k in (("default", default), ("plain", plain)):
            got = np.asarray(k(**ops))
            if not np.allclose(got, want, rtol=1e-9):
                raise SystemExit(f"ucf {name} differs from scipy for {stmt} at n={n}")
            calls[name] = lambda k=k, ops=ops: k(**ops)
        chosen = [s.strip() for s in default.cin.splitlines() if "default: precompute" in s]
        print(f"{stmt}, {n} rows, {per_row} nonzeros a row (CSR), 1 thread:")
        print(f"  {chosen[0] if chosen else 'no workspace'}")
        times = timed(calls, dict.fromkeys(calls, 1), repeats)
        base = times["scipy"]
        print(f"  scipy: {base * 1e3:8.3f} ms")
        for name in ("default", "plain"):
            print(f"  ucf {name:8s} {times[name] * 1e3:8.3f} ms  {times[name] / base:5.2f}x scipy")
        ratios[label] = times["default"] / base
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--per-row", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15, help="rounds of timing")
    args = parser.parse_args()
    ratios = run(args.rows, args.per_row, args.repeats)
    label, limit = TARGET
    met = ratios[label] <= limit
    print("\ntarget (issue 34):")
    print(
        f"  n={args.rows}, 1 thread: {label} default/scipy {ratios[label]:5.2f}x  "
        f"(target <= {limit}x)  {'met' if met else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
