"""SpMV / SpMM / compile-time benchmark: ucf (llvm target, serial) against scipy.sparse.

Run from the repository root:

    python bench/spmv_spmm.py              # full sizes (a few minutes, ~3 GB RAM)
    python bench/spmv_spmm.py --quick      # small sizes, seconds
    python bench/spmv_spmm.py --repeat 10 --json /tmp/out.json

Every timing is the best of ``--repeat`` runs (``time.perf_counter``); ucf and
scipy runs are interleaved so slow phases of a noisy machine hit both.  The
whole run uses a fresh temporary ``UCF_CACHE_DIR`` so results never depend on
kernels left in the user's cache.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import scipy
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ucf  # noqa: E402
from ucf.exec.kernel import forget_loaded  # noqa: E402

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,k) = A(i,j) * B(j,k)"
WARMUP = "z(i) = W(i,j)"  # a different kernel, compiled first to warm the process

# Targets (ratio = ucf time / scipy time).
SPMV_MAX_RATIO = 1.1
SPMM128_MAX_RATIO = 0.5  # "at least 2x faster than scipy"
COMPILE_COLD_MAX = 0.300
COMPILE_CACHED_MAX = 0.020


# --------------------------------------------------------------------------- matrices


def _csr(n_rows: int, n_cols: int, rows: np.ndarray, cols: np.ndarray, rng) -> sp.csr_matrix:
    """Canonical CSR (rows sorted, columns sorted and unique within a row) from sorted pairs."""
    counts = np.bincount(rows, minlength=n_rows)
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    itype = np.int32 if max(len(cols), n_cols) < np.iinfo(np.int32).max else np.int64
    vals = rng.uniform(-1.0, 1.0, size=len(cols))
    m = sp.csr_matrix(
        (vals, cols.astype(itype), indptr.astype(itype)), shape=(n_rows, n_cols), copy=False
    )
    m.has_sorted_indices = True
    m.has_canonical_format = True
    return m


def banded(n: int, width: int, rng) -> sp.csr_matrix:
    """``width`` diagonals centred on the main one (rows near the edges are shorter)."""
    half = width // 2
    cols = np.arange(n, dtype=np.int64)[:, None] + np.arange(-half, width - half)[None, :]
    keep = (cols >= 0) & (cols < n)
    rows = np.broadcast_to(np.arange(n, dtype=np.int64)[:, None], cols.shape)[keep]
    return _csr(n, n, rows, cols[keep], rng)


def uniform(n: int, per_row: int, rng) -> sp.csr_matrix:
    """``per_row`` uniformly random columns per row (duplicates dropped, so slightly fewer)."""
    cols = np.sort(rng.integers(0, n, size=(n, per_row), dtype=np.int64), axis=1)
    keep = np.ones(cols.shape, dtype=bool)
    keep[:, 1:] = cols[:, 1:] != cols[:, :-1]
    rows = np.broadcast_to(np.arange(n, dtype=np.int64)[:, None], cols.shape)[keep]
    return _csr(n, n, rows, cols[keep], rng)


def rmat(scale: int, edge_factor: int, rng, probs=(0.57, 0.19, 0.19, 0.05)) -> sp.csr_matrix:
    """R-MAT (Graph500 parameters): 2**scale rows, power-law row and column degrees."""
    n = 1 << scale
    m = edge_factor * n
    a, b, c, _ = probs
    rows = np.zeros(m, dtype=np.int64)
    cols = np.zeros(m, dtype=np.int64)
    for bit in range(scale):
        u = rng.random(m, dtype=np.float32)
        down = u >= a + b  # quadrant c or d: row bit set
        right = ((u >= a) & (u < a + b)) | (u >= a + b + c)  # quadrant b or d: column bit set
        rows |= down.astype(np.int64) << bit
        cols |= right.astype(np.int64) << bit
    keys = np.sort(rows * n + cols)  # sort + mask: np.unique is far slower here
    keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    return _csr(n, n, keys // n, keys % n, rng)


# --------------------------------------------------------------------------- timing


def load_mkl() -> tuple[Any, str]:
    """sparse_dot_mkl on libgomp (MKL_THREADING_LAYER=GNU), the OpenMP runtime ucf loaded:
    one thread pool for both, where Intel's runtime beside it would spin its own threads
    on the same cores. The mkl wheel puts libmkl_rt in the environment's lib/, where
    sparse_dot_mkl does not look, hence MKL_RT."""
    os.environ.setdefault("MKL_THREADING_LAYER", "GNU")
    if "MKL_RT" not in os.environ:
        # a venv made with --system-site-packages has the wheel's libraries under its base
        found = sorted(
            f
            for d in dict.fromkeys((sys.prefix, sys.base_prefix))
            for f in Path(d, "lib").glob("libmkl_rt.so*")
        )
        if found:
            os.environ["MKL_RT"] = str(found[0])
    try:
        import sparse_dot_mkl
    except ImportError as e:
        return None, (
            f"MKL columns skipped: sparse_dot_mkl not importable ({e}); pip install -e '.[bench]'"
        )
    return sparse_dot_mkl, sparse_dot_mkl.get_version_string()


def timings(
    fns: dict[str, callable],
    repeat: int,
    clock: callable = time.perf_counter,
    paired: bool = False,
    around: dict[str, tuple[callable, callable]] | None = None,
) -> dict[str, list[float]]:
    """Times of each callable on ``clock`` (wall time unless given): one untimed warm-up
    each, then ``repeat`` interleaved runs.

    Interleaving spreads the machine's slow phases over all contenders
    instead of one. ``paired`` times each run right after an untimed call of the same
    callable, so each finds the allocator as its own last call left it rather than as
    the contender before it did. ``around`` gives, by name, two callables run right
    before and right after each run of that callable (its warm-up too), outside its
    time: a benchmark's own bookkeeping of the run (block_peak.py's team counters).
    """
    around = around or {}
    none = (_nothing, _nothing)
    for k, f in fns.items():
        first, then = around.get(k, none)
        first()
        f()
        then()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            if paired:
                f()
            first, then = around.get(k, none)
            first()
            t0 = clock()
            f()
            times[k].append(clock() - t0)
            then()
    return times


def _nothing() -> None:
    """What ``timings`` runs around a callable that ``around`` does not name."""


def best_of(fns: dict[str, callable], repeat: int) -> dict[str, float]:
    """Best wall time of each callable."""
    return {k: min(v) for k, v in timings(fns, repeat).items()}


def triad_bandwidth(n: int, repeat: int) -> dict:
    """STREAM triad a = b + s*c with numpy (two in-place ufunc passes, no temporaries).

    numpy cannot fuse the triad, so it moves 5 arrays' worth of bytes (pass 1
    reads c and writes a, pass 2 reads a, b and writes a); ``gbps`` counts
    those bytes and is the machine bandwidth reference.  ``stream_gbps`` uses
    STREAM's own 3-array count for the same time, for comparison.
    """
    rng = np.random.default_rng(1)
    a = np.empty(n)
    b = rng.random(n)
    c = rng.random(n)
    s = 3.0

    def triad() -> None:
        np.multiply(c, s, out=a)
        np.add(a, b, out=a)

    t = best_of({"triad": triad}, max(repeat, 5))["triad"]
    assert np.allclose(a[:1000], b[:1000] + s * c[:1000])
    return {
        "n": n,
        "array_mib": n * 8 / 2**20,
        "seconds": t,
        "gbps": 5 * 8 * n / t / 1e9,
        "stream_gbps": 3 * 8 * n / t / 1e9,
    }


def spmv_bytes(m: sp.csr_matrix) -> int:
    """Compulsory traffic: vals + column indices + row pointers + x once + y once."""
    vb = m.data.itemsize
    return (
        m.nnz * (vb + m.indices.itemsize)
        + (m.shape[0] + 1) * m.indptr.itemsize
        + m.shape[1] * vb
        + m.shape[0] * vb
    )


def _relerr(got: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(got - ref))) / scale


@contextlib.contextmanager
def fresh_kernel_cache(prefix: str) -> Iterator[str]:
    """A kernel cache for this run only: compile time stays out of the timings, but a
    kernel compiled by an older ucf is never timed."""
    saved = os.environ.get("UCF_CACHE_DIR")
    run_dir = tempfile.mkdtemp(prefix=prefix)
    os.environ["UCF_CACHE_DIR"] = run_dir
    try:
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        if saved is None:
            os.environ.pop("UCF_CACHE_DIR", None)
        else:
            os.environ["UCF_CACHE_DIR"] = saved


# --------------------------------------------------------------------------- benchmarks


def bench_compile(repeat: int) -> dict:
    """Text-to-callable SpMV compile time: cold disk cache (warm process) and cached."""
    warm_dir = tempfile.mkdtemp(prefix="ucf-bench-warm-")
    os.environ["UCF_CACHE_DIR"] = warm_dir
    t0 = time.perf_counter()
    ucf.compile(WARMUP, formats={"W": "csr"}, dtype="float64")
    process_cold = time.perf_counter() - t0

    cold: list[float] = []
    cached: list[float] = []
    dirs = [warm_dir]
    for _ in range(max(repeat, 3)):
        d = tempfile.mkdtemp(prefix="ucf-bench-cold-")
        dirs.append(d)
        os.environ["UCF_CACHE_DIR"] = d
        t0 = time.perf_counter()
        ucf.compile(SPMV, formats={"A": "csr"}, dtype="float64")
        cold.append(time.perf_counter() - t0)
        forget_loaded()  # measure the disk cache, not the in-process kernels
        t0 = time.perf_counter()
        ucf.compile(SPMV, formats={"A": "csr"}, dtype="float64")
        cached.append(time.perf_counter() - t0)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return {
        "warmup_kernel": WARMUP,
        "warmup_compile_s": process_cold,
        "cold_s": min(cold),
        "cold_median_s": statistics.median(cold),
        "cached_s": min(cached),
        "cached_median_s": statistics.median(cached),
        "cold_pass": min(cold) <= COMPILE_COLD_MAX,
        "cached_pass": min(cached) <= COMPILE_CACHED_MAX,
    }


def bench_spmv(name: str, m: sp.csr_matrix, repeat: int, triad_gbps: float) -> dict:
    kernel = ucf.compile(SPMV, formats={"A": "csr"}, dtype="float64")
    a = ucf.from_scipy(m, format="csr")
    assert np.shares_memory(a.vals, m.data), "from_scipy copied a canonical CSR matrix"
    x = np.random.default_rng(2).uniform(-1.0, 1.0, m.shape[1])
    err = _relerr(kernel(A=a, x=x).vals, m @ x)
    t = best_of({"ucf": lambda: kernel(A=a, x=x), "scipy": lambda: m @ x}, repeat)
    nbytes = spmv_bytes(m)
    ratio = t["ucf"] / t["scipy"]
    return {
        "matrix": name,
        "shape": list(m.shape),
        "nnz": int(m.nnz),
        "nnz_per_row": m.nnz / m.shape[0],
        "max_row_nnz": int(np.diff(m.indptr).max()),
        "ucf_s": t["ucf"],
        "scipy_s": t["scipy"],
        "ratio": ratio,
        "compulsory_bytes": nbytes,
        "ucf_gbps": nbytes / t["ucf"] / 1e9,
        "scipy_gbps": nbytes / t["scipy"] / 1e9,
        "ucf_pct_triad": 100 * nbytes / t["ucf"] / 1e9 / triad_gbps,
        "scipy_pct_triad": 100 * nbytes / t["scipy"] / 1e9 / triad_gbps,
        "max_rel_err": err,
        "target": f"ratio <= {SPMV_MAX_RATIO}",
        "pass": ratio <= SPMV_MAX_RATIO,
    }


def bench_spmm(m64: sp.csr_matrix, n: int, dtype: str, repeat: int) -> dict:
    m = m64.astype(dtype) if m64.dtype != np.dtype(dtype) else m64
    kernel = ucf.compile(SPMM, formats={"A": "csr"}, dtype=dtype)
    a = ucf.from_scipy(m, format="csr")
    b = np.random.default_rng(3).uniform(-1.0, 1.0, (m.shape[1], n)).astype(dtype)
    got = kernel(A=a, B=b).vals.reshape(m.shape[0], n)
    err = _relerr(got, m @ b)
    del got
    t = best_of({"ucf": lambda: kernel(A=a, B=b), "scipy": lambda: m @ b}, repeat)
    ratio = t["ucf"] / t["scipy"]
    flops = 2 * m.nnz * n
    row = {
        "shape": list(m.shape),
        "nnz": int(m.nnz),
        "N": n,
        "dtype": dtype,
        "ucf_s": t["ucf"],
        "scipy_s": t["scipy"],
        "ratio": ratio,
        "ucf_gflops": flops / t["ucf"] / 1e9,
        "scipy_gflops": flops / t["scipy"] / 1e9,
        "max_rel_err": err,
    }
    if n == 128:
        row["target"] = f"ratio <= {SPMM128_MAX_RATIO} (>= 2x faster)"
        row["pass"] = ratio <= SPMM128_MAX_RATIO
    return row


# --------------------------------------------------------------------------- report


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "FAIL")


def table(res: dict) -> str:
    tri = res["triad"]
    head = (
        f"{'case':<34} {'ucf':>10} {'scipy':>10} {'ucf/scipy':>9} "
        f"{'ucf GB/s':>9} {'%triad':>7} {'target':>17} {'result':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in res["spmv"]:
        case = f"SpMV {r['matrix']} nnz={r['nnz'] / 1e6:.1f}M"
        lines.append(
            f"{case:<34} {r['ucf_s'] * 1e3:>8.2f}ms {r['scipy_s'] * 1e3:>8.2f}ms "
            f"{r['ratio']:>9.2f} {r['ucf_gbps']:>9.2f} {r['ucf_pct_triad']:>6.0f}% "
            f"{'ratio<=' + str(SPMV_MAX_RATIO):>17} {_verdict(r['pass']):>6}"
        )
    for r in res["spmm"]:
        case = f"SpMM uniform N={r['N']} {r['dtype']}"
        target = f"ratio<={SPMM128_MAX_RATIO}" if "pass" in r else "-"
        lines.append(
            f"{case:<34} {r['ucf_s'] * 1e3:>8.1f}ms {r['scipy_s'] * 1e3:>8.1f}ms "
            f"{r['ratio']:>9.2f} {'-':>9} {'-':>7} {target:>17} {_verdict(r.get('pass')):>6}"
        )
    c = res["compile"]
    lines.append(
        f"{'compile SpMV, cold disk cache':<34} {c['cold_s'] * 1e3:>8.1f}ms {'-':>10} {'-':>9} "
        f"{'-':>9} {'-':>7} {'<=' + str(int(COMPILE_COLD_MAX * 1e3)) + 'ms':>17} "
        f"{_verdict(c['cold_pass']):>6}"
    )
    lines.append(
        f"{'compile SpMV, from disk cache':<34} {c['cached_s'] * 1e3:>8.2f}ms {'-':>10} {'-':>9} "
        f"{'-':>9} {'-':>7} {'<=' + str(int(COMPILE_CACHED_MAX * 1e3)) + 'ms':>17} "
        f"{_verdict(c['cached_pass']):>6}"
    )
    lines.append("-" * len(head))
    lines.append(
        f"STREAM triad (numpy, {tri['array_mib']:.0f} MiB/array): {tri['gbps']:.2f} GB/s "
        f"counting bytes moved ({tri['stream_gbps']:.2f} GB/s by STREAM's 3-array count); "
        f"%triad is against the former"
    )
    lines.append(
        "SpMV scipy GB/s: "
        + ", ".join(
            f"{r['matrix']} {r['scipy_gbps']:.2f} ({r['scipy_pct_triad']:.0f}%)"
            for r in res["spmv"]
        )
    )
    lines.append(
        f"compile medians: cold {c['cold_median_s'] * 1e3:.1f} ms, cached "
        f"{c['cached_median_s'] * 1e3:.2f} ms; first compile in the process "
        f"({c['warmup_kernel']}): {c['warmup_compile_s'] * 1e3:.1f} ms"
    )
    errs = [r["max_rel_err"] for r in res["spmv"] + res["spmm"]]
    lines.append(f"max relative error vs scipy: {max(errs):.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (seconds, for smoke tests)")
    p.add_argument(
        "--json",
        default=str(ROOT / "bench" / "results" / "spmv_spmm.json"),
        help="where to write the results (default: %(default)s)",
    )
    p.add_argument("--repeat", type=int, default=7, help="timed runs per case (best is kept)")
    args = p.parse_args(argv)
    repeat = max(1, args.repeat)
    # The comparison is with single-threaded scipy; the default schedule would
    # otherwise run the outermost loop on every core (bench/parallel.py does that).
    ucf.set_num_threads(1)

    if args.quick:
        sizes = {"banded": 200_000, "uniform": 20_000, "rmat_scale": 16, "triad": 1 << 23}
    else:
        sizes = {"banded": 2_000_000, "uniform": 200_000, "rmat_scale": 20, "triad": 1 << 25}

    # compile timing points UCF_CACHE_DIR at directories of its own, then back here.
    with fresh_kernel_cache("ucf-bench-") as run_dir:
        res: dict = {
            "config": {
                "quick": args.quick,
                "repeat": repeat,
                "sizes": sizes,
                "timing": "best of repeat, time.perf_counter, ucf/scipy interleaved",
                "ucf": ucf.__version__,
                "numpy": np.__version__,
                "scipy": scipy.__version__,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
            }
        }
        print("compile time ...", file=sys.stderr)
        res["compile"] = bench_compile(repeat)
        os.environ["UCF_CACHE_DIR"] = run_dir

        print("STREAM triad ...", file=sys.stderr)
        res["triad"] = triad_bandwidth(sizes["triad"], repeat)

        rng = np.random.default_rng(12345)
        res["spmv"] = []
        mats = [
            ("banded", lambda: banded(sizes["banded"], 15, rng)),
            ("uniform", lambda: uniform(sizes["uniform"], 10, rng)),
            ("rmat", lambda: rmat(sizes["rmat_scale"], 16, rng)),
        ]
        uni = None
        for name, make in mats:
            t0 = time.perf_counter()
            m = make()
            print(
                f"SpMV {name}: {m.shape[0]} rows, {m.nnz} nnz "
                f"(generated in {time.perf_counter() - t0:.1f} s) ...",
                file=sys.stderr,
            )
            res["spmv"].append(bench_spmv(name, m, repeat, res["triad"]["gbps"]))
            if name == "uniform":
                uni = m
            del m

        res["spmm"] = []
        for dtype in ("float32", "float64"):
            for n in (32, 128):
                print(f"SpMM N={n} {dtype} ...", file=sys.stderr)
                res["spmm"].append(bench_spmm(uni, n, dtype, repeat))

    checks = [r["pass"] for r in res["spmv"]]
    checks += [r["pass"] for r in res["spmm"] if "pass" in r]
    checks += [res["compile"]["cold_pass"], res["compile"]["cached_pass"]]
    res["all_pass"] = all(checks)
    text = table(res)
    print(text)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nall targets: {'PASS' if res['all_pass'] else 'FAIL'}; results written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
