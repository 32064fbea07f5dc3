"""Helpers shared by the example scripts: options, numpy references, checking and timing.

The references are deliberately naive (``sliding_window_view`` + ``einsum``)
so that they are easy to trust; they are not meant to be fast.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import ucf  # noqa: E402

# Tolerance on max |got - ref| relative to max |ref| (float32 sums of a few hundred terms).
RTOL = 1e-4


def options(
    description: str,
    argv: Sequence[str] | None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The options every example takes (plus ``extra``'s); sets ucf's thread count."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="smaller sizes (CI smoke test)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--threads", type=int, default=2, help="threads for ucf (default 2)")
    p.add_argument(
        "--target", choices=("llvm", "c"), default="llvm", help="ucf code generator (default llvm)"
    )
    p.add_argument("--repeat", type=int, default=5, help="timed runs; the median is printed")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    ucf.set_num_threads(args.threads)
    return args


def sparsity_option(p: argparse.ArgumentParser, default: float = 0.9) -> None:
    p.add_argument(
        "--sparsity", type=float, default=default, help=f"fraction of zeros (default {default})"
    )


def pad_hw(x: np.ndarray, pad: int, axes: tuple[int, ...]) -> np.ndarray:
    widths = [(pad, pad) if a in axes else (0, 0) for a in range(x.ndim)]
    return np.pad(x, widths)


def conv_nchw(i: np.ndarray, f: np.ndarray, stride: int = 1, pad: int = 0) -> np.ndarray:
    """O[n,m,p,q] = sum_{c,r,s} I[n,c,stride*p+r-pad, stride*q+s-pad] * F[m,c,r,s]."""
    r, s = f.shape[2:]
    win = sliding_window_view(pad_hw(i, pad, (2, 3)), (r, s), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]
    return np.einsum("ncpqrs,mcrs->nmpq", win, f, optimize=True)


def conv_nhwc(i: np.ndarray, f: np.ndarray, pad: int = 0) -> np.ndarray:
    """O[n,p,q,m] = sum_{r,s,c} I[n,p+r-pad,q+s-pad,c] * F[r,s,c,m] (stride 1)."""
    r, s = f.shape[:2]
    win = sliding_window_view(pad_hw(i, pad, (1, 2)), (r, s), axis=(1, 2))
    return np.einsum("npqcrs,rscm->npqm", win, f, optimize=True)


def conv_nhwc_3d(i: np.ndarray, f: np.ndarray, pad: int = 0) -> np.ndarray:
    """O[n,x,y,z,m] = sum_{r,s,t,c} I[n,x+r-pad,y+s-pad,z+t-pad,c] * F[r,s,t,c,m]."""
    k = f.shape[:3]
    win = sliding_window_view(pad_hw(i, pad, (1, 2, 3)), k, axis=(1, 2, 3))
    return np.einsum("nxyzcrst,rstcm->nxyzm", win, f, optimize=True)


def prune(f: np.ndarray, sparsity: float) -> np.ndarray:
    """Magnitude pruning: zero the ``sparsity`` fraction of entries with the smallest |f|."""
    k = int(round(sparsity * f.size))
    out = f.copy()
    if k:
        flat = out.reshape(-1)
        flat[np.argsort(np.abs(flat), kind="stable")[:k]] = 0
    return out


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up (first call may convert or allocate)
    ts = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def dense(x: Any) -> np.ndarray:
    return x.to_numpy() if isinstance(x, ucf.Tensor) else np.asarray(x)


def report(name: str, got: Any, ref: np.ndarray, seconds: float | None = None) -> int:
    """Print the max error (and time); return the exit status: 0 if within RTOL, else 1."""
    g = dense(got)
    if g.shape != ref.shape:
        print(f"{name}: FAIL shape {g.shape} != reference {ref.shape}")
        return 1
    err = float(np.max(np.abs(g - ref))) if ref.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    ok = err <= RTOL * (scale or 1.0)
    t = "" if seconds is None else f", {seconds * 1e3:.3f} ms"
    print(f"{name}: max abs error {err:.2e} (max |ref| {scale:.2e}){t}: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1
