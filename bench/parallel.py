"""Multi-threaded benchmark: ucf's parallel schedules against STREAM, scipy and torch.sparse.

Run from the repository root:

    python bench/parallel.py               # full sizes (about two minutes, ~3 GB RAM)
    python bench/parallel.py --quick       # small sizes, one timed run each (smoke test)
    python bench/parallel.py --threads 2 --repeat 9 --json /tmp/parallel.json

A parallel speedup only means something next to a bandwidth ceiling and a
threaded competitor measured on the same machine at the same moment, so the
STREAM triad, scipy and torch all run in this process, and the timed runs of
kernels that are compared with each other are interleaved.  Inputs and the
byte-counting helpers come from ``spmv_spmm.py`` so both scripts measure the
same matrices the same way.  A row whose schedule ucf cannot compile yet is
reported as unsupported rather than ending the run, so the script keeps
working while the scheduling language is being filled in.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import spmv_spmm as base  # noqa: E402

import ucf  # noqa: E402

SPMV = base.SPMV
SPMM = base.SPMM  # SpGEMM is the same statement with a sparse B and C
TRIAD = "a(i) = b(i) + 3.0 * c(i)"
TRIAD_RW = "a(i) += b(i) + 3.0 * c(i)"


def split_par(chunk: int) -> str:
    return f"split(i,i0,i1,{chunk}); parallelize(i0,CPUThread,NoRaces)"


TRIAD_SCHEDULE = split_par(65536)
SPMV_SCHEDULES = {f"split {c}, par i0": split_par(c) for c in (512, 2048, 8192)}
SPMM_SCHEDULES = {f"split {c}, par i0": split_par(c) for c in (16, 64, 256)}
SPMM_SCHEDULES["par i"] = "parallelize(i,CPUThread,NoRaces)"
SPGEMM_SCHEDULES = {
    "parallel": (
        "precompute w, par i",
        "precompute(A(i,j)*B(j,k), k, k, w); parallelize(i, CPUThread, NoRaces)",
    ),
    "serial": ("precompute w", "precompute(A(i,j)*B(j,k), k, k, w)"),
}

# Targets.
SPMV_MIN_PCT_TRIAD = 75.0
SPMM_MIN_VS_SCIPY = 3.0
SPMM_MIN_VS_TORCH = 1.5
SPGEMM_MIN_VS_SCIPY = 1.5

# np.allclose tolerances, relative to the largest reference magnitude for atol.
TOL = {"float64": (1e-9, 1e-12), "float32": (1e-4, 1e-5)}


class RowError(Exception):
    """A row that cannot be measured; ``kind`` is 'unsupported' (a UcfError) or 'error'."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------- helpers


def median_of(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, list[float]]:
    """Wall times of each callable: one untimed warm-up each, then ``repeat`` interleaved runs.

    Medians (taken by the caller) rather than minima: with every core busy a
    lucky run says little about what a user gets, and interleaving spreads
    the machine's slow phases over all contenders instead of one.
    """
    for f in fns.values():
        f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t0)
    return samples


def med(samples: list[float]) -> float:
    return statistics.median(samples)


def close(got: np.ndarray, ref: np.ndarray, dtype: str) -> bool:
    rtol, atol = TOL[dtype]
    scale = float(np.max(np.abs(ref))) if ref.size else 1.0
    return bool(np.allclose(got, ref, rtol=rtol, atol=atol * (scale or 1.0)))


def compile_or_raise(expr: str, formats: dict, schedule: str, dtype: str) -> ucf.Kernel:
    """Compile, turning ucf's refusal into a row-level 'unsupported' instead of an abort."""
    try:
        return ucf.compile(expr, formats=formats, schedule=schedule, dtype=dtype)
    except ucf.UcfError as e:
        raise RowError("unsupported", f"{type(e).__name__}: {e}") from None


def guarded(row: dict, fn: Callable[[], dict]) -> dict:
    """Run one row; a UcfError or a crash in ucf marks that row and the run goes on."""
    try:
        row.update(fn())
    except RowError as e:
        row.update(status=e.kind, message=str(e), verdict=e.kind)
    except ucf.UcfError as e:
        row.update(status="unsupported", message=f"{type(e).__name__}: {e}", verdict="unsupported")
    except Exception as e:  # a bug in ucf must not hide the other rows' numbers
        traceback.print_exc()
        row.update(status="error", message=f"{type(e).__name__}: {e}", verdict="error")
    return row


def openmp_runtimes() -> list[str]:
    """OpenMP libraries mapped into this process: two would mean two competing thread pools."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f}
    except OSError:
        return []
    return sorted(p for p in paths if any(k in Path(p).name for k in ("gomp", "iomp", "libomp")))


# --------------------------------------------------------------------------- benchmarks


def bench_triad(n: int, repeat: int) -> dict:
    """The bandwidth ceiling for SpMV, measured through the same ucf call path and threads.

    ``a = b + 3c`` is the STREAM triad as the task defines it; like every
    other row it returns a fresh output, so page faults on ``a`` are part of
    its time.  ``a += b + 3c`` into a reused array moves four arrays with no
    allocation or zeroing at all, which is the stricter ceiling; it is
    reported alongside.
    """
    k = compile_or_raise(TRIAD, {}, TRIAD_SCHEDULE, "float64")
    krw = compile_or_raise(TRIAD_RW, {}, TRIAD_SCHEDULE, "float64")
    rng = np.random.default_rng(1)
    b = rng.random(n)
    c = rng.random(n)
    out = np.zeros(n)
    ok = close(k(b=b, c=c).vals, b + 3.0 * c, "float64")
    krw(b=b, c=c, out=out)
    ok = ok and close(out, b + 3.0 * c, "float64")
    s = median_of({"triad": lambda: k(b=b, c=c), "rw": lambda: krw(b=b, c=c, out=out)}, repeat)
    t, trw = med(s["triad"]), med(s["rw"])
    return {
        "n": n,
        "array_mib": n * 8 / 2**20,
        "schedule": TRIAD_SCHEDULE,
        "seconds": t,
        "samples": s["triad"],
        "gbps": 3 * 8 * n / t / 1e9,
        "gbps_write_allocate": 4 * 8 * n / t / 1e9,
        "rw_statement": TRIAD_RW,
        "rw_seconds": trw,
        "rw_gbps": 4 * 8 * n / trw / 1e9,
        "check": ok,
        "pass": None if ok else False,
        "status": "ok",
    }


def bench_spmv(m: sp.csr_matrix, repeat: int, triad: dict) -> dict:
    a = ucf.from_scipy(m, format="csr")
    x = np.random.default_rng(2).uniform(-1.0, 1.0, m.shape[1])
    ref = m @ x
    kernels = {
        label: compile_or_raise(SPMV, {"A": "csr"}, s, "float64")
        for label, s in SPMV_SCHEDULES.items()
    }
    ok = all(close(k(A=a, x=x).vals, ref, "float64") for k in kernels.values())
    err = max(base._relerr(k(A=a, x=x).vals, ref) for k in kernels.values())
    tune = median_of({lb: (lambda k=k: k(A=a, x=x)) for lb, k in kernels.items()}, repeat)
    best = min(tune, key=lambda lb: med(tune[lb]))
    kb = kernels[best]
    s = median_of({"ucf": lambda: kb(A=a, x=x), "scipy": lambda: m @ x}, repeat)
    t, ts = med(s["ucf"]), med(s["scipy"])
    nbytes = base.spmv_bytes(m)
    gbps = nbytes / t / 1e9
    row = {
        "status": "ok",
        "shape": list(m.shape),
        "nnz": int(m.nnz),
        "schedule_label": best,
        "schedule": SPMV_SCHEDULES[best],
        "tuning_s": {lb: med(v) for lb, v in tune.items()},
        "ucf_s": t,
        "scipy_s": ts,
        "samples": s,
        "compulsory_bytes": nbytes,
        "ucf_gbps": gbps,
        "scipy_gbps": nbytes / ts / 1e9,
        "speedup_vs_scipy": ts / t,
        "check": ok,
        "max_rel_err": err,
        "target": f">= {SPMV_MIN_PCT_TRIAD:.0f}% of triad",
    }
    if triad.get("status") == "ok":
        row["pct_triad"] = 100 * gbps / triad["gbps"]
        row["pct_triad_rw"] = 100 * gbps / triad["rw_gbps"]
        row["pass"] = ok and row["pct_triad"] >= SPMV_MIN_PCT_TRIAD
    else:
        row["pass"] = None
    return row


def _torch_csr(torch: Any, m: sp.csr_matrix, index_dtype: type) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "beta" notice; invariants are ours to guarantee
        return torch.sparse_csr_tensor(
            torch.from_numpy(m.indptr.astype(index_dtype)),
            torch.from_numpy(m.indices.astype(index_dtype)),
            torch.from_numpy(m.data),
            size=m.shape,
            check_invariants=False,
        )


def bench_spmm(m: sp.csr_matrix, n: int, repeat: int, torch: Any) -> dict:
    """Both libraries get to pick their best variant first, so the head-to-head is fair.

    ucf tries several chunkings of the row loop and torch both index widths;
    the winners are then timed again, interleaved with scipy.
    """
    dtype = str(m.dtype)
    a = ucf.from_scipy(m, format="csr")
    b = np.random.default_rng(3).uniform(-1.0, 1.0, (m.shape[1], n)).astype(dtype)
    ref = m @ b
    kernels: dict[str, ucf.Kernel] = {}
    refused: dict[str, str] = {}
    for label, s in SPMM_SCHEDULES.items():
        try:
            kernels[label] = ucf.compile(SPMM, formats={"A": "csr"}, schedule=s, dtype=dtype)
        except ucf.UcfError as e:
            refused[label] = f"{type(e).__name__}: {e}"
    if not kernels:
        raise RowError("unsupported", next(iter(refused.values())))
    shape = (m.shape[0], n)
    ok = all(close(k(A=a, B=b).vals.reshape(shape), ref, dtype) for k in kernels.values())
    err = max(base._relerr(k(A=a, B=b).vals.reshape(shape), ref) for k in kernels.values())
    tune = median_of({lb: (lambda k=k: k(A=a, B=b)) for lb, k in kernels.items()}, repeat)
    best = min(tune, key=lambda lb: med(tune[lb]))
    kb = kernels[best]
    fns: dict[str, Callable[[], Any]] = {"ucf": lambda: kb(A=a, B=b), "scipy": lambda: m @ b}

    torch_row: dict[str, Any] = {}
    if torch is not None:
        tb = torch.from_numpy(b)
        widths = {"int32": np.int32, "int64": np.int64}
        variants = {w: _torch_csr(torch, m, t) for w, t in widths.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch_ok = all(close((ta @ tb).numpy(), ref, dtype) for ta in variants.values())
        ttune = median_of({w: (lambda ta=ta: ta @ tb) for w, ta in variants.items()}, repeat)
        tbest = min(ttune, key=lambda w: med(ttune[w]))
        ta_best = variants[tbest]
        fns["torch"] = lambda: ta_best @ tb
        torch_row = {
            "torch_index_dtype": tbest,
            "torch_tuning_s": {w: med(v) for w, v in ttune.items()},
            "torch_check": torch_ok,
        }

    s = median_of(fns, repeat)
    t, ts = med(s["ucf"]), med(s["scipy"])
    flops = 2 * m.nnz * n
    row = {
        "status": "ok",
        "shape": list(m.shape),
        "nnz": int(m.nnz),
        "N": n,
        "dtype": dtype,
        "schedule_label": best,
        "schedule": SPMM_SCHEDULES[best],
        "refused_schedules": refused,
        "tuning_s": {lb: med(v) for lb, v in tune.items()},
        "ucf_s": t,
        "scipy_s": ts,
        "samples": s,
        "ucf_gflops": flops / t / 1e9,
        "scipy_gflops": flops / ts / 1e9,
        "speedup_vs_scipy": ts / t,
        "check": ok,
        "max_rel_err": err,
        **torch_row,
    }
    passes = [ok, row["speedup_vs_scipy"] >= SPMM_MIN_VS_SCIPY]
    target = f">= {SPMM_MIN_VS_SCIPY:g}x scipy"
    if "torch" in s:
        row["torch_s"] = med(s["torch"])
        row["torch_gflops"] = flops / row["torch_s"] / 1e9
        row["speedup_vs_torch"] = row["torch_s"] / t
        passes.append(row["speedup_vs_torch"] >= SPMM_MIN_VS_TORCH)
        target += f", >= {SPMM_MIN_VS_TORCH:g}x torch"
    else:
        target += " (torch not importable: not checked)"
    row["target"] = target
    row["pass"] = all(passes)
    return row


def _sorted_rows(m: sp.csr_matrix) -> bool:
    probe = sp.csr_matrix((m.data, m.indices, m.indptr), shape=m.shape, copy=False)
    return bool(probe.has_sorted_indices)  # scipy scans the rows to answer this


def bench_spgemm(m: sp.csr_matrix, which: str, repeat: int) -> dict:
    """Gustavson's row-by-row product needs a dense workspace, hence the precompute schedule.

    scipy leaves each output row in workspace order; ucf's rows are sorted,
    so scipy followed by ``sort_indices`` is timed too, for a like-for-like
    figure (the target is against plain ``A @ A``).
    """
    label, schedule = SPGEMM_SCHEDULES[which]
    formats = {"A": "csr", "B": "csr", "C": "csr"}
    k = compile_or_raise(SPMM, formats, schedule, str(m.dtype))
    a = ucf.from_scipy(m, format="csr")
    ref = m @ m
    got = k(A=a, B=a).to_scipy()
    scale = float(np.max(np.abs(ref.data))) if ref.nnz else 1.0
    diff = abs(sp.csr_matrix(got) - sp.csr_matrix(ref))
    err = (float(diff.max()) if diff.nnz else 0.0) / (scale or 1.0)
    ok = got.shape == ref.shape and err <= TOL["float64"][0]

    def scipy_sorted() -> None:
        r = m @ m
        r.sort_indices()

    s = median_of(
        {"ucf": lambda: k(A=a, B=a), "scipy": lambda: m @ m, "scipy_sorted": scipy_sorted}, repeat
    )
    t, ts = med(s["ucf"]), med(s["scipy"])
    row = {
        "status": "ok",
        "shape": list(m.shape),
        "nnz": int(m.nnz),
        "out_nnz_ucf": int(got.nnz),
        "out_nnz_scipy": int(ref.nnz),
        "ucf_rows_sorted": _sorted_rows(got),
        "scipy_rows_sorted": _sorted_rows(ref),
        "schedule_label": label,
        "schedule": schedule,
        "ucf_s": t,
        "scipy_s": ts,
        "scipy_sorted_s": med(s["scipy_sorted"]),
        "samples": s,
        "speedup_vs_scipy": ts / t,
        "speedup_vs_scipy_sorted": med(s["scipy_sorted"]) / t,
        "check": ok,
        "max_rel_err": err,
    }
    if which == "parallel":
        row["target"] = f">= {SPGEMM_MIN_VS_SCIPY:g}x scipy"
        row["pass"] = ok and row["speedup_vs_scipy"] >= SPGEMM_MIN_VS_SCIPY
    else:
        row["pass"] = None if ok else False  # a reference point: only a wrong result fails
    return row


# --------------------------------------------------------------------------- report


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.2f}ms"


def _verdict(r: dict) -> str:
    if r.get("status", "ok") != "ok":
        return r["status"]
    p = r.get("pass")
    if p is None:
        return "-"
    if not r.get("check", True):
        return "FAIL (wrong result)"
    return "PASS" if p else "FAIL"


def _line(case: str, r: dict, metric: str, target: str, cols: dict) -> str:
    if r.get("status", "ok") != "ok":
        first = r["message"].splitlines()[0] if r.get("message") else ""
        return f"{case:<{cols['case']}} {r['status']}: {first}"
    return (
        f"{case:<{cols['case']}} {r.get('schedule_label', '-'):<{cols['sched']}} "
        f"{_ms(r.get('ucf_s')):>10} {_ms(r.get('scipy_s')):>10} {_ms(r.get('torch_s')):>10}  "
        f"{metric:<{cols['metric']}} {target:<{cols['target']}} {_verdict(r)}"
    )


def table(res: dict) -> str:
    cols = {"case": 32, "sched": 20, "metric": 34, "target": 26}
    head = (
        f"{'case':<{cols['case']}} {'ucf schedule':<{cols['sched']}} {'ucf':>10} "
        f"{'scipy':>10} {'torch':>10}  {'ucf vs reference':<{cols['metric']}} "
        f"{'target':<{cols['target']}} result"
    )
    lines = [head, "-" * len(head)]
    tri = res["triad"]
    threads = res["config"]["threads"]
    if tri.get("status") == "ok":
        tri_row = dict(tri, schedule_label="split 65536, par i0", ucf_s=tri["seconds"])
        metric = f"{tri['gbps']:.1f} GB/s (3 arrays)"
        lines.append(
            _line(f"triad a=b+3c {tri['array_mib']:.0f}MiB/array", tri_row, metric, "-", cols)
        )
    else:
        lines.append(_line("triad a=b+3c", tri, "", "", cols))

    r = res["spmv"]
    case = f"SpMV banded {r['rows'] / 1e6:g}M rows"
    if r.get("status") == "ok":
        metric = f"{r['ucf_gbps']:.1f} GB/s = {r.get('pct_triad', float('nan')):.0f}% of triad"
        lines.append(_line(case, r, metric, f">= {SPMV_MIN_PCT_TRIAD:.0f}% triad", cols))
    else:
        lines.append(_line(case, r, "", "", cols))

    for r in res["spmm"]:
        case = f"SpMM N={r['N']} {r['dtype']}"
        if r.get("status") == "ok":
            metric = f"{r['speedup_vs_scipy']:.2f}x scipy"
            if "speedup_vs_torch" in r:
                metric += f", {r['speedup_vs_torch']:.2f}x torch"
            target = f">= {SPMM_MIN_VS_SCIPY:g}x scipy" + (
                f", {SPMM_MIN_VS_TORCH:g}x torch" if "speedup_vs_torch" in r else ""
            )
            lines.append(_line(case, r, metric, target, cols))
        else:
            lines.append(_line(case, r, "", "", cols))

    for r in res["spgemm"]:
        case = f"SpGEMM {r['which']}"
        if r.get("status") == "ok":
            metric = (
                f"{r['speedup_vs_scipy']:.2f}x scipy ({r['speedup_vs_scipy_sorted']:.2f}x +sort)"
            )
            target = f">= {SPGEMM_MIN_VS_SCIPY:g}x scipy" if r["which"] == "parallel" else "-"
            lines.append(_line(case, r, metric, target, cols))
        else:
            lines.append(_line(case, r, "", "", cols))

    lines.append("-" * len(head))
    lines.append(
        f"ucf and torch use {threads} threads; scipy.sparse is single-threaded. Times are "
        f"medians of {res['config']['repeat']} interleaved runs after a warm-up; "
        "'Nx' = reference time / ucf time."
    )
    if tri.get("status") == "ok":
        lines.append(
            f"triad: ucf '{TRIAD}', {tri['gbps']:.1f} GB/s counting 3 arrays (STREAM's count, "
            f"no write-allocate, like the SpMV bytes; %triad uses it), "
            f"{tri['gbps_write_allocate']:.1f} GB/s counting write-allocate"
        )
        pct_rw = res["spmv"].get("pct_triad_rw")
        lines.append(
            f"       '{TRIAD_RW}' into a reused output (no allocation, 4 arrays really moved): "
            f"{tri['rw_gbps']:.1f} GB/s"
            + (f"; SpMV is {pct_rw:.0f}% of that" if pct_rw is not None else "")
        )
    r = res["spmv"]
    if r.get("status") == "ok":
        lines.append(
            f"SpMV: {r['nnz'] / 1e6:.1f}M nnz, {r['compulsory_bytes'] / 1e6:.0f} MB compulsory "
            f"(vals+crd+pos+x+y); scipy {r['scipy_gbps']:.1f} GB/s; chunk medians: "
            + ", ".join(f"{lb.split(',')[0]} {_ms(t)}" for lb, t in r["tuning_s"].items())
        )
    for r in res["spmm"]:
        if r.get("status") != "ok":
            continue
        extra = ""
        if "torch_index_dtype" in r:
            extra = f"; torch best with {r['torch_index_dtype']} indices " + ", ".join(
                f"({w} {_ms(t)})" for w, t in r["torch_tuning_s"].items()
            )
        lines.append(
            f"SpMM N={r['N']}: {r['nnz'] / 1e6:.1f}M nnz, ucf {r['ucf_gflops']:.1f} GFLOP/s; "
            "schedules: " + ", ".join(f"{lb} {_ms(t)}" for lb, t in r["tuning_s"].items()) + extra
        )
    for r in res["spgemm"]:
        if r.get("status") == "ok":
            lines.append(
                f"SpGEMM {r['which']}: out nnz ucf {r['out_nnz_ucf']} / scipy "
                f"{r['out_nnz_scipy']}; rows sorted: ucf {r['ucf_rows_sorted']}, scipy "
                f"{r['scipy_rows_sorted']}; scipy + sort_indices {_ms(r['scipy_sorted_s'])}"
            )
    errs = [
        x["max_rel_err"]
        for x in [res["spmv"], *res["spmm"], *res["spgemm"]]
        if x.get("status") == "ok"
    ]
    if errs:
        lines.append(f"max relative error vs reference: {max(errs):.1e}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, one timed run per case")
    p.add_argument("--threads", type=int, default=2, help="threads for ucf and torch")
    p.add_argument(
        "--repeat", type=int, default=None, help="timed runs per case (default 7; 1 with --quick)"
    )
    p.add_argument(
        "--json",
        default=str(HERE / "results" / "parallel.json"),
        help="where to write the results (default: %(default)s)",
    )
    args = p.parse_args(argv)
    repeat = max(1, args.repeat if args.repeat is not None else (1 if args.quick else 7))
    if args.quick:
        sizes = {"triad": 1 << 22, "banded": 200_000, "spmm": 20_000, "spgemm": 10_000}
    else:
        sizes = {"triad": 1 << 25, "banded": 2_000_000, "spmm": 200_000, "spgemm": 100_000}

    ucf.set_num_threads(args.threads)  # loads libgomp before torch, so both share one pool
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)

    saved_cache = os.environ.get("UCF_CACHE_DIR")
    run_dir = tempfile.mkdtemp(prefix="ucf-bench-par-")
    os.environ["UCF_CACHE_DIR"] = run_dir
    res: dict = {
        "config": {
            "quick": args.quick,
            "threads": args.threads,
            "repeat": repeat,
            "sizes": sizes,
            "timing": "median of repeat interleaved runs after one warm-up, time.perf_counter",
            "ucf": ucf.__version__,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "torch": None if torch is None else torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        }
    }
    t_start = time.perf_counter()
    try:
        rng = np.random.default_rng(12345)
        print(f"STREAM triad ({sizes['triad']} doubles) ...", file=sys.stderr)
        res["triad"] = guarded({}, lambda: bench_triad(sizes["triad"], repeat))

        m = base.banded(sizes["banded"], 15, rng)
        print(f"SpMV banded {m.shape[0]} rows, {m.nnz} nnz ...", file=sys.stderr)
        res["spmv"] = guarded({"rows": m.shape[0]}, lambda m=m: bench_spmv(m, repeat, res["triad"]))
        del m

        m = base.uniform(sizes["spmm"], 16, rng).astype(np.float32)
        res["spmm"] = []
        for n in (32, 128):
            print(f"SpMM N={n} ({m.shape[0]} rows, {m.nnz} nnz) ...", file=sys.stderr)
            res["spmm"].append(
                guarded(
                    {"N": n, "dtype": "float32"}, lambda m=m, n=n: bench_spmm(m, n, repeat, torch)
                )
            )
        del m

        m = base.uniform(sizes["spgemm"], 10, rng)
        res["spgemm"] = []
        for which in SPGEMM_SCHEDULES:
            print(f"SpGEMM {which} ({m.shape[0]} rows, {m.nnz} nnz) ...", file=sys.stderr)
            res["spgemm"].append(
                guarded({"which": which}, lambda m=m, w=which: bench_spgemm(m, w, repeat))
            )
        del m
        res["config"]["openmp_runtimes"] = openmp_runtimes()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        if saved_cache is None:
            os.environ.pop("UCF_CACHE_DIR", None)
        else:
            os.environ["UCF_CACHE_DIR"] = saved_cache
    res["config"]["wall_s"] = time.perf_counter() - t_start

    rows = [res["spmv"], *res["spmm"], *res["spgemm"]]
    verdicts = [_verdict(r) for r in rows if r.get("status") != "ok" or r.get("pass") is not None]
    counts = {v: sum(x.split()[0] == v for x in verdicts) for v in ("PASS", "FAIL")}
    counts["unsupported"] = verdicts.count("unsupported")
    counts["error"] = verdicts.count("error")
    res["summary"] = counts
    res["all_pass"] = counts["PASS"] == len(verdicts)

    print(table(res))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    print(f"\ntargets: {summary}; {res['config']['wall_s']:.0f} s; results written to {out}")
    if len(res["config"].get("openmp_runtimes", [])) > 1:
        print("warning: more than one OpenMP runtime is loaded", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
