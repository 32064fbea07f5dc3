"""Dask scaling: SpMM on an R-MAT matrix with ucf.dask on 1 and 2 LocalCluster workers,
against single-process ucf with 2 threads.

Run from the repository root:

    python bench/dask_scale.py                 # 2M rows (2**21), N=64: a few minutes, ~6 GB
    python bench/dask_scale.py --rows 200000   # smaller (rounded up to a power of two)
    python bench/dask_scale.py --repeat 5 --json /tmp/dask_scale.json

The workload is ``C(i,k) = A(i,j) * B(j,k)`` with A an R-MAT matrix (Graph500
parameters, ``--edge-factor`` edges per row before duplicates are dropped) in CSR,
and B dense with ``--n`` columns. On Dask, A is cut into ``--blocks`` row blocks of
about equal work, nonzeros plus rows (``ucf.dask.balanced_rows``), and B is one
chunk, so every task reads all of B: the row partition, with B replicated to each
worker. A's blocks are timed two ways: as scipy CSR chunks, which each task checks
and wraps, and as ucf CSR Tensors made once on the workers, as the single-process run
makes its Tensor once outside its timing (the targets are read on the second). The
inputs are persisted on the workers and B copied to each before timing, and the
result stays on the workers (``persist``), so the timed part is the graph, the
scheduling and the kernels; the first run (kernel load and the copy of B) is reported apart.
Every worker is a process with one thread (and ucf kernels in it serial), started
without Dask's ``MALLOC_TRIM_THRESHOLD_`` (see ``WORKER_CONFIG``); all times are best
of ``--repeat``. The whole run uses a fresh ``UCF_CACHE_DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import distributed  # noqa: E402
from dask.graph_manipulation import clone  # noqa: E402
from spmv_spmm import best_of, fresh_kernel_cache, rmat  # noqa: E402

import ucf  # noqa: E402
import ucf.dask as ud  # noqa: E402

SPMM = "C(i,k) = A(i,j) * B(j,k)"
MIN_SPEEDUP = 1.6  # 2 workers against 1
MAX_VS_THREADS = 1.3  # 2 workers against single-process ucf with 2 threads
OVERHEAD_TASKS = 400  # empty tasks timed for the scheduler's cost per task


# The active memory manager drops replicas no task waits for; B's copies on every
# worker are the point of the row partition, so it stays off. The nanny's default
# MALLOC_TRIM_THRESHOLD_ turns off glibc's adaptive mmap threshold, so every dense
# output block is fresh pages faulted in one by one (twice the kernel time on this
# machine); the workers start with Dask's other thread settings only.
WORKER_CONFIG = {
    "distributed.scheduler.active-memory-manager.start": False,
    "distributed.nanny.pre-spawn-environ": {
        "OMP_NUM_THREADS": 1,
        "MKL_NUM_THREADS": 1,
        "OPENBLAS_NUM_THREADS": 1,
    },
}


def _noop(block):
    return block


def _as_ucf(block):
    return ucf.from_scipy(block, format="csr")


def single_process(a, b, dtype: str, repeat: int) -> dict:
    """ucf in this process: the kernel call alone, with 1 and with 2 threads."""
    kernel = ucf.compile(SPMM, formats={"A": "csr"}, dtype=dtype)
    t = ucf.from_scipy(a, format="csr")
    out = {}
    for threads in (1, 2):
        ucf.set_num_threads(threads)
        out[f"ucf_{threads}t_s"] = best_of({"ucf": lambda: kernel(A=t, B=b)}, repeat)["ucf"]
    return out


def on_cluster(a, b, workers: int, blocks: int, repeat: int) -> dict:
    """ucf.dask on a LocalCluster of ``workers`` one-thread processes."""
    with (
        dask.config.set(WORKER_CONFIG),
        distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        # Row blocks scattered round-robin (persisting from_array would leave them all
        # on the worker that held the whole matrix). The from_delayed views are persisted
        # too, and B's then copied to every worker: otherwise each run would recompute
        # B's view on one worker and ship it to the others.
        rows = ud.balanced_rows(a, blocks)
        edges = np.cumsum((0, *rows))
        parts = client.scatter([a[s:e] for s, e in zip(edges[:-1], edges[1:], strict=True)])
        da_a = da.concatenate(
            [
                da.from_delayed(f, shape=(n, a.shape[1]), dtype=a.dtype, meta=a[:0])
                for f, n in zip(parts, rows, strict=True)
            ]
        )
        # The same blocks as ucf Tensors, made where each block lives (Dask records
        # Tensor chunks as numpy, so their format is given to einsum).
        da_t = da.concatenate(
            [
                da.from_delayed(f, shape=(n, a.shape[1]), dtype=a.dtype, meta=np.empty((0, 0)))
                for f, n in zip(client.map(_as_ucf, parts), rows, strict=True)
            ]
        )
        da_b = da.from_delayed(client.scatter(b, broadcast=True), shape=b.shape, dtype=b.dtype)
        da_a, da_t, da_b = client.persist([da_a, da_t, da_b])
        distributed.wait([da_a, da_t, da_b])
        client.replicate(da_b)
        where = client.who_has(da_a)
        spread = len({w for holders in where.values() for w in holders})
        b_copies = min(len(holders) for holders in client.who_has(da_b).values())

        seeds = iter(range(1 << 30))

        def run(chunks):
            # The same statement on the same inputs has the same keys; a clone gets new
            # ones, so no run finds the result of an earlier one still on the workers.
            c = ud.einsum(SPMM, formats={"A": "csr"}, A=chunks, B=da_b)
            c = clone(c, omit=[chunks, da_b], seed=next(seeds)).persist()
            distributed.wait(c)
            return c

        t0 = time.perf_counter()
        first_result = run(da_t)  # loads the kernel in every worker
        first = time.perf_counter() - t0
        err = 0.0
        for c in (first_result, run(da_a)):
            check = c[: min(2000, a.shape[0])].compute()
            err = max(err, float(np.max(np.abs(check - a[: check.shape[0]] @ b))))
        del c, first_result
        best = best_of({"ucf": lambda: run(da_t), "scipy": lambda: run(da_a)}, repeat)

        def empty_tasks():
            x = da.zeros(OVERHEAD_TASKS, chunks=1).map_blocks(_noop).persist()
            distributed.wait(x)

        per_task = best_of({"noop": empty_tasks}, repeat)["noop"] / OVERHEAD_TASKS
        tasks = len(rows)
    return {
        "workers": workers,
        "blocks": tasks,
        "workers_holding_a": spread,
        "copies_of_b": b_copies,
        "first_s": first,
        "best_s": best["ucf"],
        "best_scipy_chunks_s": best["scipy"],
        "empty_task_s": per_task,
        "max_abs_err_first_rows": err,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000, help="rows (a power of two at least)")
    p.add_argument("--edge-factor", type=int, default=8, help="R-MAT edges per row")
    p.add_argument("--n", type=int, default=64, help="columns of the dense operand B")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--blocks", type=int, default=8, help="row blocks of A (Dask tasks)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per case (best is kept)")
    p.add_argument(
        "--json",
        default=str(ROOT / "bench" / "results" / "dask_scale.json"),
        help="where to write the results (default: %(default)s)",
    )
    args = p.parse_args(argv)
    repeat = max(1, args.repeat)
    scale = max(1, math.ceil(math.log2(max(args.rows, 2))))

    with fresh_kernel_cache("ucf-bench-dask-"):
        t0 = time.perf_counter()
        a = rmat(scale, args.edge_factor, np.random.default_rng(12345)).astype(args.dtype)
        b = np.random.default_rng(7).uniform(-1, 1, (a.shape[1], args.n)).astype(args.dtype)
        print(
            f"R-MAT 2**{scale} = {a.shape[0]} rows, {a.nnz} nnz, N={args.n} {args.dtype} "
            f"(generated in {time.perf_counter() - t0:.1f} s) ...",
            file=sys.stderr,
        )
        res: dict = {
            "config": {
                **{k: v for k, v in vars(args).items() if k != "json"},
                "rows": a.shape[0],
                "nnz": int(a.nnz),
                "repeat": repeat,
                "timing": "best of repeat, time.perf_counter; Dask results persisted on workers",
                "worker_config": WORKER_CONFIG,
                "ucf": ucf.__version__,
                "dask": dask.__version__,
                "distributed": distributed.__version__,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_before": os.getloadavg(),
            }
        }
        print("single process ...", file=sys.stderr)
        res.update(single_process(a, b, args.dtype, repeat))
        res["dask"] = []
        for workers in (1, 2):
            print(f"LocalCluster, {workers} worker(s) ...", file=sys.stderr)
            res["dask"].append(on_cluster(a, b, workers, args.blocks, repeat))
        res["config"]["load_after"] = os.getloadavg()

    one, two = res["dask"]
    res["speedup_2_vs_1_worker"] = one["best_s"] / two["best_s"]
    res["ratio_2_workers_vs_2_threads"] = two["best_s"] / res["ucf_2t_s"]
    res["overhead_per_task_1_worker_s"] = (one["best_s"] - res["ucf_1t_s"]) / one["blocks"]
    res["pass_speedup"] = res["speedup_2_vs_1_worker"] >= MIN_SPEEDUP
    res["pass_vs_threads"] = res["ratio_2_workers_vs_2_threads"] <= MAX_VS_THREADS
    print(table(res))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"results written to {out}")
    return 0


def table(res: dict) -> str:
    c = res["config"]
    flops = 2 * c["nnz"] * c["n"]
    lines = [
        f"SpMM {SPMM}: R-MAT {c['rows']} rows, {c['nnz']} nnz, N={c['n']} {c['dtype']}",
        f"{'run':<48} {'best':>9} {'first':>9} {'GFLOP/s':>8}",
    ]
    rows = [
        ("ucf, 1 process, 1 thread", res["ucf_1t_s"], None),
        ("ucf, 1 process, 2 threads", res["ucf_2t_s"], None),
    ]
    for r in res["dask"]:
        where = f"{r['workers']} worker(s) x 1 thread ({r['workers_holding_a']} hold A, "
        rows += [
            (f"ucf.dask, {where}{r['copies_of_b']} B)", r["best_s"], r["first_s"]),
            ("  the same, A's chunks scipy CSR", r["best_scipy_chunks_s"], None),
        ]
    for name, best, first in rows:
        shown = f"{first:>8.3f}s" if first is not None else f"{'-':>9}"
        lines.append(f"{name:<48} {best:>8.3f}s {shown} {flops / best / 1e9:>8.2f}")
    one, two = res["dask"]

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    lines += [
        f"2 workers vs 1 worker: {res['speedup_2_vs_1_worker']:.2f}x faster "
        f"(target >= {MIN_SPEEDUP}x) {verdict(res['pass_speedup'])}",
        f"2 workers vs 1 process with 2 threads: {res['ratio_2_workers_vs_2_threads']:.2f}x "
        f"the time (target <= {MAX_VS_THREADS}x) {verdict(res['pass_vs_threads'])}",
        f"Dask overhead per task: {one['empty_task_s'] * 1e6:.0f} us (1 worker), "
        f"{two['empty_task_s'] * 1e6:.0f} us (2 workers) for empty tasks; "
        f"{res['overhead_per_task_1_worker_s'] * 1e3:.1f} ms per SpMM task on 1 worker "
        f"((Dask time - in-process kernel time) / {one['blocks']} tasks)",
        f"max abs error vs scipy on the first rows: "
        f"{max(r['max_abs_err_first_rows'] for r in res['dask']):.1e}",
        f"load average before/after: {c['load_before'][0]:.2f} / {c['load_after'][0]:.2f} "
        f"on {c['cpus']} cpus",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
