"""The gradients of a sampled product (SDDMM) with a sparse output, against scipy.

Run from the repository root, one size per process so that ``/usr/bin/time -v``
reports that size's peak memory:

    /usr/bin/time -v python bench/sddmm_gradients.py --rows 10000
    /usr/bin/time -v python bench/sddmm_gradients.py --rows 100000

``A(i,j) = B(i,j) * C(i,k) * D(k,j)`` with B and A in CSR (``--nnz-row`` entries a
row at random columns), C row-major and D column-major (``--K`` columns / rows;
``--D-format``: D's declared format, ``UU:1,0`` by default, so its gradient comes back
column-major, each stored entry of A adding K contiguous values; ``UU`` declares it
row-major, read in place all the same, and its gradient row-major),
float64, on the default thread count. The output's gradient is a tensor on A's
index arrays with random values; ``ucf.gradients`` computes those of B (on B's
pattern), C and D, each checked against scipy (``grad_C = (G∘B) Dᵀ``, ``grad_D =
((G∘B)ᵀ C)ᵀ``, ``grad_B = G∘(C D)`` at B's entries) and timed, medians of
``--repeat`` calls interleaved with scipy's of the same gradient, each timed call
after an untimed one of the same contender, so that none is timed on the allocator
state the other left (grad_D with D row-major, one thread, load 6: 8.5 ms wall right
after scipy's call, 4.9 after its own, in the same CPU time; scipy's 7.7 and 4.6
likewise). ``--threads``:
ucf's thread count, its default otherwise). Before the gradient of a sparse output
was read sparse, the kernels read it as a dense rows × rows array: 800 MB at 10k
rows, a FormatError (its position count does not fit int32) at 100k; a failure is
printed, not raised. Last, one forward call's peak allocation: a Fortran-ordered D
is read in place where the kernel reads it column-major (it was copied to C order,
then relaid). The target rows print met or NOT met. ``--plans`` adds grad_D's kernel
against the plans the default ran before it walked the sparse operands once (``i, k,
j``, and ``k, i, j`` parallel over k), given as schedules: CPU-time medians (both
threads counted), interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
import warnings

import numpy as np
import scipy.sparse as sp

import ucf
from ucf.toolchain.jit import num_threads

SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
#: The gradient of D as ``ucf.gradients`` derives it, and the plans its default ran before.
GRAD_D = "grad_D(k,j) = grad_A(i,j) * B(i,j) * C(i,k)"
EARLIER = {"i, k, j": "reorder(i,k,j)", "k, i, j": "reorder(k,i,j)"}
#: Targets: every gradient allocates at most this many bytes per stored entry of A
#: (the dense gradient of A alone would be rows² * 8), and takes at most this many
#: times scipy's (which forms G∘B and multiplies).
BYTES_PER_ENTRY = 64
SCIPY_RATIO = 1.5


def operands(n: int, per_row: int, K: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), per_row)
    cols = rng.integers(0, n, n * per_row)
    B = sp.csr_matrix((rng.standard_normal(n * per_row), (rows, cols)), shape=(n, n))
    B.sum_duplicates()
    B.sort_indices()
    C = rng.standard_normal((n, K))
    D = np.asfortranarray(rng.standard_normal((K, n)))
    return B, C, D


def scipy_gradient(w, B, C, D, g):
    """The gradient of ``w`` by scipy and numpy: A stores B's positions."""
    if w == "B":
        rows = np.repeat(np.arange(B.shape[0]), np.diff(B.indptr))
        return g * np.einsum("ek,ke->e", C[rows], D[:, B.indices])
    GB = sp.csr_matrix((g * B.data, B.indices, B.indptr), shape=B.shape)
    return GB @ D.T if w == "C" else (GB.T @ C).T


def plans(Bt, C, grad, repeat: int, d_format: str) -> None:
    """grad_D's default kernel against the earlier plans, CPU-time medians, interleaved."""
    formats = {"grad_A": "csr", "B": "csr", "grad_D": d_format}
    par = "; parallelize(k,CPUThread,NoRaces)" if num_threads() > 1 else ""
    kernels = {"default": ucf.compile(GRAD_D, formats)}
    for name, schedule in EARLIER.items():
        extra = par if name.startswith("k") else ""
        kernels[name] = ucf.compile(GRAD_D, formats, schedule=schedule + extra)
    cpu: dict[str, list[float]] = {name: [] for name in kernels}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        for k in kernels.values():
            k(grad_A=grad, B=Bt, C=C)
        for _ in range(max(repeat, 3)):
            for name, k in kernels.items():
                t = time.process_time()
                k(grad_A=grad, B=Bt, C=C)
                cpu[name].append(time.process_time() - t)
    mine = statistics.median(cpu["default"])
    print(f"grad_D plans, CPU time: default {mine * 1e3:.2f} ms", end="")
    for name in EARLIER:
        t = statistics.median(cpu[name])
        print(
            f"; {name}{' parallel' if par and name.startswith('k') else ''} {t * 1e3:.2f} ms "
            f"({t / mine:.2f}x)",
            end="",
        )
    print()
    print("  " + kernels["default"].cin.splitlines()[1].strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--nnz-row", type=int, default=10)
    parser.add_argument("--K", type=int, default=8)
    parser.add_argument("--D-format", default="UU:1,0", help="D's declared format (UU:1,0)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--plans", action="store_true", help="grad_D's default against its earlier plans"
    )
    args = parser.parse_args()
    if args.threads:
        ucf.set_num_threads(args.threads)
    n = args.rows
    B, C, D = operands(n, args.nnz_row, args.K)
    Bt = ucf.from_scipy(B)
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr", "D": args.D_format})
    A = k(B=Bt, C=C, D=D)
    g = np.random.default_rng(1).standard_normal(len(A.vals))
    grad = ucf.Tensor(A.shape, A.format, A.levels, g)
    ops = {"B": Bt, "C": C, "D": D}
    back = ucf.gradients(k)
    print(f"ucf {ucf.__file__}; {n} x {n}, {len(A.vals)} entries, K = {args.K}")
    results = {}
    for w in "BCD":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ucf.ConversionWarning)
                tracemalloc.start()
                got = back(w, grad, ops)  # the first call compiles
                tracemalloc.reset_peak()
                got = back(w, grad, ops)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                ours, theirs = [], []
                for _ in range(args.repeat):
                    back(w, grad, ops)  # untimed: see ``--repeat``
                    t = time.perf_counter()
                    back(w, grad, ops)
                    ours.append(time.perf_counter() - t)
                    scipy_gradient(w, B, C, D, g)
                    t = time.perf_counter()
                    want = scipy_gradient(w, B, C, D, g)
                    theirs.append(time.perf_counter() - t)
        except (ucf.UcfError, MemoryError) as e:
            tracemalloc.stop()
            print(f"grad_{w}: FAILED {type(e).__name__}: {e}")
            results[w] = None
            continue
        value = got.vals if w == "B" else np.asarray(got)
        err = float(np.max(np.abs(value - want))) if value.size else 0.0
        ours_ms, theirs_ms = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
        results[w] = (peak, ours_ms, theirs_ms, err)
        print(
            f"grad_{w}: {ours_ms:8.2f} ms (scipy {theirs_ms:8.2f} ms, {ours_ms / theirs_ms:.2f}x), "
            f"peak allocated {peak / 2**20:8.1f} MiB, max |error| {err:.1e}"
        )
    if args.plans:
        plans(Bt, C, grad, args.repeat, args.D_format)
    # The forward call with D Fortran-ordered: the default's convert(D) reads it in place.
    k(B=Bt, C=C, D=D)
    tracemalloc.start()
    k(B=Bt, C=C, D=D)
    forward_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    beyond = forward_peak - sum(a.nbytes for a in A.arrays)  # A's own arrays aside
    print(
        f"forward, D Fortran-ordered: allocated {beyond / 2**20:.2f} MiB beyond A's arrays "
        f"at its peak (D holds {D.nbytes / 2**20:.2f} MiB)"
    )
    print("\ntarget rows:")
    nnz = len(A.vals)
    fits = "met" if beyond < D.nbytes else "NOT met"
    print(f"  forward makes no copy of a Fortran-ordered D (allocates < D's size): {fits}")
    for w, r in results.items():
        if r is None:
            print(f"  grad_{w} runs at {n} rows: NOT met")
            continue
        peak, ours_ms, theirs_ms, err = r
        rows = [
            (f"grad_{w} matches scipy (|error| < 1e-9)", err < 1e-9),
            (f"grad_{w} peak <= {BYTES_PER_ENTRY} B per entry of A", peak <= BYTES_PER_ENTRY * nnz),
            (f"grad_{w} <= {SCIPY_RATIO} x scipy's", ours_ms <= SCIPY_RATIO * theirs_ms),
        ]
        for what, ok in rows:
            print(f"  {what}: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
