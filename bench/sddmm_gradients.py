"""The gradients of a sampled product (SDDMM) with a sparse output, against scipy.

Run from the repository root, one size per process so that ``/usr/bin/time -v``
reports that size's peak memory:

    /usr/bin/time -v python bench/sddmm_gradients.py --rows 10000
    python bench/sddmm_gradients.py --rows 100000 --plans

``A(i,j) = B(i,j) * C(i,k) * D(k,j)`` with B and A in CSR (``--nnz-row`` entries a
row at random columns), C row-major, float64. Each row of the sweep is one K
(``--K``, 1 8 64), one layout of D (``--layouts``) and one thread count
(``--threads``, 1 2):

- ``column-major``: D Fortran-ordered, declared ``UU:1,0``, so its gradient comes back
  column-major, each stored entry of A adding K contiguous values;
- ``row-major``: D C-ordered, declared ``UU`` (the default), its gradient row-major
  (written column-major and copied, ``ucf.autodiff.backward.scattered_last``);
- ``declared-UU``: D Fortran-ordered but declared ``UU``: read in place all the same,
  its gradient row-major.

The output's gradient is a tensor on A's index arrays with random values;
``ucf.gradients`` computes those of B (on B's pattern), C and D, each checked against
scipy (``grad_C = (G∘B) Dᵀ``, ``grad_D = ((G∘B)ᵀ C)ᵀ``, ``grad_B = G∘(C D)`` at B's
entries) and timed, medians of ``--repeat`` calls interleaved with scipy's of the same
gradient, each timed call after an untimed one of the same contender, so that none is
timed on the allocator state the other left (grad_D with D row-major, one thread, load
6: 8.5 ms wall right after scipy's call, 4.9 after its own, in the same CPU time;
scipy's 7.7 and 4.6 likewise). Both clocks are printed: on one thread the target reads
process CPU time (steadier on a loaded machine), on two the wall time (CPU time adds
both threads' and cannot show a parallel gain). Before the gradient of a sparse output
was read sparse, the kernels read it as a dense rows × rows array: 800 MB at 10k rows,
a FormatError (its position count does not fit int32) at 100k; a failure is printed,
not raised. Then one forward call's peak allocation per layout: a Fortran-ordered D is
read in place where the kernel reads it column-major. The target rows print met or NOT
met. ``--plans`` adds, for each gradient, ucf's hand schedules of the same derived
statement (its loop orders with i above j, the innermost k bounded, the outer loop
parallel on two threads where no race follows), CPU-time medians interleaved with the
default's, and the target that the default is within 1.15x of the best of them.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import tracemalloc
import warnings

import numpy as np
import scipy.sparse as sp

import ucf
from ucf.autodiff.backward import Backward

SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
#: The gradients' output variables: a hand schedule's outer loop runs in parallel
#: without races only over one of them.
OUTPUTS = {"B": "ij", "C": "ik", "D": "kj"}
#: D's layouts: whether the array is Fortran-ordered, and the format it is declared in.
LAYOUTS = {
    "column-major": (True, "UU:1,0"),
    "row-major": (False, "UU"),
    "declared-UU": (True, "UU"),
}
#: Targets: every gradient allocates at most this many bytes per stored entry of A
#: (the dense gradient of A alone would be rows² * 8), takes at most this many times
#: scipy's (which forms G∘B and multiplies), and the default at most DEFAULT_RATIO
#: times the best hand schedule's.
BYTES_PER_ENTRY = 64
SCIPY_RATIO = 1.5
DEFAULT_RATIO = 1.15


def operands(n: int, per_row: int, K: int, seed: int = 0, fortran: bool = True):
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), per_row)
    cols = rng.integers(0, n, n * per_row)
    B = sp.csr_matrix((rng.standard_normal(n * per_row), (rows, cols)), shape=(n, n))
    B.sum_duplicates()
    B.sort_indices()
    C = rng.standard_normal((n, K))
    D = rng.standard_normal((K, n))
    return B, C, np.asfortranarray(D) if fortran else D


def scipy_gradient(w, B, C, D, g):
    """The gradient of ``w`` by scipy and numpy: A stores B's positions."""
    if w == "B":
        rows = np.repeat(np.arange(B.shape[0]), np.diff(B.indptr))
        return g * np.einsum("ek,ke->e", C[rows], D[:, B.indices])
    GB = sp.csr_matrix((g * B.data, B.indices, B.indptr), shape=B.shape)
    return GB @ D.T if w == "C" else (GB.T @ C).T


def hand_schedules(w: str, K: int, threads: int) -> list[str]:
    """ucf's hand schedules of ``w``'s derived statement: each loop order with i above j
    (A's and B's CSR rows), the innermost k bounded to K, and on two or more threads
    the outer loop parallel where it is an output variable (no two threads add into
    one entry)."""
    found = []
    for order in ("i,j,k", "i,k,j", "k,i,j"):
        plain = f"reorder({order})"
        kinds = [plain] + ([f"{plain}; bound(k,kb,{K},MaxExact)"] if order.endswith("k") else [])
        found += kinds
        outer = order[0]
        if threads > 1 and outer in OUTPUTS[w]:
            found += [f"{s}; parallelize({outer},CPUThread,NoRaces)" for s in kinds]
    return found


def timed(calls: dict, repeat: int) -> dict[str, tuple[float, float]]:
    """Each callable's (wall, CPU) medians over ``repeat`` rounds, interleaved, each timed
    call after an untimed one of the same contender."""
    got: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in calls}
    for _ in range(repeat):
        for name, f in calls.items():
            f()
            t, c = time.perf_counter(), time.process_time()
            f()
            got[name][1].append(time.process_time() - c)
            got[name][0].append(time.perf_counter() - t)
    return {n: (statistics.median(w), statistics.median(c)) for n, (w, c) in got.items()}


def sweep_row(n, per_row, K, layout, threads, repeat, plans) -> list[tuple[str, bool]]:
    """One K, layout and thread count: each gradient against scipy (and the hand
    schedules with ``plans``); the target rows it decides."""
    ucf.set_num_threads(threads)
    fortran, fmt = LAYOUTS[layout]
    B, C, D = operands(n, per_row, K, fortran=fortran)
    Bt = ucf.from_scipy(B)
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr", "D": fmt})
    A = k(B=Bt, C=C, D=D)
    g = np.random.default_rng(1).standard_normal(len(A.vals))
    grad = ucf.Tensor(A.shape, A.format, A.levels, g)
    ops = {"B": Bt, "C": C, "D": D}
    back = ucf.gradients(k)
    nnz, where = len(A.vals), f"K = {K}, D {layout}, {threads} thread{'s' * (threads > 1)}"
    print(f"\n{where}: {n} x {n}, {nnz} entries")
    clock, at = (1, "CPU") if threads == 1 else (0, "wall")
    targets = []
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
                want = scipy_gradient(w, B, C, D, g)
                calls = {"ucf": lambda w=w: back(w, grad, ops)}
                calls["scipy"] = lambda w=w: scipy_gradient(w, B, C, D, g)
                hands = {}
                if plans:
                    fmts = k.parsed_formats
                    for s in hand_schedules(w, K, threads):
                        b = Backward(k.statement, fmts, schedules={w: s}, target=k.target)
                        try:
                            v = b(w, grad, ops)
                        except ucf.UcfError:  # refused: that order cannot walk the operands
                            continue
                        if np.allclose(v.vals if w == "B" else np.asarray(v), want):
                            hands[s] = b
                    calls.update({s: lambda w=w, b=b: b(w, grad, ops) for s, b in hands.items()})
                times = timed(calls, repeat)
        except (ucf.UcfError, MemoryError) as e:
            tracemalloc.stop()
            print(f"grad_{w}: FAILED {type(e).__name__}: {e}")
            targets.append((f"grad_{w} runs ({where})", False))
            continue
        value = got.vals if w == "B" else np.asarray(got)
        err = float(np.max(np.abs(value - want))) if value.size else 0.0
        (uw, uc), (sw, sc) = times["ucf"], times["scipy"]
        print(
            f"grad_{w}: wall {uw * 1e3:8.3f} ms (scipy {sw * 1e3:8.3f}, {uw / sw:.2f}x), "
            f"CPU {uc * 1e3:8.3f} ms (scipy {sc * 1e3:8.3f}, {uc / sc:.2f}x), "
            f"peak allocated {peak / 2**20:6.1f} MiB, max |error| {err:.1e}"
        )
        mine, theirs = times["ucf"][clock], times["scipy"][clock]
        targets += [
            (f"grad_{w} matches scipy (|error| < 1e-9), {where}", err < 1e-9),
            (
                f"grad_{w} peak <= {BYTES_PER_ENTRY} B per entry of A, {where}",
                peak <= BYTES_PER_ENTRY * nnz,
            ),
            (
                f"grad_{w} <= {SCIPY_RATIO} x scipy's ({at}: {mine / theirs:.2f}x), {where}",
                mine <= SCIPY_RATIO * theirs,
            ),
        ]
        if hands:
            best = min(hands, key=lambda s: times[s][1])
            ratio = times["ucf"][1] / times[best][1]
            print(f"  hand schedules, CPU time (default {times['ucf'][1] * 1e3:.3f} ms):")
            for s in hands:
                print(f"    {times[s][1] * 1e3:8.3f} ms  {s}")
            targets.append(
                (
                    f"grad_{w} default <= {DEFAULT_RATIO} x the best hand schedule "
                    f"({ratio:.2f}x {best}), {where}",
                    ratio <= DEFAULT_RATIO,
                )
            )
    # The forward call: the default's convert(D) reads a Fortran-ordered D in place.
    k(B=Bt, C=C, D=D)
    tracemalloc.start()
    k(B=Bt, C=C, D=D)
    beyond = tracemalloc.get_traced_memory()[1] - sum(a.nbytes for a in A.arrays)
    tracemalloc.stop()
    if fortran:
        print(
            f"forward: allocated {beyond / 2**20:.2f} MiB beyond A's arrays at its peak "
            f"(D holds {D.nbytes / 2**20:.2f} MiB)"
        )
        targets.append(
            (f"forward makes no copy of a Fortran-ordered D, {where}", beyond < D.nbytes)
        )
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--nnz-row", type=int, default=10)
    parser.add_argument("--K", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--plans", action="store_true", help="each gradient's default against hand schedules"
    )
    args = parser.parse_args()
    print(f"ucf {ucf.__file__}")
    targets = []
    for K, layout, threads in itertools.product(args.K, args.layouts, args.threads):
        targets += sweep_row(args.rows, args.nnz_row, K, layout, threads, args.repeat, args.plans)
    print("\ntarget rows:")
    for what, ok in targets:
        print(f"  {what}: {'met' if ok else 'NOT met'}")
    missed = sum(not ok for _, ok in targets)
    print(f"{len(targets) - missed} of {len(targets)} met")


if __name__ == "__main__":
    main()
