"""STile (issue 16, Performance): building the index of a mask's nonzero micro-tiles.

Run from the repository root:

    python bench/stile.py              # 4096 x 4096 mask, 2 threads
    python bench/stile.py --quick      # 512 x 512: seconds
    python bench/stile.py --section compute   # one section (index, compute, moe)

Every call gets a fresh random mask (made before the clock starts), as dynamic
sparsity does. ``ucf.stile_index(mask, (32, 1))`` on the llvm and c targets is
timed against ``scipy.sparse.csr_array(mask)`` (the CSR a static format would
build every call), best of ``--repeat`` runs; the target is a ratio of at least
5. The index is checked against numpy's tile reduction first.  Then index build +
compute: a kernel with a dynamic operand (``dynamic={"A": (32, 1)}``, the mask
passed each call) against torch's dense matmul of the masked A and ucf CSR SpMM
with the CSR built each call (best of 3; torch's and the CSR's times include
masking A, which ucf does inside the kernel). The MoE row runs examples/moe.py's
kernel against its per-expert torch loop, taking turns on each of ``--repeat``
routings (best of each).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ucf  # noqa: E402


def best(fn, masks, clock=time.perf_counter) -> float:
    """The least time of ``fn`` over ``masks`` on ``clock`` (``time.process_time``: CPU
    seconds of every thread, which a busy shared machine inflates less than wall time)."""
    times = []
    for m in masks:
        t0 = clock()
        fn(m)
        times.append(clock() - t0)
    return min(times)


def interleaved(fns: dict, inputs) -> dict:
    """The least wall and CPU seconds (``time.process_time``) of each of ``fns`` over
    ``inputs``, the functions taking turns on each input, so a shared machine's load
    weighs on all of them alike."""
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for x in inputs:
        for k, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn(x)
            cpu[k].append(time.process_time() - c0)
            wall[k].append(time.perf_counter() - w0)
    return {k: (min(wall[k]), min(cpu[k])) for k in fns}


def check(mask: np.ndarray, tile: tuple[int, int], target: str) -> None:
    bh, bw = tile
    m, k = mask.shape
    t = ucf.stile_index(mask, tile, target=target)
    want = mask.reshape(m // bh, bh, k // bw, bw).any(axis=(1, 3))
    if not np.array_equal(t.to_numpy() != 0, want):
        raise SystemExit(f"stile_index on {target} lists the wrong tiles")


SECTIONS = ("index", "compute", "moe")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 512 x 512 mask")
    ap.add_argument("--repeat", type=int, default=7, help="timed calls per case (best kept)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--section", choices=SECTIONS, help="run one section (default: each in turn)")
    args = ap.parse_args()
    if args.section is None:
        # Each section in a process of its own, OpenMP threads sleeping when idle: torch
        # brings its own libgomp beside the system's that ucf loads, and two runtimes
        # spinning on 2 shared cores slow whichever runs next by 10-100x.
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive")}
        for section in SECTIONS:
            subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--section", section],
                check=True,
                env=env,
            )
        return
    os.environ.setdefault("UCF_CACHE_DIR", tempfile.mkdtemp(prefix="ucf-bench-stile-"))
    ucf.set_num_threads(args.threads)
    n = 512 if args.quick else 4096
    tile = (32, 1)
    rng = np.random.default_rng(0)
    if args.section == "compute":
        compute(n, 1024 if not args.quick else 128, tile, min(args.repeat, 3), args.threads, rng)
    elif args.section == "moe":
        moe(args.threads, args.repeat, args.quick, rng)
    else:
        index(n, tile, args.repeat, args.threads, rng)


def index(n: int, tile: tuple[int, int], repeat: int, threads: int, rng) -> None:
    """The index build on both targets against scipy's CSR of the mask."""
    print(f"index build, {n}x{n} mask, {tile[0]}x{tile[1]} tiles, {threads} threads")
    print(f"{'density':>8} {'scipy ms':>9} {'llvm ms':>8} {'c ms':>8} {'llvm x':>7} {'c x':>7}")
    for density in (0.1, 0.5):
        masks = [rng.random((n, n)) < density for _ in range(repeat)]
        for target in ("llvm", "c"):
            check(masks[0], tile, target)
        scipy_t = best(sp.csr_array, masks)
        ours = {
            t: best(lambda m, t=t: ucf.stile_index(m, tile, target=t), masks) for t in ("llvm", "c")
        }
        verdict = "PASS" if min(ours.values()) * 5 <= scipy_t else "FAIL"
        print(
            f"{density:>8.0%} {scipy_t * 1e3:>9.2f} {ours['llvm'] * 1e3:>8.2f} "
            f"{ours['c'] * 1e3:>8.2f} {scipy_t / ours['llvm']:>7.1f} {scipy_t / ours['c']:>7.1f}"
            f"  target >= 5x: {verdict}"
        )


def compute(n: int, cols: int, tile: tuple[int, int], repeat: int, threads: int, rng) -> None:
    """Index build + compute with a dynamic operand (``ucf.compile(..., dynamic=...)``,
    A dense with a fresh mask each call, default schedule: the live k's of each block
    of rows gathered into dense compute tiles, ``ucf.stile.kernels``) against torch's
    dense matmul of the masked A and ucf CSR SpMM with the CSR built each call. The
    masks are 32x1-structured: every tile is all live or all zero."""
    bh, bw = tile
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, cols), dtype=np.float32)
    dyn = ucf.compile("C(i,n) = A(i,k) * B(k,n)", dynamic={"A": tile}, dtype=np.float32)
    csr = ucf.compile("C(i,n) = A(i,k) * B(k,n)", {"A": "csr"}, dtype=np.float32)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    print(f"index build + compute, {n}x{n} times {n}x{cols} float32, {tile[0]}x{tile[1]} tiles")
    print(
        f"{'sparsity':>8} {'ucf dyn ms':>11} {'torch dense ms':>15} {'ucf csr ms':>11} "
        f"{'vs torch':>9} {'vs csr':>7}"
    )
    for density in (0.1, 0.5):
        masks = [
            np.repeat(np.repeat(rng.random((n // bh, n // bw)) < density, bh, 0), bw, 1)
            for _ in range(repeat)
        ]
        got = np.asarray(dyn(A=a, B=b, masks={"A": masks[0]}))
        if not np.allclose(got, (a * masks[0]) @ b, rtol=1e-3, atol=1e-2):
            raise SystemExit("the dynamic SpMM is wrong")
        ours = best(lambda m: dyn(A=a, B=b, masks={"A": m}), masks)
        built = best(lambda m: csr(A=ucf.from_numpy(a * m, "csr"), B=b), masks)
        line = f"{1 - density:>8.0%} {ours * 1e3:>11.1f}"
        if torch is None:
            line += f" {'n/a':>15}"
        else:
            tb = torch.from_numpy(b)
            dense = best(lambda m, tb=tb: torch.from_numpy(a * m) @ tb, masks)
            line += f" {dense * 1e3:>15.1f}"
        line += f" {built * 1e3:>11.1f}"
        if torch is not None:
            line += f" {dense / ours:>8.1f}x"
        line += f" {built / ours:>6.1f}x"
        goal = "torch >= 4x, csr >= 3x" if density == 0.1 else "torch >= 1x"
        print(f"{line}  targets: {goal}")


def moe(threads: int, repeat: int, quick: bool, rng) -> None:
    """examples/moe.py's kernel (R dynamic, a new top-2 routing each call) against its
    per-expert torch loop, 8 experts; both write a new dense C (zeros but at the routed
    tokens' rows). The two take turns on each routing (``interleaved``); the least wall
    time of each is compared, and its least CPU seconds follow. Each call's C is dropped
    before the next, so ucf's comes from its pool (``ucf.exec.recycled``: the last C,
    its other rows zeroed by the kernel) where torch's is new memory; a second line
    times both writing into one caller's out= (torch zeroing it first)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import moe as example

    found = example.baselines(threads)
    tokens, d, n = (256, 64, 64) if quick else (2048, 512, 512)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    w = rng.standard_normal((8, d, n)).astype(np.float32)
    kernel = example.compile_moe()
    routes = [example.routing(rng, 8, tokens, 2) for _ in range(repeat)]
    got = np.asarray(kernel(R=routes[0], X=x, W=w))
    if not np.allclose(got, example.reference(routes[0], x, w), rtol=1e-3, atol=1e-3):
        raise SystemExit("the MoE kernel is wrong")
    out = np.ones((8, tokens, n), dtype=np.float32)
    fns = {
        "ucf": lambda r: kernel(R=r, X=x, W=w),
        "ucf out": lambda r: kernel(R=r, X=x, W=w, out=out),
    }
    if found is not None:
        fns["torch"] = lambda r: found[0](r, x, w)
        fns["torch out"] = lambda r: found[0](r, x, w, out)
    times = interleaved(fns, routes)
    ours, cpu = times["ucf"]
    line = f"MoE, 8 experts, top-2, {tokens} tokens, d={d}, n={n}: ucf {ours * 1e3:.1f} ms"
    if found is not None:
        serial, serial_cpu = times["torch"]
        line += f", torch per-expert loop {serial * 1e3:.1f} ms ({serial / ours:.2f}x)"
        verdict = "PASS" if serial >= 2 * ours else "FAIL"
        line += f"  target >= 2x: {verdict}  (CPU: ucf {cpu * 1e3:.1f} ms, torch "
        line += f"{serial_cpu * 1e3:.1f} ms)"
    print(line)
    ours, cpu = times["ucf out"]
    line = f"  into a caller's out=: ucf {ours * 1e3:.1f} ms"
    if found is not None:
        serial, serial_cpu = times["torch out"]
        line += f", torch per-expert loop {serial * 1e3:.1f} ms ({serial / ours:.2f}x)  (CPU: ucf "
        line += f"{cpu * 1e3:.1f} ms, torch {serial_cpu * 1e3:.1f} ms)"
    print(line)


if __name__ == "__main__":
    main()
