"""GPU SpMM: Sgap's four algorithms as ucf schedules, against cuSPARSE.

It also runs the two group algorithms with a group loop four times wider than
the group: each lane takes four nonzeros into a private sum.

Run from the repository root on a machine with a CUDA GPU, nvcc and pycuda
(``pip install '.[cuda]'``); cuSPARSE is reached through cupy when it is
installed (``pip install cupy-cuda12x``), otherwise its column says n/a:

    python bench/gpu_spmm.py                     # default matrices, N = 32 and 128
    python bench/gpu_spmm.py --columns 4 16 64   # other widths of the dense B
    python bench/gpu_spmm.py --mtx a.mtx b.mtx   # your own matrices
    python bench/gpu_spmm.py --json out.json

``C(i,k) = A(i,j) * B(j,k)`` with A in CSR and B, C dense row-major, float32.
For every matrix and N it runs each algorithm with each size (the group size r,
or the work per thread g) and prints one table row per combination: the
kernel time (CUDA events, best of ``--repeat``, the operands already on the
device and C zeroed before each launch but outside the timing), GFLOP/s
(2 * nnz * N / time), the speed-up over cuSPARSE's SpMM on the same device
arrays, and whether the result matches scipy.

Without a GPU the script says so and exits with status 0. ``--emulate`` runs a
tiny version of the same pipeline on ucf's CPU emulator instead: a smoke test
of the script (its timings mean nothing).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ucf  # noqa: E402
from ucf.toolchain import cuda_build  # noqa: E402

SPMM = "C(i,k) = A(i,j) * B(j,k)"
SIZES = (4, 8, 16, 32)


# --------------------------------------------------------------------- schedules
# The same algorithms as tests/codegen/test_cuda.py, with GPU-sized tiles: 32 lanes across
# the columns of B (coalesced), about 256 threads per block.
def eb_sr(g: int) -> str:
    """{<g nnz, c col>, 1}: g nonzeros and N/32 columns per thread, atomic adds."""
    return (
        f"fuse(i,j,f); pos(f,fpos,A); split(fpos,fb,f1,{8 * g}); split(f1,ft,nz,{g}); "
        "split(k,kc,kl,32); parallelize(fb,GPUBlock,IgnoreRaces); "
        "parallelize(ft,GPUThread,Atomics); parallelize(kl,GPUThread,NoRaces)"
    )


def rb_sr(g: int) -> str:
    """{<g row, c col>, 1}: g rows and N/32 columns per thread, serial sums."""
    return (
        f"reorder(i,k,j); split(i,ib,i1,{8 * g}); split(i1,it,ir,{g}); split(k,kc,kl,32); "
        "parallelize(ib,GPUBlock,NoRaces); parallelize(it,GPUThread,NoRaces); "
        "parallelize(kl,GPUThread,NoRaces)"
    )


def rb_pr(r: int, share: int = 1) -> str:
    """{<1/g row, c col>, r} with g = share * r: r lanes per row, each summing ``share`` of
    every g nonzeros privately, then a tree reduction per group."""
    rows = max(1, 256 // (32 * r))
    return (
        f"reorder(i,k,j); split(i,ib,it,{rows}); split(k,kc,kl,32); pos(j,jpos,A); "
        f"split(jpos,jpos0,jpos1,{share * r}); reorder(ib,it,kc,kl,jpos1,jpos0); "
        "parallelize(ib,GPUBlock,NoRaces); parallelize(it,GPUThread,NoRaces); "
        f"parallelize(kl,GPUThread,NoRaces); parallelize(jpos1,GPUGroup,{r},ParallelReduction)"
    )


def eb_seg(r: int, share: int = 1) -> str:
    """{<share nnz, c col>, r}: ``share`` consecutive nonzeros per lane, a segmented reduction
    per group. With more than one, a lane keeps a running sum per row, and the column loops
    go outside the nonzeros so that one sum at a time suffices."""
    groups = max(1, 256 // (32 * r))
    columns_outside = "; reorder(fb,fg,kc,kl,fl)" if share > 1 else ""
    return (
        f"fuse(i,j,f); pos(f,fpos,A); split(fpos,fb,f1,{groups * share * r}); "
        f"split(f1,fg,fl,{share * r}); split(k,kc,kl,32){columns_outside}; "
        "parallelize(fb,GPUBlock,IgnoreRaces); parallelize(fg,GPUThread,Atomics); "
        f"parallelize(fl,GPUGroup,{r},Segment); parallelize(kl,GPUThread,NoRaces)"
    )


ALGORITHMS = {
    "{<g nnz, c col>, 1}": eb_sr,
    "{<g row, c col>, 1}": rb_sr,
    "{<1/g row, c col>, r} PR": rb_pr,
    "{<1 nnz, c col>, r} Seg": eb_seg,
    "{<1/4r row, c col>, r} PR": functools.partial(rb_pr, share=4),
    "{<4 nnz, c col>, r} Seg": functools.partial(eb_seg, share=4),
}


# --------------------------------------------------------------------- matrices
def matrices(rows: int, seed: int = 0) -> dict[str, sp.csr_matrix]:
    """A uniform matrix (16 nonzeros per row) and one with power-law row lengths."""
    rng = np.random.default_rng(seed)
    uniform = sp.random(rows, rows, density=16 / rows, format="csr", random_state=seed)
    lengths = np.minimum(rows, (rng.pareto(1.2, rows) * 4).astype(np.int64))
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    indices = np.concatenate([np.sort(rng.choice(rows, n, replace=False)) for n in lengths]).astype(
        np.int32
    )
    power = sp.csr_matrix((np.ones(indptr[-1]), indices, indptr), shape=(rows, rows))
    out = {}
    for name, m in (("uniform", uniform), ("power-law", power)):
        m = sp.csr_matrix(m, dtype=np.float32)
        m.data = rng.uniform(-1, 1, m.nnz).astype(np.float32)
        out[name] = m
    return out


# --------------------------------------------------------------------- devices
class Emulator:
    """ucf's CPU emulator behind the same interface as the GPU (smoke tests only)."""

    name = "emulator"

    def upload(self, a: np.ndarray):
        return np.array(a, copy=True)

    def pointer(self, d) -> int:
        return d.ctypes.data

    def zero(self, d) -> None:
        d[...] = 0

    def download(self, d, like: np.ndarray) -> np.ndarray:
        return d.reshape(like.shape).copy()

    def library(self, source: str, path: Path):
        cuda_build.build_emulated(source, path)
        return ctypes.CDLL(str(path))

    def time(self, launch, before, repeat: int) -> float:
        best = float("inf")
        for _ in range(repeat):
            before()
            start = time.perf_counter()
            launch()
            best = min(best, (time.perf_counter() - start) * 1e3)
        return best

    def cusparse(self, A, B, repeat):
        return None, None


class GPU:
    """The current CUDA device through pycuda; cuSPARSE through cupy when present."""

    def __init__(self):
        import pycuda.autoinit as auto
        import pycuda.driver as drv

        self.drv = drv
        major, minor = auto.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.name = f"{auto.device.name()} ({self.arch})"

    def upload(self, a: np.ndarray):
        a = np.ascontiguousarray(a) if a.size else np.zeros(1, a.dtype)
        return self.drv.to_device(a), a.nbytes

    def pointer(self, d) -> int:
        return int(d[0])

    def zero(self, d) -> None:
        self.drv.memset_d8(d[0], 0, d[1])

    def download(self, d, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self.drv.memcpy_dtoh(out, d[0])
        return out

    def library(self, source: str, path: Path):
        cuda_build.build_device(source, path, self.arch)
        lib = ctypes.CDLL(str(path))
        lib.ucf_cuda_error_string.restype = ctypes.c_char_p
        return lib

    def time(self, launch, before, repeat: int) -> float:
        start, end = self.drv.Event(), self.drv.Event()
        best = float("inf")
        for _ in range(repeat):
            before()
            start.record()
            launch()
            end.record()
            end.synchronize()
            best = min(best, start.time_till(end))
        return best

    def cusparse(self, A: sp.csr_matrix, B: np.ndarray, repeat: int):
        """cuSPARSE's SpMM on the same operands (cupy), or (None, None) without cupy."""
        try:
            import cupy
            import cupyx.scipy.sparse as csp
        except ImportError:
            return None, None
        Ad, Bd = csp.csr_matrix(A), cupy.asarray(B)
        Ad @ Bd  # warm-up: handle creation and the buffer-size query
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        best = float("inf")
        for _ in range(repeat):
            start.record()
            Cd = Ad @ Bd
            end.record()
            end.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, end))
        return best, cupy.asnumpy(Cd)


# --------------------------------------------------------------------- one kernel
class Bound:
    """A compiled SpMM kernel with its operands resident on the device."""

    def __init__(self, dev, k: ucf.Kernel, A: sp.csr_matrix, B: np.ndarray, lib):
        self.dev = dev
        fn = k.llir[0]
        self.C = np.zeros((A.shape[0], B.shape[1]), dtype=np.float32)
        At = ucf.from_scipy(A, format="csr").convert(index_dtype=np.int32, dtype=np.float32)
        arrays = {
            ("pos", "A", 1): At.levels[1]["pos"],
            ("crd", "A", 1): At.levels[1]["crd"],
            ("vals", "A"): At.vals,
            ("vals", "B"): B.reshape(-1),
            ("vals", "C"): self.C.reshape(-1),
        }
        extents = {"i": A.shape[0], "j": A.shape[1], "k": B.shape[1]}
        shapes = {"A": A.shape, "B": B.shape, "C": self.C.shape}
        self.keep, args, types = [], [], []
        for p in fn.params:
            role = p.role
            if role[0] == "extent":
                args.append(extents[role[1]])
            elif role[0] == "dim":
                args.append(shapes[role[1]][role[2]])
            else:
                d = dev.upload(arrays[role])
                self.keep.append(d)
                if role == ("vals", "C"):
                    self.out = d
                args.append(dev.pointer(d))
            types.append(ctypes.c_void_p if p.is_array else ctypes.c_int64)
        self.fn = getattr(lib, f"{fn.name}_launch")
        self.fn.argtypes, self.fn.restype = types, ctypes.c_int
        self.args = args
        self.lib = lib

    def launch(self) -> None:
        status = self.fn(*self.args)
        if status != 0:
            raise RuntimeError(f"kernel failed with status {status}")

    def zero(self) -> None:
        self.dev.zero(self.out)

    def result(self) -> np.ndarray:
        self.zero()
        self.launch()
        return self.dev.download(self.out, self.C)


# --------------------------------------------------------------------- main
def run(dev, mats: dict, columns: list[int], repeat: int, scratch: Path) -> list[dict]:
    rows = []
    rng = np.random.default_rng(1)
    for mname, A in mats.items():
        for N in columns:
            B = rng.uniform(-1, 1, (A.shape[1], N)).astype(np.float32)
            expected = A @ B
            flops = 2.0 * A.nnz * N
            base, got = dev.cusparse(A, B, repeat)
            if base is not None:
                rows.append(row(mname, A, N, "cuSPARSE (cupy)", "-", base, flops, base, got))
                print_row(rows[-1], expected)
            for alg, schedule in ALGORITHMS.items():
                for size in SIZES:
                    k = ucf.compile(
                        SPMM,
                        formats={"A": "csr"},
                        schedule=schedule(size),
                        target="cuda",
                        dtype="float32",
                    )
                    lib = dev.library(k.source, scratch / f"{abs(hash(k.source))}.so")
                    bound = Bound(dev, k, A, B, lib)
                    got = bound.result()
                    ms = dev.time(bound.launch, bound.zero, repeat)
                    rows.append(row(mname, A, N, alg, size, ms, flops, base, got))
                    print_row(rows[-1], expected)
    return rows


def row(mname, A, N, alg, size, ms, flops, base, got) -> dict:
    return {
        "matrix": mname,
        "rows": A.shape[0],
        "nnz": int(A.nnz),
        "N": N,
        "algorithm": alg,
        "size": size,
        "ms": ms,
        "gflops": flops / (ms * 1e6),
        "vs_cusparse": None if base is None else base / ms,
        "result": got,
    }


HEADER = f"{'matrix':<10} {'nnz':>9} {'N':>4}  {'algorithm':<26} {'g/r':>3} {'ms':>9} "
HEADER += f"{'GFLOP/s':>8} {'vs cuSPARSE':>11}  check"


def print_row(r: dict, expected: np.ndarray) -> None:
    r["ok"] = bool(np.allclose(r.pop("result"), expected, rtol=1e-3, atol=1e-3))
    vs = "n/a" if r["vs_cusparse"] is None else f"{r['vs_cusparse']:.2f}x"
    print(
        f"{r['matrix']:<10} {r['nnz']:>9} {r['N']:>4}  {r['algorithm']:<26} {r['size']:>3} "
        f"{r['ms']:>9.4f} {r['gflops']:>8.2f} {vs:>11}  {'PASS' if r['ok'] else 'FAIL'}",
        flush=True,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the generated matrices")
    ap.add_argument("--columns", type=int, nargs="+", default=[32, 128], help="N values")
    ap.add_argument("--mtx", nargs="*", default=[], help="Matrix Market files to use instead")
    ap.add_argument("--repeat", type=int, default=20, help="timed launches per case (best kept)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--emulate", action="store_true", help="smoke test on the CPU emulator")
    args = ap.parse_args(argv)
    if args.emulate:
        dev = Emulator()
        mats = {"power-law": matrices(64)["power-law"]}
        args.columns, args.repeat = [46], 1
    else:
        why = _no_gpu()
        if why:
            print(
                f"gpu_spmm: not run: {why}. Nothing was measured; --emulate smoke-tests "
                "the script on the CPU."
            )
            return 0
        dev = GPU()
        if args.mtx:
            import scipy.io

            mats = {
                Path(p).stem: sp.csr_matrix(scipy.io.mmread(p), dtype=np.float32) for p in args.mtx
            }
        else:
            mats = matrices(args.rows)
    print(f"device: {dev.name}")
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="ucf-gpu-spmm-") as tmp:
        rows = run(dev, mats, args.columns, args.repeat, Path(tmp))
    failed = [r for r in rows if not r["ok"]]
    if args.json:
        Path(args.json).write_text(json.dumps({"device": dev.name, "rows": rows}, indent=1))
    print(f"{len(rows)} rows, {len(failed)} failed checks")
    return 1 if failed else 0


def _no_gpu() -> str:
    """Why the GPU run is impossible here ('' when it is possible)."""
    if cuda_build.nvcc_path() is None:
        return "nvcc was not found"
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        return "pycuda is not installed (pip install '.[cuda]')"
    try:
        import pycuda.autoinit  # noqa: F401
    except Exception as e:
        return f"no usable CUDA device ({e})"
    return ""


if __name__ == "__main__":
    sys.exit(main())
