"""Fixed-width SpMM over a grid of widths: N:M (2:4) and ELL(16) operands, 2000 x 512,
float32 and float64, times B of N columns, N from 8 to 256 (issue 38: the columns after
the last whole tile of the row groups, ``ucf.passes.row_groups``). Each kernel is the
default's, checked against numpy; the time is the least of ``--repeat`` runs of
process CPU time per call (one thread: the steadier measure on a shared machine).

    python bench/fixed_width_grid.py --threads 1 --json new.json
    PYTHONPATH=/path/to/old/tree python bench/fixed_width_grid.py --json old.json
    python bench/fixed_width_grid.py --compare new.json old.json   # NOT met where slower

The comparison prints each case's ratio (new over old) and, last, the target: no case
slower than 1.05x (met / NOT met).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import ucf

WIDTHS = (8, 16, 20, 24, 32, 40, 47, 48, 56, 63, 64, 72, 96, 100, 128, 136, 192, 255, 256)
CASES = ("nm:float32", "nm:float64", "ell:float32", "ell:float64")
ROWS, DEPTH = 2000, 512
SLOWER = 1.05


def operand(rng, fmt: str, dtype: str) -> np.ndarray:
    """2:4 (two of every four columns) or 16 entries a row, at random."""
    if fmt == "nm":
        places = np.argsort(rng.random((ROWS, DEPTH // 4, 4)), axis=2)[:, :, :2]
        a = np.zeros((ROWS, DEPTH // 4, 4))
        np.put_along_axis(a, places, rng.random(places.shape) + 0.5, axis=2)
        return a.reshape(ROWS, DEPTH).astype(dtype)
    a = np.zeros((ROWS, DEPTH))
    for r in range(ROWS):
        a[r, rng.choice(DEPTH, 16, replace=False)] = rng.random(16) + 0.5
    return a.astype(dtype)


def run(widths, repeat: int) -> dict[str, float]:
    """Milliseconds per call, by ``format:dtype:N``."""
    rng = np.random.default_rng(65)
    out = {}
    for case in CASES:
        fmt, dtype = case.split(":")
        a = operand(rng, fmt, dtype)
        spelled = "nm(2,4)" if fmt == "nm" else "ell(16)"
        at = ucf.from_numpy(a, format=spelled)
        k = ucf.compile("C(i,j) = A(i,k) * B(k,j)", formats={"A": spelled}, dtype=dtype)
        for n in widths:
            b = rng.random((DEPTH, n)).astype(dtype)
            want = a.astype(np.float64) @ b.astype(np.float64)
            tol = 1e-4 if dtype == "float32" else 1e-10
            got = k(A=at, B=b).to_numpy()
            assert np.allclose(got, want, rtol=tol, atol=tol * abs(want).max()), (case, n)
            t0 = time.process_time()
            k(A=at, B=b)
            calls = max(1, int(0.02 / max(time.process_time() - t0, 1e-6)))
            best = float("inf")
            for _ in range(repeat):
                t0 = time.process_time()
                for _ in range(calls):
                    k(A=at, B=b)
                best = min(best, (time.process_time() - t0) / calls)
            out[f"{case}:{n}"] = round(best * 1e3, 4)
            print(f"{case}:{n:<4} {best * 1e3:8.3f} ms", flush=True)
    return out


def compare(new: dict[str, float], old: dict[str, float]) -> None:
    worst = 0.0
    print(f"{'case':22} {'new ms':>9} {'old ms':>9} {'new/old':>8}")
    for key in new:
        if key in old:
            r = new[key] / old[key]
            worst = max(worst, r)
            flag = "  slower" if r > SLOWER else ""
            print(f"{key:22} {new[key]:9.3f} {old[key]:9.3f} {r:8.2f}{flag}")
    result = "met" if worst <= SLOWER else "NOT met"
    print(f"\ntarget: no case slower than {SLOWER}x: worst {worst:.2f}x, {result}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    ap.add_argument("--json", help="write the times here")
    ap.add_argument("--compare", nargs=2, metavar=("NEW", "OLD"), help="two --json files")
    args = ap.parse_args()
    if args.compare:
        new, old = (json.loads(Path(p).read_text()) for p in args.compare)
        compare(new, old)
        return
    ucf.set_num_threads(args.threads)
    times = run(args.widths, args.repeat)
    if args.json:
        Path(args.json).write_text(json.dumps(times, indent=1))


if __name__ == "__main__":
    main()
