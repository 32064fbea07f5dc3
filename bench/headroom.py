"""The tuner where the default leaves headroom (issue 34): ``ucf.tune`` with 50 trials
against an exhaustive sweep of the same space, the default of today and of main 6418680.

Run from the repository root (``bench/autoschedule.py --headroom`` runs the same):

    python bench/headroom.py                            # 8 kernels x 8 inputs, 2 threads
    python bench/headroom.py --kernels spgemm,sum2 --inputs uniform-10,rmat-8 --rows 5000
    python bench/headroom.py --quick                     # a smoke test: minutes

    # main 6418680's default, timed in a process of its own on the same operands:
    git archive 6418680 | (mkdir -p /tmp/ucf-6418680 && tar -x -C /tmp/ucf-6418680)
    python bench/headroom.py --old-ucf /tmp/ucf-6418680

Kernels (``--kernels``), each on 8 inputs (``--inputs``; matrices of the suite of
``autoschedule.py`` at ``--rows`` rows, 3-tensors, ResNet-like layers):

- sddmm64, sddmm256: ``C(i,j) = A(i,j) * B(i,k) * D(k,j)``, A and C CSR, K = 64, 256;
- mttkrp: ``A(i,j) = B(i,k,l) * C(k,j) * D(l,j)``, B CSF, R = 32;
- ttv: ``A(i,j) = B(i,j,k) * c(k)``, B CSF;
- spgemm: ``C(i,k) = A(i,j) * B(j,k)``, all CSR (``A @ A``, or ``A @ A.T``);
- sum2: ``C(i,j) = A(i,k)*B(k,j) + D(i,l)*E(l,j)``, all CSR (two SpGEMMs, summed);
- conv1: ``O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)``, batch 1, 3x3 filters 90 %
  zero (F ``UCCC``), float32;
- spmm128: ``C(i,k) = A(i,j) * B(j,k)``, A CSR, N = 128.

For every row: ucf's default; ``ucf.tune`` with ``--trials`` trials (seed 0, a fresh
in-memory study); and, where the space has at most ``--sweep-limit`` schedules, an
exhaustive sweep of it (``ucf.tune(exhaustive=True)``: every schedule once, timed
like a trial). All results are checked against numpy or scipy, then the default, the
tuned kernel, the sweep's best and the reference are timed in turns, ``--rounds``
rounds after a warm-up (each sample at least 2 ms of calls), and the medians compared;
a row that misses a target is raced again, its two kernels alone for twice the
rounds, and that race decides (the first race's ratio is printed beside). A study
that keeps the default returns the default's kernel: its column shows the default's
samples, since two timings of one kernel differ by up to 25 % on a busy machine; a
sweep that chose the study's schedule shows the tuned kernel's samples likewise.
With ``--old-ucf`` a child process imports ucf from that checkout and times its
default beside the same reference on the same operands; its ratio to the reference,
over the tuned kernel's, is the speed-up over main 6418680's default (two processes,
one after the other: the reference is the common yardstick). An old default whose
checked call took over 2 s is timed by that call alone (its ratio is marked ``x1``);
a row the child has not finished within ``--old-limit`` seconds is ``stopped``.

Targets (issue 34): on every row where the sweep is feasible (at least 10 rows), the
tuned kernel within 1.05x of the sweep's best; never slower than the default. The
sweep's best is the faster of the sweep's choice and the default in the race (the
default is the sweep's first trial: where the sweep's own race picked a schedule that
loses to it here, the default is the space's best).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if os.environ.get("UCF_HEADROOM_CHILD") is None and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # a child imports the checkout on its PYTHONPATH instead
if str(HERE) not in sys.path:
    sys.path.insert(1, str(HERE))

import ucf  # noqa: E402

SWEEP_TUNED_MAX = 1.05  # t_tuned / t_sweep_best, every row where the sweep is feasible
SWEEP_ROWS_MIN = 10  # rows where the sweep must be feasible
TUNED_DEFAULT_MAX = 1.0  # t_tuned / t_default: never slower
SAMPLE_SECONDS = 2e-3  # the least time one sample of a race calls a kernel
SLOW_CALL = 2.0  # seconds: an old default this slow is timed by its checked call alone
SCALE = {"float32": 1e-5, "float64": 1e-12}  # a result's error allowed, over its largest entry
MATRICES = (
    "uniform-10",
    "uniform-3",
    "powerlaw-2.0",
    "rmat-8",
    "banded-15",
    "blockdiag-32",
    "empty-rows-50",
    "clustered",
)
TENSORS = ("uniform-a", "uniform-b", "skewed-a", "skewed-b", "thin", "wide", "dense", "sparse")
LAYERS = (  # name: (height = width, channels in, channels out)
    ("L1", 56, 64, 64),
    ("L2", 28, 64, 64),
    ("L3", 28, 128, 128),
    ("L4", 14, 128, 128),
    ("L5", 14, 256, 256),
    ("L6", 7, 256, 256),
    ("L7", 7, 512, 512),
    ("L8", 28, 32, 96),
)


@dataclass
class Row:
    """One kernel on one input: the statement, formats, ucf's operands, shapes a call
    needs, the reference result and how numpy or scipy computes it."""

    kernel: str
    input: str
    statement: str
    formats: dict[str, str]
    operands: dict[str, Any]
    expect: Any
    reference: Callable[[], Any]
    shapes: dict[str, int] | None = None
    dtype: str = "float64"


# --------------------------------------------------------------------------- inputs


def matrix(name: str, rows: int) -> sp.csr_matrix:
    from autoschedule import matrix_suite

    seed = list(matrix_suite(rows)).index(name)
    return matrix_suite(rows)[name][1](np.random.default_rng([17, seed]))


def tensor(name: str, rows: int):
    """Eight 3-tensors: uniform and Zipf-sliced, thin and wide, denser and sparser."""
    from autoschedule import tensor3

    n = max(16, rows // 50)
    sizes = {
        "uniform-a": (n, 10 * rows, False),
        "uniform-b": (2 * n, 10 * rows, False),
        "skewed-a": (n, 10 * rows, True),
        "skewed-b": (2 * n, 5 * rows, True),
        "thin": (n // 2, 4 * rows, False),
        "wide": (4 * n, 10 * rows, False),
        "dense": (n // 2, 20 * rows, False),
        "sparse": (4 * n, 2 * rows, True),
    }
    size, nnz, skewed = sizes[name]
    return tensor3(max(8, size), nnz, skewed, np.random.default_rng([19, TENSORS.index(name)]))


def spgemm_pair(m: sp.csr_matrix) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    if m.shape[0] == m.shape[1]:
        return m, m
    t = m.T.tocsr()
    t.sort_indices()
    return m, t


def sddmm_row(k: int) -> Callable:
    def build(m: sp.csr_matrix, rng) -> tuple:
        b, d = rng.uniform(-1, 1, (m.shape[0], k)), rng.uniform(-1, 1, (k, m.shape[1]))
        rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))

        def ref():
            out = np.einsum("ik,ik->i", b[rows], d.T[m.indices]) * m.data
            return sp.csr_matrix((out, m.indices, m.indptr), shape=m.shape)

        ops = {"A": ucf.from_scipy(m), "B": b, "D": d}
        return "C(i,j) = A(i,j) * B(i,k) * D(k,j)", {"A": "csr", "C": "csr"}, ops, ref

    return build


def build_spgemm(m: sp.csr_matrix, rng) -> tuple:
    a, b = spgemm_pair(m)
    ops = {"A": ucf.from_scipy(a), "B": ucf.from_scipy(b)}
    return "C(i,k) = A(i,j) * B(j,k)", dict.fromkeys("ABC", "csr"), ops, lambda: a @ b


def build_sum2(m: sp.csr_matrix, rng) -> tuple:
    a, b = spgemm_pair(m)
    d = a[rng.permutation(a.shape[0])]  # the same rows, shuffled: another product
    e = b[:, rng.permutation(b.shape[1])].tocsr()
    e.sort_indices()
    ops = {t: ucf.from_scipy(x) for t, x in zip("ABDE", (a, b, d, e), strict=True)}
    stmt = "C(i,j) = A(i,k)*B(k,j) + D(i,l)*E(l,j)"
    return stmt, dict.fromkeys("ABCDE", "csr"), ops, lambda: a @ b + d @ e


def build_spmm(m: sp.csr_matrix, rng) -> tuple:
    b = rng.uniform(-1, 1, (m.shape[1], 128))
    return "C(i,k) = A(i,j) * B(j,k)", {"A": "csr"}, {"A": ucf.from_scipy(m), "B": b}, lambda: m @ b


def build_ttv(t, rng) -> tuple:
    c = rng.uniform(-1, 1, t.shape[2])
    mat = t.matricized()
    ops = {"B": t.ucf(), "c": c}
    return "A(i,j) = B(i,j,k) * c(k)", {"B": "csf"}, ops, lambda: (mat @ c).reshape(t.shape[:2])


def build_mttkrp(t, rng) -> tuple:
    from autoschedule import mttkrp_numpy

    c, d = rng.uniform(-1, 1, (t.shape[1], 32)), rng.uniform(-1, 1, (t.shape[2], 32))
    ops = {"B": t.ucf(), "C": c, "D": d}
    stmt = "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)"
    return stmt, {"B": "csf"}, ops, lambda: mttkrp_numpy(t, c, d)


def conv_row(layer: tuple, rng) -> Row:
    name, h, c, m = layer
    x = rng.standard_normal((1, c, h + 2, h + 2)).astype(np.float32)  # padded by 1
    f = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    f[rng.random(f.shape) < 0.9] = 0
    import torch

    xt, ft = torch.from_numpy(x), torch.from_numpy(f)

    def ref():
        return torch.nn.functional.conv2d(xt, ft).numpy()

    return Row(
        "conv1",
        f"{name} {h}x{h} {c}->{m}",
        "O(n,m,p,q) = I(n,c,p+r,q+s) * F(m,c,r,s)",
        {"F": "UCCC"},
        {"I": x, "F": ucf.from_numpy(f, format="UCCC")},
        ref(),
        ref,
        {"p": h, "q": h},
        "float32",
    )


MATRIX_KERNELS = {
    "sddmm64": sddmm_row(64),
    "sddmm256": sddmm_row(256),
    "spgemm": build_spgemm,
    "sum2": build_sum2,
    "spmm128": build_spmm,
}
TENSOR_KERNELS = {"ttv": build_ttv, "mttkrp": build_mttkrp}
KERNELS = (*MATRIX_KERNELS, *TENSOR_KERNELS, "conv1")


def rows_of(kernel: str, names: list[str] | None, size: int):
    """The rows of ``kernel``: (input name, a function building the Row)."""
    seed = zlib.crc32(kernel.encode())
    if kernel == "conv1":
        for layer in LAYERS:
            if names is None or layer[0] in names:
                yield layer[0], lambda ly=layer: conv_row(ly, np.random.default_rng([seed, 0]))
        return
    pool = TENSORS if kernel in TENSOR_KERNELS else MATRICES
    build = TENSOR_KERNELS.get(kernel) or MATRIX_KERNELS[kernel]
    load = tensor if kernel in TENSOR_KERNELS else matrix
    for name in pool:
        if names is not None and name not in names:
            continue

        def make(name=name) -> Row:
            stmt, fmts, ops, ref = build(load(name, size), np.random.default_rng([seed, 1]))
            return Row(kernel, name, stmt, fmts, ops, ref(), ref)

        yield name, make


# --------------------------------------------------------------------------- timing


def close(got: Any, expect: Any, dtype: str) -> bool:
    """Whether ``got`` holds ``expect``'s values: each within ``rtol`` of its own, or within
    ``SCALE`` of the largest (a float32 sum of 2,304 products near zero differs from
    torch's by more than 1e-6 while both are 5e-7 of the largest away from the float64
    sum: a convolution of 256 channels)."""
    rtol = 1e-3 if dtype == "float32" else 1e-7
    if hasattr(got, "to_scipy") and sp.issparse(expect):
        got = got.to_scipy()
    elif hasattr(got, "to_numpy"):
        got = got.to_numpy()
    if sp.issparse(expect):
        diff = abs(got - expect)
        return diff.nnz == 0 or diff.max() <= rtol * max(abs(expect).max(), 1e-30)
    atol = SCALE[dtype] * float(np.abs(expect).max(initial=0.0))
    return np.allclose(np.asarray(got).reshape(expect.shape), expect, rtol=rtol, atol=atol)


def race(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds per call of each, timed in turns (the order rotating) after a
    warm-up call each; each sample enough calls to last about ``SAMPLE_SECONDS`` (one
    call of a 0.1 ms kernel is mostly the clock's and the call's own noise); wall time
    (kernels with threads run here)."""
    names = list(calls)
    counts = {}
    for name, fn in calls.items():
        start = time.perf_counter()
        fn()
        counts[name] = max(1, min(1000, int(SAMPLE_SECONDS / (time.perf_counter() - start))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            start = time.perf_counter()
            for _ in range(counts[name]):
                calls[name]()
            samples[name].append((time.perf_counter() - start) / counts[name])
    return {n: statistics.median(s) for n, s in samples.items()}


def best_of_space(seconds: dict[str, float]) -> float:
    """The best of the swept space in the race: the sweep's choice, or the default (its
    first trial) where the sweep's choice lost to it here (its study's race was fooled)."""
    return min(seconds["sweep"], seconds["default"])


def misses(seconds: dict[str, float]) -> list[tuple[str, str, float]]:
    """The targets a race's medians miss: (kernel, the one it is held against, the bound)."""
    found = []
    if seconds["tuned"] > TUNED_DEFAULT_MAX * seconds["default"]:
        found.append(("tuned", "default", TUNED_DEFAULT_MAX))
    if "sweep" in seconds and seconds["tuned"] > SWEEP_TUNED_MAX * best_of_space(seconds):
        found.append(("tuned", "sweep", SWEEP_TUNED_MAX))
    return found


def rerace(calls: dict[str, Callable[[], Any]], seconds: dict[str, float], rounds: int) -> dict:
    """A miss of the first race is raced again, its two kernels alone and interleaved,
    for twice the rounds: a busy moment during the first race must not make a miss.
    The second race's medians replace the first's for that pair (and for the names
    that stand for the same kernel: a kept default); the first's ratio is kept beside."""
    again = {}
    for a, b, _bound in misses(seconds):
        ka, kb = (n if n in calls else "default" for n in (a, b))
        if ka == kb:
            continue  # one kernel under two names: its samples are one
        first = seconds[a] / seconds[b]
        found = race({kb: calls[kb], ka: calls[ka]}, 2 * rounds)
        for name in seconds:
            if (name if name in calls else "default") in found:
                seconds[name] = found[name if name in calls else "default"]
        again[f"{a}/{b}"] = {"first": first, "again": seconds[a] / seconds[b]}
    return again


def same_schedule(a: str, b: str) -> bool:
    """Whether two schedule texts build one kernel (spacing and workspace names aside).
    Two kernel objects of one schedule timed in one race differed by up to 3.3x at
    1,000 rows (spgemm/uniform-3: 0.089 vs 0.293 ms), each with a history of its own
    (which plan its team runs after losing loops), so one kernel is raced, not two."""
    from ucf.schedule.text import as_commands
    from ucf.tuning.probe import normalized

    return normalized(as_commands(a)) == normalized(as_commands(b))


def kernel_call(k: Any, row: Row) -> Callable[[], Any]:
    return lambda: k(shapes=row.shapes, **row.operands)


def measure_row(row: Row, args) -> dict:
    """Default, tuned, sweep and reference for one row, checked then raced."""
    from optuna.storages import InMemoryStorage

    out: dict[str, Any] = {"kernel": row.kernel, "input": row.input}
    default = ucf.compile(row.statement, formats=row.formats, dtype=row.dtype)
    tune = dict(formats=row.formats, dtype=row.dtype, shapes=row.shapes, progress=False)
    start = time.perf_counter()
    tuned = ucf.tune(
        row.statement,
        trials=args.trials,
        seed=0,
        storage=InMemoryStorage(),
        **tune,
        **row.operands,
    )
    out["tune_s"] = time.perf_counter() - start
    out["tuned"] = {"schedule": tuned.schedule, "is_default": tuned.is_default}
    calls = {"reference": row.reference, "default": kernel_call(default, row)}
    if not tuned.is_default:  # else it is the default's kernel: its samples are the default's
        calls["tuned"] = kernel_call(tuned.kernel, row)
    start = time.perf_counter()
    try:
        sweep = ucf.tune(
            row.statement,
            trials=args.sweep_limit,
            exhaustive=True,
            storage=InMemoryStorage(),
            **tune,
            **row.operands,
        )
    except ucf.UcfError as e:
        out["sweep"] = {"feasible": False, "why": str(e)}
    else:
        out["sweep"] = {
            "feasible": True,
            "schedules": len(sweep.study.trials),
            "schedule": sweep.schedule,
            "is_default": sweep.is_default,
        }
        if same_schedule(sweep.schedule, tuned.schedule) and not tuned.is_default:
            out["sweep"]["same_as_tuned"] = True  # one kernel: its samples are the tuned's
        elif not sweep.is_default:
            calls["sweep"] = kernel_call(sweep.kernel, row)
    out["sweep_s"] = time.perf_counter() - start
    for name in ("default", "tuned", "sweep"):
        if name in calls and not close(calls[name](), row.expect, row.dtype):
            out["status"] = f"wrong result: {name}"
            return out
    out["seconds"] = race(calls, args.rounds)
    out["seconds"].setdefault("tuned", out["seconds"]["default"])
    if out["sweep"]["feasible"]:
        same = "tuned" if out["sweep"].get("same_as_tuned") else "default"
        out["seconds"].setdefault("sweep", out["seconds"][same])
    out["reraced"] = rerace(calls, out["seconds"], args.rounds)
    out["default_schedule"] = default.schedule_used
    out["status"] = "ok"
    return out


def old_defaults(args, rows: list[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """The defaults of the ucf checkout at ``--old-ucf``, timed beside the reference in a
    child process that imports it: (kernel, input) -> {"default": s, "reference": s}.
    The child writes a line per pair; a pair it has not finished within ``--old-limit``
    seconds (main 6418680 co-iterated every (i, j) of a sum of products: 104 s a call)
    is recorded as stopped, the child killed, and a new one goes on with the rest."""
    if not args.old_ucf:
        return {}
    out = Path(args.json).with_suffix(".old.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)  # bench/results/ is not in the repository
    env = {**os.environ, "PYTHONPATH": args.old_ucf, "UCF_HEADROOM_CHILD": "1"}
    env["UCF_CACHE_DIR"] = str(Path(args.old_ucf) / ".bench-cache")
    found: dict[tuple[str, str], dict] = {}
    todo = list(rows)
    while todo:
        out.write_text("")
        pairs = ",".join(f"{k}:{i}" for k, i in todo)
        cmd = [sys.executable, __file__, "--old-child", str(out), "--pairs", pairs]
        cmd += ["--rows", str(args.rows), "--threads", str(args.threads)]
        cmd += ["--rounds", str(args.rounds)]
        child = subprocess.Popen(cmd, env=env)
        done, since = 0, time.monotonic()
        while child.poll() is None and time.monotonic() - since < args.old_limit:
            time.sleep(0.2)
            lines = out.read_text().splitlines()
            if len(lines) > done:
                done, since = len(lines), time.monotonic()
        if child.poll() is None:
            child.kill()
            child.wait()
        for line in out.read_text().splitlines():
            r = json.loads(line)
            if r:  # the first line says the child has imported ucf
                found[(r["kernel"], r["input"])] = r
        todo = [p for p in todo if p not in found]
        if todo:  # the first pair left stopped the child (or crashed it)
            kernel, name = todo.pop(0)
            why = f"stopped after {args.old_limit:.0f} s" if child.returncode else "crashed"
            found[(kernel, name)] = {"kernel": kernel, "input": name, "status": why}
    return found


def old_child(args) -> None:
    """In the child: time this ucf's default beside the reference on every pair, a line
    of JSON per pair as it is done. A default whose checked call took over ``SLOW_CALL``
    seconds is timed by that call alone."""
    ucf.set_num_threads(args.threads)
    with open(args.old_child, "a") as f:
        f.write("{}\n")  # imported: the time limit of the first pair starts now
    for pair in args.pairs.split(","):
        kernel, name = pair.split(":")
        make = dict(rows_of(kernel, [name], args.rows))[name]
        row = make()
        k = ucf.compile(row.statement, formats=row.formats, dtype=row.dtype)
        entry = {"kernel": kernel, "input": name}
        start = time.perf_counter()
        got = k(shapes=row.shapes, **row.operands)
        once = time.perf_counter() - start
        if not close(got, row.expect, row.dtype):
            entry["status"] = "wrong result"
        elif once > SLOW_CALL:
            entry.update(race({"reference": row.reference}, args.rounds), default=once, once=True)
        else:
            entry.update(
                race({"reference": row.reference, "default": kernel_call(k, row)}, args.rounds)
            )
        with open(args.old_child, "a") as f:
            f.write(json.dumps(entry) + "\n")
        print(f"  old default {kernel} {name}: {entry}", file=sys.stderr)


# --------------------------------------------------------------------------- report


def report(results: list[dict], old: dict) -> list[str]:
    lines = [
        f"{'kernel':9s} {'input':16s} {'default':>9s} {'tuned':>9s} {'sweep':>9s} "
        f"{'tun/def':>7s} {'tun/swp':>7s} {'vs 6418680':>10s}  tuned schedule"
    ]
    for r in results:
        if r.get("status") != "ok":
            lines.append(f"{r['kernel']:9s} {r['input']:16s} {r.get('status')}")
            continue
        s = r["seconds"]
        sweep = best_of_space(s) if "sweep" in s else None
        o = old.get((r["kernel"], r["input"]))
        vs_old = ""
        if o and "default" in o:
            # each process's default over its own reference: the reference is the yardstick
            vs_old = f"{(o['default'] / o['reference']) / (s['tuned'] / s['reference']):.2f}x"
            vs_old += "1" if o.get("once") else ""  # timed by one call
        elif o:
            vs_old = o["status"].split()[0]  # stopped (past --old-limit), wrong, crashed
        t_sweep = f"{sweep * 1e3:8.2f}m" if sweep else "   (n/a)"
        vs_sweep = f"{s['tuned'] / sweep:7.2f}" if sweep else "    n/a"
        chosen = r["tuned"]["schedule"] or "(none)"
        if r["tuned"]["is_default"]:
            chosen += " [default]"
        for pair, ratios in r.get("reraced", {}).items():
            chosen += f" [{pair} re-raced: first race {ratios['first']:.2f}]"
        lines.append(
            f"{r['kernel']:9s} {r['input']:16s} {s['default'] * 1e3:8.2f}m "
            f"{s['tuned'] * 1e3:8.2f}m {t_sweep:>9s} {s['tuned'] / s['default']:7.2f} "
            f"{vs_sweep:>7s} {vs_old:>10s}  {chosen}"
        )
    return lines


def targets(results: list[dict]) -> list[str]:
    ok = [r for r in results if r.get("status") == "ok"]
    feasible = [r for r in ok if "sweep" in r["seconds"]]
    near = [
        r
        for r in feasible
        if r["seconds"]["tuned"] <= SWEEP_TUNED_MAX * best_of_space(r["seconds"])
    ]
    slower = [r for r in ok if r["seconds"]["tuned"] > TUNED_DEFAULT_MAX * r["seconds"]["default"]]
    worst = max(
        (r["seconds"]["tuned"] / best_of_space(r["seconds"]) for r in feasible), default=math.nan
    )
    names = ", ".join(f"{r['kernel']}/{r['input']}" for r in slower)

    def mark(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return [
        f"  sweep feasible on {len(feasible)} rows (target >= {SWEEP_ROWS_MIN})  "
        f"{mark(len(feasible) >= SWEEP_ROWS_MIN)}",
        f"  tuned within {SWEEP_TUNED_MAX}x of the sweep's best: {len(near)} of {len(feasible)} "
        f"rows (worst {worst:.2f}x)  {mark(len(near) == len(feasible))}",
        f"  tuned never slower than the default: {len(ok) - len(slower)} of {len(ok)} rows "
        f"({names or 'none slower'})  {mark(not slower)}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", help=f"comma-separated, of {', '.join(KERNELS)}")
    p.add_argument("--inputs", help="comma-separated input names (default: 8 per kernel)")
    p.add_argument("--rows", type=int, default=20_000, help="rows of the matrices (%(default)s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--sweep-limit", type=int, default=400, help="largest space swept")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="small inputs, 2 per kernel")
    p.add_argument("--old-ucf", help="a checkout of main 6418680 to time its default")
    p.add_argument(
        "--old-limit", type=float, default=120, help="seconds an old default's row may take"
    )
    p.add_argument("--json", default=str(HERE / "results" / "headroom.json"))
    p.add_argument("--old-child", help=argparse.SUPPRESS)
    p.add_argument("--pairs", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.old_child:
        old_child(args)
        return 0
    if args.quick:
        args.rows, args.rounds = min(args.rows, 3000), min(args.rounds, 3)
    kernels = args.kernels.split(",") if args.kernels else list(KERNELS)
    names = args.inputs.split(",") if args.inputs else None
    todo = []
    for kernel in kernels:
        found = list(rows_of(kernel, names, args.rows))
        todo += [(kernel, name, make) for name, make in (found[:2] if args.quick else found)]
    ucf.set_num_threads(args.threads)
    old = old_defaults(args, [(k, n) for k, n, _ in todo])
    ucf.set_num_threads(args.threads)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        for kernel, name, make in todo:
            print(f"{kernel} on {name} ...", file=sys.stderr)
            row = make()
            r = measure_row(row, args)
            results.append(r)
            print("\n".join(report([r], old)[1:]), file=sys.stderr)
            spent = f"tune {r.get('tune_s', 0):.1f} s, sweep {r.get('sweep_s', 0):.1f} s"
            print(f"  ({spent}; load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
    print(f"{args.threads} thread(s), {args.trials} trials, sweeps up to {args.sweep_limit}:")
    print("\n".join(report(results, old)))
    print("\ntargets (issue 34):")
    print("\n".join(targets(results)))
    if not old:
        print("  (no --old-ucf: tuned vs main 6418680's default not measured)")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"threads": args.threads, "rows": results}, indent=1, default=str))
    print(f"\nresults written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
