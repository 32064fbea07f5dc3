"""Multi-threaded benchmark: ucf's parallel schedules against STREAM, scipy and torch.sparse.

Run from the repository root:

    python bench/parallel.py               # full sizes (about a minute, ~3 GB RAM)
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
import statistics
import sys
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
# ucf's default schedule (None) is a candidate too: it may already parallelize the row loop.
SPMV_SCHEDULES = {f"split {c}": split_par(c) for c in (512, 2048, 8192)}
SPMV_SCHEDULES["default"] = None


def spmm_schedules(n: int) -> dict[str, str | None]:
    """Row chunkings, each also with the column loop bound to N: then N is a compile-time
    width, so a row of C stays in vector registers while a row of A is walked."""
    out: dict[str, str | None] = {f"split {c}": split_par(c) for c in (16, 64, 256)}
    for c in (16, 64, 256):
        out[f"bound N, split {c}"] = f"bound(k,kb,{n},MaxExact); {split_par(c)}"
    out["par i"] = "parallelize(i,CPUThread,NoRaces)"
    out["default"] = None
    return out


# (label, schedule, C's format): "UQ" leaves each row in workspace order, as scipy does.
SPGEMM_SCHEDULES = {
    "parallel": (
        "precompute, par i",
        "precompute(A(i,j)*B(j,k), k, k, w); parallelize(i, CPUThread, NoRaces)",
        "csr",
    ),
    "serial": ("precompute", "precompute(A(i,j)*B(j,k), k, k, w)", "csr"),
    "serial, C UQ": ("precompute, C UQ", "precompute(A(i,j)*B(j,k), k, k, w)", "UQ"),
}
# How a dense result is obtained: a fresh array per call, or written into a reused one.
NEW, OUT = "new", "out="

# Targets.
SPMV_MIN_PCT_TRIAD = 75.0
SPMM_MIN_VS_SCIPY = 3.0
SPMM_MIN_VS_TORCH = 1.5
SPGEMM_MIN_VS_SCIPY = 1.5

# Share of the machine's CPU time taken by others above which the report warns.
NOISY_SHARE = 0.05

# np.allclose tolerances: rtol, and atol relative to the largest reference magnitude.
TOL = {"float64": (1e-9, 1e-12), "float32": (1e-4, 1e-5)}


class RowError(Exception):
    """A row that cannot be measured: 'unsupported' (a UcfError), 'too slow' or 'error'."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------- helpers


def median_of(
    fns: dict[str, Callable[[], Any]], repeat: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[float]]:
    """All samples of each callable, for the caller to take medians rather than minima:
    with every core busy a lucky run says little about what a user gets."""
    return base.timings(fns, repeat, clock)


def _tuned_row(m, best: str, schedules: dict, kernels: dict, refused, tuning, s) -> dict:
    """The fields every tuned ucf-vs-scipy row reports, for the winning variant ``best``."""
    label = best.rsplit(", ", 1)[0]
    return {
        "status": "ok",
        "shape": list(m.shape),
        "nnz": int(m.nnz),
        "variant": best,
        "schedule": schedules[label],
        "cin": kernels[label].cin,
        "refused_schedules": refused,
        "tuning_s": tuning,
        "ucf_s": med(s["ucf"]),
        "scipy_s": med(s["scipy"]),
        "samples": s,
    }


def med(samples: list[float]) -> float:
    return statistics.median(samples)


def fastest(
    fns: dict[str, Callable[[], Any]], repeat: int, clock: Callable[[], float] = time.perf_counter
) -> tuple[str, dict[str, float]]:
    """Tune before the head-to-head, so each contender is timed in its best variant only."""
    meds = {k: med(v) for k, v in median_of(fns, repeat, clock).items()}
    return min(meds, key=meds.__getitem__), meds


def close(got: np.ndarray, ref: np.ndarray, dtype: str) -> bool:
    rtol, atol = TOL[dtype]
    scale = float(np.max(np.abs(ref))) if ref.size else 1.0
    return bool(np.allclose(got, ref, rtol=rtol, atol=atol * (scale or 1.0)))


def check_all(
    fns: dict[str, Callable[[], Any]], extract: Callable[[Any], np.ndarray], ref, dtype: str
) -> tuple[bool, float]:
    """Every variant is checked, not just the winner: a fast wrong kernel must not win."""
    ok, err = True, 0.0
    for f in fns.values():
        got = extract(f())
        ok = ok and close(got, ref, dtype)
        err = max(err, base._relerr(got, ref))
    return ok, err


def compile_or_raise(expr: str, formats: dict, schedule: str | None, dtype: str) -> ucf.Kernel:
    """Compile, turning ucf's refusal into a row-level 'unsupported' instead of an abort."""
    try:
        return ucf.compile(expr, formats=formats, schedule=schedule, dtype=dtype)
    except ucf.UcfError as e:
        raise RowError("unsupported", f"{type(e).__name__}: {e}") from None


def compile_candidates(
    expr: str, formats: dict, schedules: dict[str, str | None], dtype: str
) -> tuple[dict[str, ucf.Kernel], dict[str, str]]:
    """Schedules ucf refuses drop out of the tuning; the row is unsupported only if all do."""
    kernels: dict[str, ucf.Kernel] = {}
    refused: dict[str, str] = {}
    for label, schedule in schedules.items():
        try:
            kernels[label] = ucf.compile(expr, formats=formats, schedule=schedule, dtype=dtype)
        except ucf.UcfError as e:
            refused[label] = f"{type(e).__name__}: {e}"
    if not kernels:
        raise RowError("unsupported", next(iter(refused.values())))
    return kernels, refused


def guarded(row: dict, fn: Callable[[], dict]) -> dict:
    """Run one row; a UcfError or a crash in ucf marks that row and the run goes on."""
    try:
        row.update(fn())
    except RowError as e:
        row.update(status=e.kind, message=str(e))
    except ucf.UcfError as e:
        row.update(status="unsupported", message=f"{type(e).__name__}: {e}")
    except Exception as e:  # a bug in ucf must not hide the other rows' numbers
        traceback.print_exc()
        row.update(status="error", message=f"{type(e).__name__}: {e}")
    return row


def load_torch(threads: int) -> Any:
    """Set ucf's threads (loading libgomp first, so torch's OpenMP resolves to it), then
    torch's; None when torch is not installed."""
    ucf.set_num_threads(threads)
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


def openmp_runtimes() -> list[str]:
    """OpenMP libraries mapped into this process: two would mean two competing thread pools."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f}
    except OSError:
        return []
    return sorted(p for p in paths if any(k in Path(p).name for k in ("gomp", "iomp", "libomp")))


def cpu_snapshot() -> dict[str, float] | None:
    """Machine-wide busy and steal CPU seconds, and this process's own, from /proc/stat.

    Two threads on a two-core machine leave no slack: anything else running
    stretches every parallel region by whole scheduler time slices, so the
    report says how much CPU other processes (and the hypervisor) took.
    """
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0.0] * 8)[:8]
    own = os.times()
    return {
        "busy": (user + nice + system + irq + softirq) / hz,
        "steal": steal / hz,
        "own": own.user + own.system,
        "wall": time.perf_counter(),
    }


def cpu_contention(start: dict | None, end: dict | None) -> dict | None:
    if start is None or end is None:
        return None
    d = {k: end[k] - start[k] for k in start}
    return {
        "wall_s": d["wall"],
        "cpus": os.cpu_count(),
        "own_cpu_s": d["own"],
        "other_cpu_s": max(0.0, d["busy"] - d["own"]),
        "steal_s": d["steal"],
        "loadavg_end": list(os.getloadavg()),
    }


# --------------------------------------------------------------------------- benchmarks


def bench_triad(n: int, repeat: int) -> dict:
    """The bandwidth ceiling for SpMV, measured through the same ucf call path and threads.

    ucf adds work around the loop that STREAM does not have: a fresh output
    is page-faulted in by the threads, and ``out=`` is zero-filled first.
    So ``a = b + 3c`` is timed both ways, and ``a += b + 3c`` into a reused
    array (no allocation, no zero fill) as well; the fastest is the
    reference.  Every variant is credited with 4 arrays (write-allocate
    counted, which ``+=`` really moves), so the reference is never too low.
    """
    k = compile_or_raise(TRIAD, {}, TRIAD_SCHEDULE, "float64")
    krw = compile_or_raise(TRIAD_RW, {}, TRIAD_SCHEDULE, "float64")
    rng = np.random.default_rng(1)
    b = rng.random(n)
    c = rng.random(n)
    want = b + 3.0 * c
    out = np.zeros(n)
    acc = np.zeros(n)
    ok = close(k(b=b, c=c).vals, want, "float64")
    ok = ok and close(k(b=b, c=c, out=out).vals, want, "float64")
    ok = ok and close(krw(b=b, c=c, out=acc).vals, want, "float64")  # acc grows from here on
    del want
    variants = {
        f"a=b+3c, {NEW}": lambda: k(b=b, c=c),
        f"a=b+3c, {OUT}": lambda: k(b=b, c=c, out=out),
        f"a+=b+3c, {OUT}": lambda: krw(b=b, c=c, out=acc),
    }
    best, meds = fastest(variants, repeat)
    nbytes = 4 * 8 * n
    stream = min(meds[f"a=b+3c, {NEW}"], meds[f"a=b+3c, {OUT}"])
    return {
        "status": "ok",
        "n": n,
        "array_mib": n * 8 / 2**20,
        "schedule": TRIAD_SCHEDULE,
        "variants_s": meds,
        "variants_gbps": {v: nbytes / t / 1e9 for v, t in meds.items()},
        "best": best,
        "seconds": meds[best],
        "gbps": nbytes / meds[best] / 1e9,
        "statements": {"a=b+3c": TRIAD, "a+=b+3c": TRIAD_RW},
        "counted_bytes": "4 arrays x 8 bytes (b, c read; a written and write-allocated)",
        "stream_3array_gbps": 3 * 8 * n / stream / 1e9,
        "check": ok,
        "pass": None if ok else False,
    }


def bench_spmv(m: sp.csr_matrix, repeat: int, triad: dict) -> dict:
    a = ucf.from_scipy(m, format="csr")
    x = np.random.default_rng(2).uniform(-1.0, 1.0, m.shape[1])
    ref = m @ x
    y = np.zeros(m.shape[0])
    kernels, refused = compile_candidates(SPMV, {"A": "csr"}, SPMV_SCHEDULES, "float64")
    variants: dict[str, Callable[[], Any]] = {}
    for label, k in kernels.items():
        variants[f"{label}, {NEW}"] = lambda k=k: k(A=a, x=x)
        variants[f"{label}, {OUT}"] = lambda k=k: k(A=a, x=x, out=y)
    ok, err = check_all(variants, lambda t: t.vals, ref, "float64")
    best, tuning = fastest(variants, repeat)
    s = median_of({"ucf": variants[best], "scipy": lambda: m @ x}, repeat)
    t, ts = med(s["ucf"]), med(s["scipy"])
    nbytes = base.spmv_bytes(m)
    gbps = nbytes / t / 1e9
    row = {
        **_tuned_row(m, best, SPMV_SCHEDULES, kernels, refused, tuning, s),
        "compulsory_bytes": nbytes,
        "ucf_gbps": gbps,
        "scipy_gbps": nbytes / ts / 1e9,
        "speedup_vs_scipy": ts / t,
        "check": ok,
        "max_rel_err": err,
        "target": f">= {SPMV_MIN_PCT_TRIAD:g}% of triad",
        "pass": None,
    }
    if triad.get("status") == "ok":
        row["pct_triad"] = 100 * gbps / triad["gbps"]
        row["pct_stream_3array"] = 100 * gbps / triad["stream_3array_gbps"]
        row["pass"] = ok and row["pct_triad"] >= SPMV_MIN_PCT_TRIAD
    return row


def _torch_csr(torch: Any, m: sp.csr_matrix, index_dtype: type) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the "beta" notice; the invariants hold by construction
        return torch.sparse_csr_tensor(
            torch.from_numpy(m.indptr.astype(index_dtype)),
            torch.from_numpy(m.indices.astype(index_dtype)),
            torch.from_numpy(m.data),
            size=m.shape,
            check_invariants=False,
        )


def bench_spmm(m: sp.csr_matrix, n: int, repeat: int, torch: Any) -> dict:
    """Both threaded libraries pick their best variant first, so the head-to-head is fair.

    ucf tries several chunkings of the row loop and torch both index widths,
    each returning a fresh result or writing a reused one; the winners are
    then timed again, interleaved with scipy (which has no ``out=``).
    """
    dtype = str(m.dtype)
    a = ucf.from_scipy(m, format="csr")
    b = np.random.default_rng(3).uniform(-1.0, 1.0, (m.shape[1], n)).astype(dtype)
    ref = m @ b
    c = np.zeros_like(ref)
    schedules = spmm_schedules(n)
    kernels, refused = compile_candidates(SPMM, {"A": "csr"}, schedules, dtype)
    variants: dict[str, Callable[[], Any]] = {}
    for label, k in kernels.items():
        variants[f"{label}, {NEW}"] = lambda k=k: k(A=a, B=b)
        variants[f"{label}, {OUT}"] = lambda k=k: k(A=a, B=b, out=c)
    ok, err = check_all(variants, lambda t: t.vals.reshape(ref.shape), ref, dtype)
    best, tuning = fastest(variants, repeat)
    contenders: dict[str, Callable[[], Any]] = {"ucf": variants[best], "scipy": lambda: m @ b}

    torch_row: dict[str, Any] = {}
    if torch is not None:
        tb = torch.from_numpy(b)
        tc = torch.from_numpy(np.zeros_like(ref))
        tvariants: dict[str, Callable[[], Any]] = {}
        for width, idt in (("int32", np.int32), ("int64", np.int64)):
            ta = _torch_csr(torch, m, idt)
            tvariants[f"{width}, {NEW}"] = lambda ta=ta: ta @ tb
            tvariants[f"{width}, {OUT}"] = lambda ta=ta: torch.mm(ta, tb, out=tc)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch_ok, _ = check_all(tvariants, lambda t: t.numpy(), ref, dtype)
            tbest, ttuning = fastest(tvariants, repeat)
        contenders["torch"] = tvariants[tbest]
        torch_row = {"torch_variant": tbest, "torch_tuning_s": ttuning, "torch_check": torch_ok}

    s = median_of(contenders, repeat)
    t, ts = med(s["ucf"]), med(s["scipy"])
    flops = 2 * m.nnz * n
    row = {
        **_tuned_row(m, best, schedules, kernels, refused, tuning, s),
        "ucf_gflops": flops / t / 1e9,
        "scipy_gflops": flops / ts / 1e9,
        "speedup_vs_scipy": ts / t,
        "check": ok,
        "max_rel_err": err,
        **torch_row,
    }
    passes = [ok, row["speedup_vs_scipy"] >= SPMM_MIN_VS_SCIPY]
    row["target"] = f">= {SPMM_MIN_VS_SCIPY:g}x scipy"
    if "torch" in s:
        row["torch_s"] = med(s["torch"])
        row["torch_gflops"] = flops / row["torch_s"] / 1e9
        row["speedup_vs_torch"] = row["torch_s"] / t
        passes.append(row["speedup_vs_torch"] >= SPMM_MIN_VS_TORCH)
        row["target"] += f", {SPMM_MIN_VS_TORCH:g}x torch"
    else:
        row["torch_note"] = "torch not importable: the torch target is not checked"
    row["pass"] = all(passes)
    return row


def _sorted_rows(m: Any) -> bool:
    probe = sp.csr_matrix((m.data, m.indices, m.indptr), shape=m.shape, copy=False)
    return bool(probe.has_sorted_indices)  # scipy scans the rows to answer this


def bench_spgemm(
    m: sp.csr_matrix, pilot: sp.csr_matrix, which: str, repeat: int, budget: float
) -> dict:
    """Gustavson's row-by-row product needs a dense workspace, hence the precompute schedule.

    A plan that scans the whole workspace per row is quadratic in the
    dimension and would take hours at full size, so a pilot matrix with a
    tenth of the rows goes first; when quadratic extrapolation of its time
    exceeds ``budget`` seconds for the row, the full size is skipped and the
    pilot's numbers are reported instead.

    scipy leaves each output row in workspace order while ucf's csr rows are
    sorted, so scipy followed by ``sort_indices`` is timed too, for a
    like-for-like figure; the target is against plain ``A @ A``. A ``UQ`` C
    leaves ucf's rows unsorted too.
    """
    label, schedule, c_format = SPGEMM_SCHEDULES[which]
    k = compile_or_raise(SPMM, {"A": "csr", "B": "csr", "C": c_format}, schedule, str(m.dtype))
    ap = ucf.from_scipy(pilot, format="csr")
    t0 = time.perf_counter()
    k(A=ap, B=ap)
    t_pilot = time.perf_counter() - t0
    t0 = time.perf_counter()
    pilot @ pilot
    t_pilot_scipy = time.perf_counter() - t0
    estimate = t_pilot * (m.shape[0] / pilot.shape[0]) ** 2 * (repeat + 2)
    if estimate > budget:
        raise RowError(
            "too slow",
            f"pilot at {pilot.shape[0]} rows took {t_pilot:.2f} s (scipy "
            f"{t_pilot_scipy * 1e3:.1f} ms, {t_pilot / t_pilot_scipy:.0f}x slower); at "
            f"{m.shape[0]} rows, if quadratic, the row would need ~{estimate:.0f} s "
            f"(budget {budget:.0f} s): skipped",
        )
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
        "pilot_rows": pilot.shape[0],
        "pilot_ucf_s": t_pilot,
        "pilot_scipy_s": t_pilot_scipy,
        "out_nnz_ucf": int(got.nnz),
        "out_nnz_scipy": int(ref.nnz),
        "ucf_rows_sorted": _sorted_rows(got),
        "scipy_rows_sorted": _sorted_rows(ref),
        "variant": label,
        "schedule": schedule,
        "cin": k.cin,
        "ucf_s": t,
        "scipy_s": ts,
        "scipy_sorted_s": med(s["scipy_sorted"]),
        "samples": s,
        "speedup_vs_scipy": ts / t,
        "speedup_vs_scipy_sorted": med(s["scipy_sorted"]) / t,
        "check": ok,
        "max_rel_err": err,
        "pass": None if ok else False,  # the serial row is a reference point
    }
    if which == "parallel":
        row["target"] = f">= {SPGEMM_MIN_VS_SCIPY:g}x scipy"
        row["pass"] = ok and row["speedup_vs_scipy"] >= SPGEMM_MIN_VS_SCIPY
    return row


# --------------------------------------------------------------------------- report


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.2f}ms"


def verdict(r: dict) -> str:
    if r.get("status") == "too slow":
        return "FAIL (too slow)" if r.get("has_target", True) else "too slow"
    if r.get("status") != "ok":
        return r.get("status", "error")
    if not r.get("check", True):
        return "FAIL (wrong result)"
    p = r.get("pass")
    return "-" if p is None else ("PASS" if p else "FAIL")


COLS = {"case": 26, "variant": 18, "metric": 34, "target": 24}


def _line(case: str, r: dict, metric: str = "", target: str = "-") -> str:
    if r.get("status") != "ok":
        first = r.get("message", "").splitlines()[0] if r.get("message") else ""
        return f"{case:<{COLS['case']}} {r.get('status', 'error')}: {first}"
    return (
        f"{case:<{COLS['case']}} {r.get('variant', '-'):<{COLS['variant']}} "
        f"{_ms(r.get('ucf_s')):>10} {_ms(r.get('scipy_s')):>10} {_ms(r.get('torch_s')):>10}  "
        f"{metric:<{COLS['metric']}} {target:<{COLS['target']}} {verdict(r)}"
    )


def table(res: dict) -> str:
    head = (
        f"{'case':<{COLS['case']}} {'ucf variant':<{COLS['variant']}} {'ucf':>10} "
        f"{'scipy':>10} {'torch':>10}  {'ucf vs reference':<{COLS['metric']}} "
        f"{'target':<{COLS['target']}} result"
    )
    lines = [head, "-" * len(head)]
    tri = res["triad"]
    if tri.get("status") == "ok":
        lines.append(
            _line(
                f"triad {tri['array_mib']:.0f} MiB/array",
                dict(tri, variant=tri["best"]),
                f"{tri['gbps']:.1f} GB/s (4 arrays)",
            )
        )
    else:
        lines.append(_line("triad", tri))

    r = res["spmv"]
    case = f"SpMV banded {r['rows'] / 1e6:g}M rows"
    if r.get("status") == "ok" and "pct_triad" in r:
        metric = f"{r['ucf_gbps']:.1f} GB/s = {r['pct_triad']:.0f}% of triad"
    else:
        metric = f"{r.get('ucf_gbps', float('nan')):.1f} GB/s (no triad)"
    lines.append(_line(case, r, metric, f">= {SPMV_MIN_PCT_TRIAD:g}% triad"))

    for r in res["spmm"]:
        metric = target = ""
        if r.get("status") == "ok":
            metric = f"{r['speedup_vs_scipy']:.2f}x scipy"
            if "speedup_vs_torch" in r:
                metric += f", {r['speedup_vs_torch']:.2f}x torch"
            target = r["target"]
        lines.append(_line(f"SpMM N={r['N']} {r['dtype']}", r, metric, target))

    for r in res["spgemm"]:
        metric = target = ""
        if r.get("status") == "ok":
            metric = f"{r['speedup_vs_scipy']:.2f}x scipy"
            metric += f" ({r['speedup_vs_scipy_sorted']:.2f}x +sort)"
            target = r.get("target", "-")
        lines.append(_line(f"SpGEMM {r['which']}", r, metric, target))

    cfg = res["config"]
    lines.append("-" * len(head))
    lines.append(
        f"ucf and torch run {cfg['threads']} threads, scipy.sparse one. Times: median of "
        f"{cfg['repeat']} interleaved runs after a warm-up, best variant of each library "
        "(tuned first); 'Nx' = reference time / ucf time; 'new' = fresh output per call, "
        "'out=' = reused output."
    )
    if tri.get("status") == "ok":
        lines.append(
            f"triad: ucf '{TRIAD}' and '{TRIAD_RW}', {TRIAD_SCHEDULE}; GB/s counting 4 arrays "
            "(write-allocate included): "
            + "; ".join(f"'{v}' {g:.1f}" for v, g in tri["variants_gbps"].items())
        )
        r = res["spmv"]
        if "pct_stream_3array" in r:
            lines.append(
                f"       STREAM's own 3-array count for '{TRIAD}': "
                f"{tri['stream_3array_gbps']:.1f} GB/s; SpMV is {r['pct_stream_3array']:.0f}% "
                "of that (looser than %triad)"
            )
    r = res["spmv"]
    if r.get("status") == "ok":
        lines.append(
            f"SpMV: {r['nnz'] / 1e6:.1f}M nnz, {r['compulsory_bytes'] / 1e6:.0f} MB compulsory "
            f"(vals+crd+pos+x+y), scipy {r['scipy_gbps']:.1f} GB/s; variants: "
            + ", ".join(f"{lb} {_ms(t)}" for lb, t in r["tuning_s"].items())
        )
    for r in res["spmm"]:
        if r.get("status") != "ok":
            continue
        lines.append(
            f"SpMM N={r['N']}: {r['nnz'] / 1e6:.1f}M nnz; GFLOP/s ucf {r['ucf_gflops']:.1f}, "
            f"scipy {r['scipy_gflops']:.1f}"
            + (f", torch {r['torch_gflops']:.1f}" if "torch_gflops" in r else "")
            + "; ucf variants: "
            + ", ".join(f"{lb} {_ms(t)}" for lb, t in r["tuning_s"].items())
        )
        if "torch_tuning_s" in r:
            lines.append(
                "        torch variants: "
                + ", ".join(f"{lb} {_ms(t)}" for lb, t in r["torch_tuning_s"].items())
                + ("" if r["torch_check"] else " (torch result WRONG)")
            )
        elif "torch_note" in r:
            lines.append(f"        {r['torch_note']}")
    for r in res["spgemm"]:
        if r.get("status") == "ok":
            lines.append(
                f"SpGEMM {r['which']}: A {r['nnz'] / 1e6:.1f}M nnz; C nnz ucf {r['out_nnz_ucf']}, "
                f"scipy {r['out_nnz_scipy']}; rows sorted: ucf {r['ucf_rows_sorted']}, scipy "
                f"{r['scipy_rows_sorted']}; scipy + sort_indices {_ms(r['scipy_sorted_s'])}"
            )
    busy = res.get("cpu")
    if busy:
        lines.append(
            f"machine: {busy['cpus']} CPUs; during the {busy['wall_s']:.0f} s run other processes "
            f"used {busy['other_cpu_s']:.1f} CPU-s and the hypervisor stole "
            f"{busy['steal_s']:.1f} CPU-s (this process: {busy['own_cpu_s']:.1f})"
        )
        lost = busy["other_cpu_s"] + busy["steal_s"]
        if lost > NOISY_SHARE * busy["wall_s"] * (busy["cpus"] or 1):
            lines.append(
                f"WARNING: {lost:.1f} CPU-s went elsewhere during the run; parallel timings "
                "are unreliable, rerun on an idle machine"
            )
    for name, x in [("SpMV", res["spmv"]), *((f"SpMM N={r['N']}", r) for r in res["spmm"])]:
        for label, why in x.get("refused_schedules", {}).items():
            lines.append(f"{name}: ucf refused schedule '{label}': {why.splitlines()[0]}")
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
        budget = 10.0  # seconds per SpGEMM row, so --quick stays well under a minute
    else:
        sizes = {"triad": 1 << 25, "banded": 2_000_000, "spmm": 200_000, "spgemm": 100_000}
        budget = 180.0

    torch = load_torch(args.threads)

    res: dict = {
        "config": {
            "quick": args.quick,
            "threads": args.threads,
            "repeat": repeat,
            "sizes": sizes,
            "spgemm_budget_s": budget,
            "timing": "median of repeat interleaved runs after one warm-up, time.perf_counter",
            "ucf": ucf.__version__,
            "ucf_path": str(Path(ucf.__file__).parent),
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "torch": None if torch is None else torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        }
    }
    cpu_start = cpu_snapshot()
    with base.fresh_kernel_cache("ucf-bench-par-"):
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
                    {"N": n, "dtype": str(m.dtype)},
                    lambda m=m, n=n: bench_spmm(m, n, repeat, torch),
                )
            )
        del m

        m = base.uniform(sizes["spgemm"], 10, rng)
        pilot = base.uniform(sizes["spgemm"] // 10, 10, np.random.default_rng(54321))
        res["spgemm"] = []
        for which in SPGEMM_SCHEDULES:
            print(f"SpGEMM {which} ({m.shape[0]} rows, {m.nnz} nnz) ...", file=sys.stderr)
            res["spgemm"].append(
                guarded(
                    {"which": which, "has_target": which == "parallel"},
                    lambda m=m, p=pilot, w=which: bench_spgemm(m, p, w, repeat, budget),
                )
            )
        del m, pilot
        res["config"]["openmp_runtimes"] = openmp_runtimes()
    res["cpu"] = cpu_contention(cpu_start, cpu_snapshot())

    graded = [verdict(r) for r in [res["triad"], res["spmv"], *res["spmm"], *res["spgemm"]]]
    counts = {
        k: sum(v.split()[0] == k for v in graded) for k in ("PASS", "FAIL", "unsupported", "error")
    }
    res["summary"] = counts
    res["all_pass"] = counts["PASS"] > 0 and counts["PASS"] == sum(counts.values())

    print(table(res))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    print(f"\ntargets: {summary}; results written to {out}")
    if len(res["config"].get("openmp_runtimes", [])) > 1:
        print("warning: more than one OpenMP runtime is loaded", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
