"""Sparse convolution benchmark: ucf against oneDNN (torch) and a hash-map submanifold baseline.

Run from the repository root:

    python bench/conv.py                        # everything (a few minutes)
    python bench/conv.py --quick                # 3 layers, 91 % sparsity, small cloud: seconds
    python bench/conv.py --layers C11,C17 --sparsity 91,98,M91
    python bench/conv.py --only filter          # or --only submanifold

Part 1, filter-sparse convolution.  The 23 distinct convolution shapes of
ResNet-50 (torchvision's v1.5, stride on the 3x3 convolutions), batch 1,
float32, NCHW, numbered C1..C23 in network order (``LAYERS``).  The UCF
paper's Table 3 lists 25 "unique" layers; its text was not available
here, so its numbering may differ (its C10, H 28, 3x3, 128 -> 128, stride
1, is C11 here).  Filters are random normal weights, magnitude-pruned:

- ``80``, ``91``, ``96``, ``98``: unstructured, that fraction of the
  smallest-|w| weights set to zero.
- ``M80``/``M91``, ``MC80``/``MC91``, ``RS80``/``RS91``: structured.  An
  "X-structured" pattern prunes whole blocks that span the dimensions X
  at fixed values of the others (the reading of the UCF artefact's filter
  formats, which name the dense block dimensions).  Blocks are ranked by
  L2 norm and the smallest ``round(s * blocks)`` are removed:
  - M: blocks F[:, c, r, s], a vector over all output channels, so every
    output channel keeps the same (c, r, s) positions;
  - MC: blocks F[:, :, r, s], whole taps (9 blocks for 3x3, so 80 % and
    91 % remove 7 and 8 taps, 78 % and 89 %); not defined for 1x1 layers,
    which are skipped;
  - RS: blocks F[m, c, :, :], whole R x S kernels (for 1x1 layers the
    same as unstructured).
  (Another reading of "M-structured", pruning whole output filters
  F[m, :, :, :], only shrinks M and is not measured.)
  The achieved sparsity is recorded with each row.

oneDNN is ``torch.nn.functional.conv2d`` on CPU (torch is imported lazily;
without it part 1 is skipped).  ucf tries these variants, each built from
the same pruned filter and checked against torch's output before any
timing (a wrong variant is reported and never timed):

- ``direct``: ``O(n,m,p,q) = I(n,c,S*p+r-P,S*q+s-P) * F(m,c,r,s)`` (S the
  stride, P the padding) with F ``UCCC`` (M_U C_C R_C S_C), loop order
  ``n,m,c,r,s,p,q``, output channels in parallel.  Input and output are
  the plain NCHW arrays.
- ``flat`` (stride 1): the input is copied into a zero-padded buffer whose
  rows are Wp = W + 2P wide, flattened per channel, and the output is
  computed on the same row pitch, so one index x = p*Wp + q covers a whole
  plane: ``O(n,m,x) = P(n,c,x+Wp*r+s) * F(m,c,r,s)``, F ``UCCC``, loop
  order ``n,m,c,r,s,x``.  The inner loop has no bounds and runs over the
  whole plane (the 2P extra columns per row are computed and dropped).
- ``offset``: the same padded layout with the channels concatenated (and,
  for stride 2, split into its 4 polyphase components, so that stride 2
  becomes stride 1 on each), and the filter stored as a CSR matrix G(m, k)
  whose column k is the offset of the weight's input element in that
  buffer: ``O(n,m,x) = P(n,x+k) * G(m,k)``, loop order ``n,m,k,x``.  This
  is ``flat`` with the three compressed levels linearized into one.
- ``offset-dyn``: ``offset`` with ``split(m,m0,m1,4)``, so output channels
  are handed out four at a time (dynamic OpenMP schedule).
- ``offset-m``, ``offset-m-bound`` (M and MC patterns): under these
  patterns every stored offset keeps all M output channels, so the
  transposed matrix H(k, m) = G(m, k) is stored as compressed rows k over
  a dense m level (``CU``): ``O(n,x,m) = P(n,x+k) * H(k,m)``, loop order
  ``n,x,k,m``, output pixels in parallel.  The inner loop runs over
  contiguous output channels; the (x, m) result is transposed to NCHW in
  the timed call.  ``-bound`` adds ``bound(m,mb,M,MaxExact)``, making M a
  compile-time constant.
- ``taps`` (MC patterns only): F stored R_C S_C M_U C_U
  (``CCUU:2,3,0,1``), loop order ``n,r,s,m,c,p,q``.

The copies into the padded buffer and out of it (to a contiguous NCHW
array) are part of every timed ucf call; filters are converted once,
outside the timing; ucf writes into a reused output (``out=``).  A short
pilot (``--pilot`` interleaved runs) picks the fastest variant per layer
and pattern, then ucf's pick and torch are timed head to head.  The
summary is the geometric mean of torch time / ucf time over the stride-1
3x3 layers (C3, C11, C17, C23); targets: >= 1.0 at 91 % and >= 2.0 at
98 % unstructured sparsity.

Part 2, submanifold 3-D convolution.  A synthetic LiDAR frame: a 64-beam
spinning sensor (elevations -24.9 to +2 degrees, 4096 azimuths) ray-cast
against a ground plane and random boxes (cars, poles, buildings), points
voxelized at 0.1 m in an 80 m x 80 m x 6 m grid (800 x 800 x 60; about
59k active voxels).  C = M = 64, 3x3x3 filter, float32.  ucf runs

    O(n,x,y,z,m) = Mask(n,x,y,z) * I(n,x+r-1,y+s-1,z+t-1,c) * F(r,s,t,c,m)

with Mask ``UUUC``, I and O ``UUUCU`` (the output takes the mask's
pattern), F dense (``direct`` schedules), and as a map-based pipeline
(``map`` schedules): a ucf kernel finds the neighbours,

    Nb(n,x,y,z,r,s,t) = Mask(n,x,y,z) * Idx(n,x+r-1,y+s-1,z+t-1)

(Idx holds 1 + each voxel's number; Nb takes the mask's pattern with a
dense 27-entry block), numpy turns Nb's values into the coordinates of a
0/1 tensor N(i,k,j) (``UUC`` by output voxel, or ``UCC:1,0,2`` by tap),
and a ucf gather-GEMM computes ``O(i,m) = N(i,k,j) * X(j,c) * W(k,c,m)``
(schedules with and without ``bound`` on c and m, serial and parallel:
see ``subm_schedules``).  Both ucf pipelines search for
neighbours in every call.  The baseline is spconv's ``SubMConv3d`` when
spconv imports, else a numpy hash-map implementation
(``numpy_submanifold``): voxel keys linearized and sorted once, then per
call, for each of the 27 taps, ``np.searchsorted`` finds the neighbours
and a gather-GEMM (BLAS through ``@``, ``OPENBLAS_NUM_THREADS`` set from
``--threads``) adds their contribution.  Target: ucf faster than the
baseline.  For information the gather-GEMM alone (neighbour map reused,
as across the layers of a network) is timed for numpy, ucf and torch
(``index_select``/``mm``/``index_add_``).  All results are compared with
numpy's, which is spot-checked at 256 voxels against a dictionary-based
reference.

Times are medians of ``--repeat`` interleaved runs after one warm-up
(``time.perf_counter``), 2 threads for ucf and torch (``--threads``).
Results go to ``bench/results/conv.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _threads_from_argv(argv: list[str]) -> str:
    """--threads before numpy loads: OpenBLAS (the numpy baseline's GEMM) reads it at import."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "2"


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads_from_argv(sys.argv[1:]))

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.sparse as sp  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import parallel as par  # noqa: E402

import ucf  # noqa: E402

med = par.med
RowError = par.RowError

# --------------------------------------------------------------------------- layers


@dataclass(frozen=True)
class Layer:
    name: str
    h: int  # input height = width
    c: int  # input channels
    m: int  # output channels
    r: int  # kernel height = width
    stride: int
    where: str  # the torchvision module(s) with this shape

    @property
    def pad(self) -> int:
        return self.r // 2

    @property
    def out_h(self) -> int:
        return (self.h + 2 * self.pad - self.r) // self.stride + 1

    @property
    def shape(self) -> str:
        s = f"{self.h}x{self.h} {self.c}->{self.m} {self.r}x{self.r}"
        return s + (f" s{self.stride}" if self.stride > 1 else "")

    @property
    def dense_flops(self) -> int:
        return 2 * self.m * self.c * self.r * self.r * self.out_h**2


LAYERS = [
    Layer("C1", 224, 3, 64, 7, 2, "conv1"),
    Layer("C2", 56, 64, 64, 1, 1, "layer1.0.conv1"),
    Layer("C3", 56, 64, 64, 3, 1, "layer1.*.conv2"),
    Layer("C4", 56, 64, 256, 1, 1, "layer1.*.conv3, layer1.0.downsample"),
    Layer("C5", 56, 256, 64, 1, 1, "layer1.1-2.conv1"),
    Layer("C6", 56, 256, 128, 1, 1, "layer2.0.conv1"),
    Layer("C7", 56, 128, 128, 3, 2, "layer2.0.conv2"),
    Layer("C8", 28, 128, 512, 1, 1, "layer2.*.conv3"),
    Layer("C9", 56, 256, 512, 1, 2, "layer2.0.downsample"),
    Layer("C10", 28, 512, 128, 1, 1, "layer2.1-3.conv1"),
    Layer("C11", 28, 128, 128, 3, 1, "layer2.1-3.conv2"),
    Layer("C12", 28, 512, 256, 1, 1, "layer3.0.conv1"),
    Layer("C13", 28, 256, 256, 3, 2, "layer3.0.conv2"),
    Layer("C14", 14, 256, 1024, 1, 1, "layer3.*.conv3"),
    Layer("C15", 28, 512, 1024, 1, 2, "layer3.0.downsample"),
    Layer("C16", 14, 1024, 256, 1, 1, "layer3.1-5.conv1"),
    Layer("C17", 14, 256, 256, 3, 1, "layer3.1-5.conv2"),
    Layer("C18", 14, 1024, 512, 1, 1, "layer4.0.conv1"),
    Layer("C19", 14, 512, 512, 3, 2, "layer4.0.conv2"),
    Layer("C20", 7, 512, 2048, 1, 1, "layer4.*.conv3"),
    Layer("C21", 14, 1024, 2048, 1, 2, "layer4.0.downsample"),
    Layer("C22", 7, 2048, 512, 1, 1, "layer4.1-2.conv1"),
    Layer("C23", 7, 512, 512, 3, 1, "layer4.1-2.conv2"),
]
BY_NAME = {layer.name: layer for layer in LAYERS}
SUMMARY_LAYERS = [x.name for x in LAYERS if x.r == 3 and x.stride == 1]  # C3, C11, C17, C23

# label -> (structure, target sparsity); structure "" is unstructured.
PATTERNS = {
    "80": ("", 0.80),
    "91": ("", 0.91),
    "96": ("", 0.96),
    "98": ("", 0.98),
    "M80": ("M", 0.80),
    "M91": ("M", 0.91),
    "MC80": ("MC", 0.80),
    "MC91": ("MC", 0.91),
    "RS80": ("RS", 0.80),
    "RS91": ("RS", 0.91),
}
TARGETS = {"91": 1.0, "98": 2.0}  # geometric-mean speedup over oneDNN, SUMMARY_LAYERS
# The same for the direct statement with no schedule given (issue 17): what a user gets.
NO_SCHEDULE_TARGETS = {"91": 1.0, "98": 2.5}
QUICK_LAYERS = ["C3", "C11", "C13"]
QUICK_PATTERNS = ["91"]


def applicable(layer: Layer, label: str) -> bool:
    return not (PATTERNS[label][0] == "MC" and layer.r == 1)


def prune(f: np.ndarray, label: str) -> np.ndarray:
    """Magnitude pruning of F(m,c,r,s) by ``label`` (see the module docstring)."""
    structure, s = PATTERNS[label]
    # The axes a block spans; the block norm is taken over them.
    span = {"": (), "M": (0,), "MC": (0, 1), "RS": (2, 3)}[structure]
    norms = np.sqrt(np.sum(f.astype(np.float64) ** 2, axis=span, keepdims=True)) if span else f
    flat = np.abs(norms).reshape(-1)
    k = int(round(s * flat.size))
    keep = np.ones(flat.size, bool)
    keep[np.argsort(flat, kind="stable")[:k]] = False
    return f * keep.reshape(np.shape(norms))


# --------------------------------------------------------------------------- layouts


class Flat:
    """The zero-padded, flattened input buffer of the ``flat`` and ``offset`` variants.

    Stride ``st`` is removed by a polyphase split: phase (a, b) holds the
    padded input at rows a, a+st, ... and columns b, b+st, ..., so tap
    (r, s) of output (p, q) reads phase (r % st, s % st) at row p + r//st,
    column q + s//st.  Each (phase, channel) plane has ``wq`` columns and
    ``plane`` elements (rows times ``wq`` plus slack for the last row's
    taps); the output is computed for x = p*wq + q over ``out_h`` rows of
    ``wq`` columns, of which the first ``out_h`` are kept.
    """

    def __init__(self, layer: Layer):
        st, pad, r = layer.stride, layer.pad, layer.r
        self.layer = layer
        hp = -(-(layer.h + 2 * pad) // st) * st  # padded size, rounded up to the stride
        self.hq = self.wq = hp // st
        self.phases = sorted({(a % st, b % st) for a in range(r) for b in range(r)})
        self.plane = self.hq * self.wq + (r - 1) // st
        self.n_out = layer.out_h * self.wq
        assert layer.out_h + (r - 1) // st <= self.hq  # every tap of every row stays in its plane
        self.buf = np.zeros((len(self.phases), layer.c, self.plane), np.float32)
        # Where each phase's valid input goes: (plane rows/cols start, input start), per axis.
        self.copies = []
        for k, (a, b) in enumerate(self.phases):
            i0, y0 = self._first(a, pad, st)
            j0, x0 = self._first(b, pad, st)
            n_y = len(range(y0, layer.h, st))
            n_x = len(range(x0, layer.h, st))
            self.copies.append((k, i0, y0, n_y, j0, x0, n_x))

    @staticmethod
    def _first(a: int, pad: int, st: int) -> tuple[int, int]:
        """First plane index i with input coordinate st*i + a - pad >= 0, and that coordinate."""
        i = max(0, -(-(pad - a) // st))
        return i, st * i + a - pad

    def fill(self, x: np.ndarray) -> None:
        """Copy x (1, C, H, W) into the planes; the padding stays zero from construction."""
        st = self.layer.stride
        planes = self.buf[:, :, : self.hq * self.wq].reshape(
            len(self.phases), self.layer.c, self.hq, self.wq
        )
        for k, i0, y0, n_y, j0, x0, n_x in self.copies:
            planes[k, :, i0 : i0 + n_y, j0 : j0 + n_x] = x[0, :, y0::st, x0::st]

    def offsets(self, c: np.ndarray, r: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Offset of input element (c, tap r, s) relative to output x in the whole buffer."""
        st = self.layer.stride
        phase = {ab: k for k, ab in enumerate(self.phases)}
        ph = np.array([phase[(a, b)] for a, b in zip(r % st, s % st, strict=True)], np.int64)
        return (ph * self.layer.c + c) * self.plane + (r // st) * self.wq + s // st

    def output(self, o: np.ndarray) -> np.ndarray:
        """The NCHW result (contiguous copy) from the (1, M, out_h * wq) kernel output."""
        oh = self.layer.out_h
        return np.ascontiguousarray(o.reshape(1, -1, oh, self.wq)[:, :, :, :oh])


# --------------------------------------------------------------------------- ucf variants

PAR_M = "parallelize(m,CPUThread,NoRaces)"
OFFSET = "O(n,m,x) = P(n,x+k) * G(m,k)"
SCHEDULES = {
    "direct": "reorder(n,m,c,r,s,p,q); " + PAR_M,
    "flat": "reorder(n,m,c,r,s,x); " + PAR_M,
    "offset": "reorder(n,m,k,x); " + PAR_M,
    "offset-dyn": "reorder(n,m,k,x); split(m,m0,m1,4); parallelize(m0,CPUThread,NoRaces)",
    "taps": "reorder(n,r,s,m,c,p,q); " + PAR_M,
    "offset-m": "reorder(n,x,k,m); parallelize(x,CPUThread,NoRaces)",
    "offset-m-bound": (
        "reorder(n,x,k,m); bound(m,mb,{m},MaxExact); parallelize(x,CPUThread,NoRaces)"
    ),
}
OFFSET_M = "O(n,x,m) = P(n,x+k) * H(k,m)"
_KERNELS: dict[tuple, ucf.Kernel] = {}


def kernel(expr: str, formats: dict[str, str], schedule: str | None, target: str) -> ucf.Kernel:
    """Compile once per process (ucf has a disk cache, but no in-memory one)."""
    key = (expr, tuple(sorted(formats.items())), schedule, target)
    if key not in _KERNELS:
        _KERNELS[key] = ucf.compile(
            expr, formats=formats, schedule=schedule, target=target, dtype="float32"
        )
    return _KERNELS[key]


def _affine(var: str, tap: str, stride: int, pad: int) -> str:
    s = f"{stride}*{var}+{tap}" if stride > 1 else f"{var}+{tap}"
    return f"{s}-{pad}" if pad else s


def direct_expr(layer: Layer) -> str:
    st, pad = layer.stride, layer.pad
    return (
        f"O(n,m,p,q) = I(n,c,{_affine('p', 'r', st, pad)},{_affine('q', 's', st, pad)}) "
        "* F(m,c,r,s)"
    )


def ucf_variants(
    layer: Layer, label: str, x: np.ndarray, f: np.ndarray, target: str
) -> tuple[dict[str, Callable[[], np.ndarray]], dict[str, str], dict[str, str]]:
    """label -> zero-argument callable returning the NCHW result; refusals; the statements."""
    oh, m = layer.out_h, layer.m
    built: dict[str, Callable[[], np.ndarray]] = {}
    refused: dict[str, str] = {}
    exprs: dict[str, str] = {}

    def attempt(name: str, make: Callable[[], Callable[[], np.ndarray]], expr: str) -> None:
        exprs[name] = expr
        try:
            built[name] = make()
        except ucf.UcfError as e:
            refused[name] = f"{type(e).__name__}: {e}"

    out4 = np.empty((1, m, oh, oh), np.float32)

    def direct() -> Callable[[], np.ndarray]:
        k = kernel(direct_expr(layer), {"F": "UCCC"}, SCHEDULES["direct"], target)
        ft = ucf.from_numpy(f, "UCCC")
        return lambda: k(I=x, F=ft, out=out4).vals.reshape(out4.shape)

    attempt("direct", direct, direct_expr(layer))

    flat = Flat(layer)
    out_flat = np.empty((1, m, flat.n_out), np.float32)
    flat_expr = f"O(n,m,x) = P(n,c,x+{flat.wq}*r+s) * F(m,c,r,s)"
    if layer.stride == 1:

        def flat_variant() -> Callable[[], np.ndarray]:
            k = kernel(flat_expr, {"F": "UCCC"}, SCHEDULES["flat"], target)
            ft = ucf.from_numpy(f, "UCCC")
            p = flat.buf.reshape(1, layer.c, flat.plane)

            def run() -> np.ndarray:
                flat.fill(x)
                k(P=p, F=ft, out=out_flat)
                return flat.output(out_flat)

            return run

        attempt("flat", flat_variant, flat_expr)

    mm, cc, rr, ss = np.nonzero(f)
    offs = flat.offsets(cc, rr, ss)
    n_buf = flat.buf.size
    g = sp.csr_matrix(
        (f[mm, cc, rr, ss], (mm, offs)), shape=(m, n_buf - flat.n_out + 1), dtype=np.float32
    )
    g.sort_indices()
    gt = ucf.from_scipy(g, format="csr")
    p_all = flat.buf.reshape(1, n_buf)
    for name in ("offset", "offset-dyn"):

        def offset_variant(name: str = name) -> Callable[[], np.ndarray]:
            k = kernel(OFFSET, {"G": "UC"}, SCHEDULES[name], target)

            def run() -> np.ndarray:
                flat.fill(x)
                k(P=p_all, G=gt, out=out_flat)
                return flat.output(out_flat)

            return run

        attempt(name, offset_variant, OFFSET)

    if PATTERNS[label][0] in ("M", "MC"):
        # Every stored offset k has all M output channels: H(k, m) = G(m, k) transposed, stored
        # as compressed rows k with a dense m level, and m innermost (the output is (x, m)).
        rows, inverse = np.unique(offs, return_inverse=True)
        dense_rows = np.zeros((len(rows), m), np.float32)
        dense_rows[inverse, mm] = f[mm, cc, rr, ss]
        levels = [{"pos": np.array([0, len(rows)], np.int32), "crd": rows.astype(np.int32)}, {}]
        ht = ucf.Tensor((g.shape[1], m), "CU", levels, dense_rows.reshape(-1))
        out_xm = np.empty((1, flat.n_out, m), np.float32)
        ow = layer.out_h

        for name in ("offset-m", "offset-m-bound"):

            def offset_m(name: str = name) -> Callable[[], np.ndarray]:
                k = kernel(OFFSET_M, {"H": "CU"}, SCHEDULES[name].format(m=m), target)

                def run() -> np.ndarray:
                    flat.fill(x)
                    k(P=p_all, H=ht, out=out_xm)
                    o = out_xm.reshape(oh, flat.wq, m)[:, :ow]
                    return np.ascontiguousarray(o.transpose(2, 0, 1))[None]

                return run

            attempt(name, offset_m, OFFSET_M)

    if PATTERNS[label][0] == "MC":

        def taps() -> Callable[[], np.ndarray]:
            fmt = "CCUU:2,3,0,1"
            k = kernel(direct_expr(layer), {"F": fmt}, SCHEDULES["taps"], target)
            ft = ucf.from_numpy(f, fmt)
            return lambda: k(I=x, F=ft, out=out4).vals.reshape(out4.shape)

        attempt("taps", taps, direct_expr(layer))
    return built, refused, exprs


# --------------------------------------------------------------------------- part 1


def bench_filter(
    layer: Layer, label: str, torch: Any, args: argparse.Namespace, rng: np.random.Generator
) -> dict:
    x = rng.standard_normal((1, layer.c, layer.h, layer.h)).astype(np.float32)
    f = prune(rng.standard_normal((layer.m, layer.c, layer.r, layer.r)).astype(np.float32), label)
    nnz = int(np.count_nonzero(f))
    tx, tf = torch.from_numpy(x), torch.from_numpy(f)
    st, pad = layer.stride, layer.pad

    def onednn() -> Any:
        return torch.nn.functional.conv2d(tx, tf, stride=st, padding=pad)

    with torch.no_grad():
        ref = onednn().numpy()
        variants, refused, exprs = ucf_variants(layer, label, x, f, args.target)
        if not variants:
            raise RowError("unsupported", next(iter(refused.values())))
        wrong: dict[str, float] = {}
        errs: dict[str, float] = {}
        for name, fn in list(variants.items()):
            got = fn()
            errs[name] = par.base._relerr(got, ref)
            if got.shape != ref.shape or not par.close(got, ref, "float32"):
                wrong[name] = errs[name]
                del variants[name]
        if not variants:
            raise RowError("error", f"every ucf variant is wrong: {wrong}")
        best, tuning = par.fastest(variants, args.pilot)
        contenders = {"ucf": variants[best], "torch": onednn}
        plain = no_schedule(layer, x, f, ref, args.target)
        if plain["status"] == "ok":
            contenders["no_schedule"] = plain.pop("run")
        s = par.median_of(contenders, args.repeat)
    t, tt = med(s["ucf"]), med(s["torch"])
    if "no_schedule" in s:
        plain.update(seconds=med(s["no_schedule"]), speedup=tt / med(s["no_schedule"]))
    return {
        "status": "ok",
        "nnz": nnz,
        "sparsity": 1.0 - nnz / f.size,
        "variant": best,
        "statement": exprs[best],
        "schedule": SCHEDULES[best].format(m=layer.m),
        "tuning_s": tuning,
        "refused": refused,
        "wrong": wrong,
        "max_rel_err": errs,
        "check": not wrong,
        "ucf_s": t,
        "torch_s": tt,
        "speedup": tt / t,
        "speedup_of_minima": min(s["torch"]) / min(s["ucf"]),
        "ucf_gflops_effective": layer.dense_flops / t / 1e9,
        "ucf_gflops_useful": 2 * nnz * layer.out_h**2 / t / 1e9,
        "torch_gflops": layer.dense_flops / tt / 1e9,
        "samples": s,
        "no_schedule": plain,
    }


def no_schedule(
    layer: Layer, x: np.ndarray, f: np.ndarray, ref: np.ndarray, target: str
) -> dict[str, Any]:
    """The ``direct`` statement and formats with no schedule given: what a user who writes
    only the convolution gets. Checked against oneDNN; 'run' is the timed call when right."""
    try:
        k = kernel(direct_expr(layer), {"F": "UCCC"}, None, target)
    except ucf.UcfError as e:
        return {"status": "unsupported", "message": f"{type(e).__name__}: {e}"}
    ft = ucf.from_numpy(f, "UCCC")
    out4 = np.empty(ref.shape, np.float32)

    def run() -> np.ndarray:
        return k(I=x, F=ft, out=out4).vals.reshape(out4.shape)

    got = run()
    err = par.base._relerr(got, ref)
    if not par.close(got, ref, "float32"):
        return {"status": "wrong", "message": f"max relative error {err:.1e}", "cin": k.cin}
    return {"status": "ok", "cin": k.cin, "max_rel_err": err, "run": run}


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in xs) / len(xs)) if xs else float("nan")


def summarize_filter(rows: list[dict], labels: list[str]) -> dict:
    out = {}
    for label in labels:
        sel = [
            r
            for r in rows
            if r["pattern"] == label and r["layer"] in SUMMARY_LAYERS and r.get("status") == "ok"
        ]
        g = geomean([r["speedup"] for r in sel])
        entry = {
            "layers": [r["layer"] for r in sel],
            "geomean_speedup": g,
            "geomean_speedup_of_minima": geomean([r["speedup_of_minima"] for r in sel]),
            "complete": len(sel) == len(SUMMARY_LAYERS),
            "all_layers_geomean": geomean(
                [r["speedup"] for r in rows if r["pattern"] == label and r.get("status") == "ok"]
            ),
        }
        if label in TARGETS:
            entry["target"] = TARGETS[label]
            entry["pass"] = bool(sel) and g >= TARGETS[label] and all(r["check"] for r in sel)
        plain = [r["no_schedule"] for r in sel if r["no_schedule"]["status"] == "ok"]
        entry["no_schedule_geomean_speedup"] = geomean([p["speedup"] for p in plain])
        entry["no_schedule_complete"] = len(plain) == len(SUMMARY_LAYERS)
        if label in NO_SCHEDULE_TARGETS:
            entry["no_schedule_target"] = NO_SCHEDULE_TARGETS[label]
            entry["no_schedule_pass"] = (
                len(plain) == len(sel) > 0
                and entry["no_schedule_geomean_speedup"] >= NO_SCHEDULE_TARGETS[label]
            )
        out[label] = entry
    return out


# --------------------------------------------------------------------------- part 2

SUBM = "O(n,x,y,z,m) = Mask(n,x,y,z) * I(n,x+r-1,y+s-1,z+t-1,c) * F(r,s,t,c,m)"
SUBM_FORMATS = {"O": "UUUCU", "Mask": "UUUC", "I": "UUUCU"}
NBMAP = "Nb(n,x,y,z,r,s,t) = Mask(n,x,y,z) * Idx(n,x+r-1,y+s-1,z+t-1)"
NBMAP_FORMATS = {"Nb": "UUUCUUU", "Mask": "UUUC", "Idx": "UUUC"}
GATHER_GEMM = "O(i,m) = N(i,k,j) * X(j,c) * W(k,c,m)"
GATHER_GEMM_FORMATS = {"N": "UUC"}  # per output voxel i, per tap k, the neighbour j
TAP_MAJOR_FORMATS = {"N": "UCC:1,0,2"}  # per tap k, the (output i, neighbour j) pairs
PAR_X = "parallelize(x,CPUThread,NoRaces)"


def subm_schedules(c: int, m: int) -> dict[str, tuple[str, str]]:
    """label -> (kernel kind, schedule): the direct kernel, or the gather-GEMM with N by output
    voxel ("map") or by tap ("tap-major", which keeps one tap's W(k,:,:) in cache)."""
    bound = f"bound(c,cb,{c},MaxExact); bound(m,mb,{m},MaxExact)"
    par_i = "parallelize(i,CPUThread,NoRaces)"
    taps = "reorder(k,i,j,c,m)"
    return {
        "direct, par x": ("direct", PAR_X),
        "direct, split x 8": ("direct", "split(x,x0,x1,8); parallelize(x0,CPUThread,NoRaces)"),
        "direct, par x, bound c,m": ("direct", f"{bound}; {PAR_X}"),
        "map, par i": ("map", par_i),
        "map, par i, bound c,m": ("map", f"{bound}; {par_i}"),
        "map, split i 64, bound c,m": (
            "map",
            f"{bound}; split(i,i0,i1,64); parallelize(i0,CPUThread,NoRaces)",
        ),
        "map, serial, bound c,m": ("map", bound),
        "tap-major, serial, bound c,m": ("tap-major", f"{taps}; {bound}"),
        "tap-major, par i, bound c,m": ("tap-major", f"{taps}; {bound}; {par_i}"),
    }


def voxel_tensor(coords: np.ndarray, grid: tuple, vals: np.ndarray, fmt: str) -> ucf.Tensor:
    """A (1, X, Y, Z[, C]) tensor in format UUUC[U] from sorted unique voxel coordinates."""
    cols = grid[0] * grid[1]
    counts = np.bincount(coords[:, 0] * grid[1] + coords[:, 1], minlength=cols)
    pos = np.zeros(cols + 1, np.int32)
    np.cumsum(counts, out=pos[1:])
    levels = [{}, {}, {}, {"pos": pos, "crd": coords[:, 2].astype(np.int32)}]
    shape = (1, *grid)
    if vals.ndim == 2:
        levels.append({})
        shape = (*shape, vals.shape[1])
    return ucf.Tensor(shape, fmt, levels, np.ascontiguousarray(vals).reshape(-1), check=False)


def lidar_voxels(
    rng: np.random.Generator,
    azimuths: int = 4096,
    beams: int = 64,
    voxel: float = 0.1,
    half: float = 40.0,
    top: float = 6.0,
    boxes: int = 40,
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Sorted unique voxel coordinates (V, 3) of one simulated LiDAR sweep, and the grid shape.

    The sensor sits 1.8 m above a flat ground; each ray stops at the
    nearest of the ground and the boxes (slab test), within 60 m.
    """
    height = 1.8
    elev = np.deg2rad(np.linspace(-24.9, 2.0, beams))
    az = np.linspace(0.0, 2 * np.pi, azimuths, endpoint=False)
    e, a = np.meshgrid(elev, az, indexing="ij")
    d = np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], -1).reshape(-1, 3)
    t = np.full(len(d), np.inf)
    down = d[:, 2] < 0
    t[down] = height / -d[down, 2]
    for _ in range(boxes):
        u = rng.random()
        if u < 0.6:
            size = np.array([4.5, 1.9, 1.6])  # car
        elif u < 0.8:
            size = np.array([0.6, 0.6, 1.8])  # pedestrian, pole
        else:
            size = np.array([rng.uniform(8, 20), rng.uniform(8, 20), rng.uniform(4, 8)])
        if rng.random() < 0.5:
            size[:2] = size[1::-1]
        while True:
            centre = rng.uniform(-half, half, 2)
            if np.hypot(*centre) > max(size[:2]) + 3:
                break
        lo = np.array([centre[0] - size[0] / 2, centre[1] - size[1] / 2, -height])
        hi = np.array([centre[0] + size[0] / 2, centre[1] + size[1] / 2, size[2] - height])
        with np.errstate(divide="ignore", invalid="ignore"):
            t1, t2 = lo / d, hi / d
            near = np.nanmax(np.minimum(t1, t2), axis=1)
            far = np.nanmin(np.maximum(t1, t2), axis=1)
        hit = (near <= far) & (near > 0) & (near < t)
        t[hit] = near[hit]
    ok = np.isfinite(t) & (t < 60)
    pts = d[ok] * t[ok, None] + rng.normal(0, 0.02, (int(ok.sum()), 3))
    pts[:, 2] += height
    keep = (np.abs(pts[:, 0]) < half) & (np.abs(pts[:, 1]) < half) & (pts[:, 2] >= 0)
    keep &= pts[:, 2] < top
    grid = (round(2 * half / voxel), round(2 * half / voxel), round(top / voxel))
    vox = np.floor((pts[keep] + [half, half, 0.0]) / voxel).astype(np.int64)
    vox = np.clip(vox, 0, np.array(grid) - 1)
    return np.unique(vox, axis=0), grid  # np.unique sorts rows lexicographically


OFFSETS_27 = [(r, s, t) for r in range(3) for s in range(3) for t in range(3)]


def neighbour_pairs(keys: np.ndarray, coords: np.ndarray, grid: tuple[int, int, int]) -> list:
    """Per tap (r, s, t): (output indices, input indices) of the active neighbour pairs."""
    pairs = []
    for r, s, t in OFFSETS_27:
        nc = coords + (r - 1, s - 1, t - 1)
        inside = np.all((nc >= 0) & (nc < grid), axis=1)
        nk = (nc[:, 0] * grid[1] + nc[:, 1]) * grid[2] + nc[:, 2]
        j = np.searchsorted(keys, nk).clip(0, len(keys) - 1)
        hit = inside & (keys[j] == nk)
        pairs.append((np.nonzero(hit)[0], j[hit]))
    return pairs


def numpy_submanifold(
    keys: np.ndarray, coords: np.ndarray, grid: tuple, feats: np.ndarray, w: np.ndarray, pairs=None
) -> np.ndarray:
    """The hash-map baseline: neighbour search (unless ``pairs`` is given), then gather-GEMM."""
    if pairs is None:
        pairs = neighbour_pairs(keys, coords, grid)
    out = np.zeros((len(feats), w.shape[-1]), np.float32)
    for (r, s, t), (o, i) in zip(OFFSETS_27, pairs, strict=True):
        if len(o):
            out[o] += feats[i] @ w[r, s, t]  # an output has at most one neighbour per tap
    return out


def spot_check(coords, feats, w, got: np.ndarray, n: int, rng) -> float:
    """Max relative error of ``got`` at ``n`` random voxels against a dict-based reference."""
    where = {tuple(v): k for k, v in enumerate(coords.tolist())}
    worst = 0.0
    for v in rng.choice(len(coords), size=min(n, len(coords)), replace=False):
        acc = np.zeros(w.shape[-1], np.float64)
        x, y, z = coords[v]
        for r, s, t in OFFSETS_27:
            j = where.get((x + r - 1, y + s - 1, z + t - 1))
            if j is not None:
                acc += feats[j].astype(np.float64) @ w[r, s, t]
        scale = float(np.max(np.abs(acc))) or 1.0
        worst = max(worst, float(np.max(np.abs(got[v] - acc))) / scale)
    return worst


def torch_gather_gemm(pairs: list, feats: np.ndarray, w: np.ndarray, torch: Any):
    """The same gather-GEMM-scatter with torch (index_select, mm, index_add_): for reference."""
    if torch is None:
        return None
    tf = torch.from_numpy(feats)
    tw = torch.from_numpy(np.ascontiguousarray(w.reshape(27, *w.shape[3:])))
    tp = [(torch.from_numpy(o), torch.from_numpy(i)) for o, i in pairs]

    def run() -> np.ndarray:
        out = torch.zeros((len(feats), w.shape[-1]), dtype=torch.float32)
        for k, (o, i) in enumerate(tp):
            if len(o):
                out.index_add_(0, o, torch.mm(tf.index_select(0, i), tw[k]))
        return out.numpy()

    return run


def spconv_baseline(coords, grid, feats, w, threads):
    """spconv's SubMConv3d on CPU, or None when spconv is not importable."""
    try:
        import spconv.pytorch as spconv
        import torch
    except Exception:
        return None
    torch.set_num_threads(threads)
    conv = spconv.SubMConv3d(w.shape[3], w.shape[4], 3, bias=False, indice_key="subm")
    with torch.no_grad():
        # spconv 2.x stores the weight as (out, k, k, k, in).
        conv.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.transpose(4, 0, 1, 2, 3))))
    idx = np.concatenate([np.zeros((len(coords), 1), np.int64), coords], axis=1)
    tidx = torch.from_numpy(idx.astype(np.int32))
    tfeat = torch.from_numpy(feats)

    def run() -> np.ndarray:
        with torch.no_grad():
            x = spconv.SparseConvTensor(tfeat, tidx, list(grid), 1)
            return conv(x).features.numpy()

    return run


def bench_submanifold(args: argparse.Namespace, rng: np.random.Generator, torch: Any) -> dict:
    coords, grid = lidar_voxels(rng, azimuths=1024 if args.quick else 4096)
    c = m = 64
    n_vox = len(coords)
    assert n_vox < 2**24  # voxel numbers travel as float32 values through the map kernel
    feats = rng.standard_normal((n_vox, c)).astype(np.float32)
    w = (rng.standard_normal((3, 3, 3, c, m)) / np.sqrt(27 * c)).astype(np.float32)
    keys = (coords[:, 0] * grid[1] + coords[:, 1]) * grid[2] + coords[:, 2]
    pairs = neighbour_pairs(keys, coords, grid)
    n_pairs = sum(len(o) for o, _ in pairs)

    # ucf operands, built once: the active set and the features of one layer's input.
    mask = voxel_tensor(coords, grid, np.ones(n_vox, np.float32), SUBM_FORMATS["Mask"])
    inp = voxel_tensor(coords, grid, feats, SUBM_FORMATS["I"])
    ids = voxel_tensor(coords, grid, np.arange(1, n_vox + 1, dtype=np.float32), "UUUC")
    w27 = w.reshape(27, c, m)
    ones = np.ones(n_vox * 27, np.float32)

    def neighbour_map(kind: str = "map") -> ucf.Tensor:
        """N(i,k,j): ucf finds the neighbours, numpy turns Nb's values into j coordinates."""
        nb = kmap(Mask=mask, Idx=ids).vals.astype(np.int32).reshape(n_vox, 27)  # 1 + neighbour
        if kind == "map":  # levels i (dense), k (dense), j (at most one per (i, k))
            hit = nb > 0
            pos = np.zeros(n_vox * 27 + 1, np.int32)
            np.cumsum(hit, out=pos[1:])
            levels = [{}, {}, {"pos": pos, "crd": nb[hit] - 1}]
            fmt = GATHER_GEMM_FORMATS["N"]
        else:  # levels k (dense), i (compressed), j (exactly one per (k, i))
            tap, site = np.nonzero(nb.T > 0)
            pos_i = np.searchsorted(tap, np.arange(28)).astype(np.int32)
            pos_j = np.arange(len(site) + 1, dtype=np.int32)
            crd_j = nb[site, tap] - 1
            levels = [
                {},
                {"pos": pos_i, "crd": site.astype(np.int32)},
                {"pos": pos_j, "crd": crd_j},
            ]
            fmt = TAP_MAJOR_FORMATS["N"]
        nnz = len(levels[2]["crd"])
        return ucf.Tensor((n_vox, 27, n_vox), fmt, levels, ones[:nnz], check=False)

    kmap = kernel(NBMAP, NBMAP_FORMATS, PAR_X, args.target)
    nmaps = {kind: neighbour_map(kind) for kind in ("map", "tap-major")}
    out_map = np.empty((n_vox, m), np.float32)
    variants: dict[str, Callable[[], np.ndarray]] = {}
    gemm_only: dict[str, Callable[[], np.ndarray]] = {}
    refused: dict[str, str] = {}
    schedules = subm_schedules(c, m)
    for label, (kind, sched) in schedules.items():
        try:
            if kind == "direct":
                k = kernel(SUBM, SUBM_FORMATS, sched, args.target)
            elif kind == "map":
                k = kernel(GATHER_GEMM, GATHER_GEMM_FORMATS, sched, args.target)
            else:
                k = kernel(GATHER_GEMM, TAP_MAJOR_FORMATS, sched, args.target)
        except ucf.UcfError as e:
            refused[label] = f"{type(e).__name__}: {e}"
            continue
        if kind == "direct":
            variants[label] = lambda k=k: k(Mask=mask, I=inp, F=w).vals.reshape(n_vox, m)
        else:
            variants[label] = lambda k=k, kind=kind: k(
                N=neighbour_map(kind), X=feats, W=w27, out=out_map
            ).vals.reshape(n_vox, m)
            gemm_only[label] = lambda k=k, kind=kind: k(
                N=nmaps[kind], X=feats, W=w27, out=out_map
            ).vals.reshape(n_vox, m)

    ref = numpy_submanifold(keys, coords, grid, feats, w, pairs)
    spot = spot_check(coords, feats, w, ref, 256, np.random.default_rng(7))
    baseline_name = "numpy hash map"
    spc = spconv_baseline(coords, grid, feats, w, args.threads)
    baseline_note = "spconv not importable" if spc is None else ""
    if spc is not None:
        try:
            if par.close(spc(), ref, "float32"):
                baseline_name = "spconv SubMConv3d"
            else:
                baseline_note = "spconv result differs from the reference: not used"
                spc = None
        except Exception as e:  # an unusual spconv build must not end the run
            baseline_note = f"spconv failed: {type(e).__name__}: {e}"
            spc = None

    wrong, errs = {}, {}
    for label, fn in list(variants.items()):
        got = fn()
        errs[label] = par.base._relerr(got, ref)
        if not par.close(got, ref, "float32"):
            wrong[label] = errs[label]
            del variants[label]
            gemm_only.pop(label, None)
    if not variants:
        raise RowError("error", f"every ucf schedule is wrong or refused: {wrong or refused}")
    best, tuning = par.fastest(variants, args.pilot)
    contenders = {
        "ucf": variants[best],
        "numpy": lambda: numpy_submanifold(keys, coords, grid, feats, w),
        "numpy_gemm": lambda: numpy_submanifold(keys, coords, grid, feats, w, pairs),
    }
    if gemm_only:
        best_gemm, gemm_tuning = par.fastest(gemm_only, args.pilot)
        contenders["ucf_gemm"] = gemm_only[best_gemm]
    if spc is not None:
        contenders["spconv"] = spc
    tgg = torch_gather_gemm(pairs, feats, w, torch)
    torch_ok = None
    if tgg is not None:
        torch_ok = par.close(tgg(), ref, "float32")
        contenders["torch_gemm"] = tgg
    s = par.median_of(contenders, args.repeat)
    t = med(s["ucf"])
    base_key = "spconv" if spc is not None else "numpy"
    flops = 2 * n_pairs * c * m
    kind, sched = schedules[best]
    row = {
        "status": "ok",
        "voxels": n_vox,
        "grid": list(grid),
        "pairs": n_pairs,
        "pairs_per_voxel": n_pairs / n_vox,
        "C": c,
        "M": m,
        "baseline": baseline_name,
        "baseline_note": baseline_note,
        "variant": best,
        "statements": [SUBM] if kind == "direct" else [NBMAP, GATHER_GEMM],
        "formats": SUBM_FORMATS
        if kind == "direct"
        else {**NBMAP_FORMATS, **(GATHER_GEMM_FORMATS if kind == "map" else TAP_MAJOR_FORMATS)},
        "schedule": sched,
        "tuning_s": tuning,
        "refused": refused,
        "wrong": wrong,
        "max_rel_err": errs,
        "baseline_spot_check_rel_err": spot,
        "check": not wrong and spot < 1e-4,
        "ucf_s": t,
        "numpy_s": med(s["numpy"]),
        "numpy_gemm_only_s": med(s["numpy_gemm"]),
        "spconv_s": med(s["spconv"]) if "spconv" in s else None,
        "torch_gather_gemm_s": med(s["torch_gemm"]) if "torch_gemm" in s else None,
        "torch_gather_gemm_check": torch_ok,
        "baseline_s": med(s[base_key]),
        "speedup": med(s[base_key]) / t,
        "speedup_of_minima": min(s[base_key]) / min(s["ucf"]),
        "ucf_gflops": flops / t / 1e9,
        "samples": s,
        "pass": not wrong and spot < 1e-4 and med(s[base_key]) > t,
    }
    if "ucf_gemm" in s:
        row.update(
            ucf_gemm_variant=best_gemm,
            ucf_gemm_tuning_s=gemm_tuning,
            ucf_gemm_only_s=med(s["ucf_gemm"]),
            gemm_only_speedup=med(s["numpy_gemm"]) / med(s["ucf_gemm"]),
        )
    return row


# --------------------------------------------------------------------------- report


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f}"


def filter_table(rows: list[dict], summary: dict) -> str:
    head = (
        f"{'layer':<5} {'shape':<24} {'pattern':<7} {'sparsity':>8} {'oneDNN ms':>10} "
        f"{'ucf ms':>9} {'speedup':>8}  {'ucf variant':<14} {'ucf GF/s':>8} {'no-sched':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        layer = BY_NAME[r["layer"]]
        pre = f"{r['layer']:<5} {layer.shape:<24} {r['pattern']:<7}"
        if r.get("status") != "ok":
            lines.append(f"{pre} {r.get('status')}: {r.get('message', '').splitlines()[0]}")
            continue
        flag = "" if r["check"] else "  WRONG: " + ", ".join(r["wrong"])
        lines.append(
            f"{pre} {100 * r['sparsity']:>7.1f}% {_ms(r['torch_s']):>10} {_ms(r['ucf_s']):>9} "
            f"{r['speedup']:>7.2f}x  {r['variant']:<14} {r['ucf_gflops_useful']:>8.1f} "
            f"{_no_schedule_cell(r['no_schedule']):>9}{flag}"
        )
    lines.append("-" * len(head))
    lines.append(
        "speedup = oneDNN time / ucf time (above 1: ucf faster); ucf GF/s counts the useful "
        "flops (2 x nnz x output pixels); no-sched = oneDNN time / time of the direct "
        "statement with no schedule given"
    )
    labels = list(summary)
    layer_names = [x.name for x in LAYERS if any(r["layer"] == x.name for r in rows)]
    lines.append("")
    lines.append("speedup over oneDNN, layer x pattern:")
    lines.append(f"{'layer':<5} " + " ".join(f"{lb:>6}" for lb in labels))
    cell = {(r["layer"], r["pattern"]): r for r in rows}
    for name in layer_names:
        vals = []
        for lb in labels:
            r = cell.get((name, lb))
            if r is None:
                vals.append(f"{'':>6}")
            elif r.get("status") != "ok":
                vals.append(f"{'n/a':>6}")
            else:
                vals.append(f"{r['speedup']:>5.2f}x")
        lines.append(f"{name:<5} " + " ".join(vals))
    lines.append("")
    lines.append(
        f"geometric-mean speedup over the stride-1 3x3 layers ({', '.join(SUMMARY_LAYERS)}):"
    )
    for lb, e in summary.items():
        part = "" if e["complete"] else f" (only {', '.join(e['layers']) or 'no layers'})"
        verdict = ""
        if "target" in e:
            verdict = f"  target >= {e['target']:.1f}x: {'PASS' if e['pass'] else 'FAIL'}"
        lines.append(
            f"  {lb:<5} {e['geomean_speedup']:>6.2f}x{part}{verdict}   (from the fastest runs "
            f"{e['geomean_speedup_of_minima']:.2f}x; all measured layers "
            f"{e['all_layers_geomean']:.2f}x)"
        )
    lines.append("no schedule given (the direct statement, F UCCC), same layers:")
    for lb, e in summary.items():
        part = "" if e["no_schedule_complete"] else " (not every layer measured)"
        verdict = ""
        if "no_schedule_target" in e:
            ok = "PASS" if e["no_schedule_pass"] else "FAIL"
            verdict = f"  target >= {e['no_schedule_target']:.1f}x: {ok}"
        lines.append(f"  {lb:<5} {e['no_schedule_geomean_speedup']:>6.2f}x{part}{verdict}")
    wins: dict[str, int] = {}
    for r in rows:
        if r.get("status") == "ok":
            wins[r["variant"]] = wins.get(r["variant"], 0) + 1
    lines.append(
        "ucf variant picked by the pilot: " + ", ".join(f"{k} {v}x" for k, v in wins.items())
    )
    refused = {k: v for r in rows for k, v in r.get("refused", {}).items()}
    for k, v in refused.items():
        lines.append(f"ucf refused variant '{k}': {v.splitlines()[0]}")
    return "\n".join(lines)


def _no_schedule_cell(plain: dict) -> str:
    return f"{plain['speedup']:.2f}x" if plain["status"] == "ok" else plain["status"]


def subm_table(r: dict) -> str:
    if r.get("status") != "ok":
        return f"submanifold 3-D: {r.get('status')}: {r.get('message', '')}"
    lines = [
        f"submanifold 3-D conv: {r['voxels']} voxels in {'x'.join(map(str, r['grid']))}, "
        f"{r['pairs']} neighbour pairs ({r['pairs_per_voxel']:.1f} per voxel), C = M = 64, "
        f"3x3x3",
        f"  ucf ({r['variant']}): {_ms(r['ucf_s'])} ms ({r['ucf_gflops']:.1f} GFLOP/s)",
        f"  {r['baseline']}: {_ms(r['baseline_s'])} ms -> ucf speedup {r['speedup']:.2f}x "
        f"(fastest runs: {r['speedup_of_minima']:.2f}x)  target > 1: "
        f"{'PASS' if r['pass'] else 'FAIL'}",
        f"  gather-GEMM alone (neighbour map reused): numpy {_ms(r['numpy_gemm_only_s'])} ms, "
        f"ucf ({r.get('ucf_gemm_variant', '-')}) {_ms(r.get('ucf_gemm_only_s'))} ms -> "
        f"{r.get('gemm_only_speedup', float('nan')):.2f}x",
        "  ucf schedules (pilot): "
        + ", ".join(f"{k} {_ms(v)} ms" for k, v in r["tuning_s"].items()),
    ]
    if r.get("torch_gather_gemm_s") is not None:
        lines.append(
            f"  torch gather-GEMM (index_select, mm, index_add_; map reused), for reference: "
            f"{_ms(r['torch_gather_gemm_s'])} ms"
            + ("" if r["torch_gather_gemm_check"] else " (WRONG result)")
        )
    if r["baseline_note"]:
        lines.append(f"  note: {r['baseline_note']}")
    if r["wrong"]:
        lines.append(f"  WRONG ucf schedules: {r['wrong']}")
    for k, v in r["refused"].items():
        lines.append(f"  ucf refused '{k}': {v.splitlines()[0]}")
    lines.append(
        "  max relative error vs baseline: "
        + ", ".join(f"{k} {v:.1e}" for k, v in r["max_rel_err"].items())
        + f"; baseline spot check at 256 voxels {r['baseline_spot_check_rel_err']:.1e}"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def _pick(text: str | None, known: list[str], what: str) -> list[str]:
    if not text:
        return known
    want = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in want if w not in known]
    if bad:
        raise SystemExit(f"unknown {what} {bad}; choose from {', '.join(known)}")
    return [k for k in known if k in want]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 layers, 91%% sparsity, small cloud")
    p.add_argument("--layers", help="comma-separated layer names (C1..C23)")
    p.add_argument("--sparsity", help=f"comma-separated patterns ({', '.join(PATTERNS)})")
    p.add_argument("--only", choices=("filter", "submanifold"), help="run one part")
    p.add_argument("--threads", type=int, default=2, help="threads for ucf and torch")
    p.add_argument("--repeat", type=int, default=None, help="head-to-head runs (15; 3 quick)")
    p.add_argument("--pilot", type=int, default=None, help="pilot runs per variant (5; 2 quick)")
    p.add_argument("--target", choices=("llvm", "c"), default="llvm", help="ucf code generator")
    p.add_argument(
        "--json",
        default=str(HERE / "results" / "conv.json"),
        help="where to write the results (default: %(default)s)",
    )
    args = p.parse_args(argv)
    args.repeat = max(1, args.repeat if args.repeat is not None else (3 if args.quick else 15))
    args.pilot = max(1, args.pilot if args.pilot is not None else (2 if args.quick else 5))
    layers = _pick(args.layers, [x.name for x in LAYERS], "layers")
    labels = _pick(args.sparsity, list(PATTERNS), "sparsity patterns")
    if args.quick:
        layers = [x for x in layers if x in QUICK_LAYERS] if not args.layers else layers
        labels = [x for x in labels if x in QUICK_PATTERNS] if not args.sparsity else labels

    torch = par.load_torch(args.threads)

    res: dict = {
        "config": {
            "quick": args.quick,
            "threads": args.threads,
            "repeat": args.repeat,
            "pilot": args.pilot,
            "target": args.target,
            "layers": layers,
            "patterns": {lb: PATTERNS[lb] for lb in labels},
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
    cpu_start = par.cpu_snapshot()
    t_start = time.perf_counter()
    texts = []
    with par.base.fresh_kernel_cache("ucf-bench-conv-"):
        if args.only != "submanifold":
            if torch is None:
                res["filter"] = {"status": "skipped", "message": "torch not importable"}
                texts.append("filter-sparse conv: skipped (torch is not importable)")
            else:
                rows = []
                for name in layers:
                    layer = BY_NAME[name]
                    for label in labels:
                        if not applicable(layer, label):
                            continue
                        print(f"{name} {layer.shape} {label} ...", file=sys.stderr)
                        rng = np.random.default_rng(
                            [int(name[1:]), 1 + list(PATTERNS).index(label)]
                        )
                        row = {"layer": name, "pattern": label, "shape": layer.shape}
                        rows.append(
                            par.guarded(
                                row,
                                lambda l=layer, b=label, g=rng: bench_filter(l, b, torch, args, g),
                            )
                        )
                summary = summarize_filter(rows, labels)
                res["filter"] = {"status": "ok", "rows": rows, "summary": summary}
                texts.append(filter_table(rows, summary))
        if args.only != "filter":
            print("submanifold 3-D ...", file=sys.stderr)
            res["submanifold"] = par.guarded(
                {}, lambda: bench_submanifold(args, np.random.default_rng(2023), torch)
            )
            texts.append(subm_table(res["submanifold"]))
        res["config"]["openmp_runtimes"] = par.openmp_runtimes()
    res["cpu"] = par.cpu_contention(cpu_start, par.cpu_snapshot())
    res["wall_s"] = time.perf_counter() - t_start

    verdicts = []
    if res.get("filter", {}).get("status") == "ok":
        verdicts += [e["pass"] for e in res["filter"]["summary"].values() if "pass" in e]
        verdicts += [r.get("check", False) for r in res["filter"]["rows"]]
    if "submanifold" in res:
        verdicts.append(bool(res["submanifold"].get("pass")))
    res["all_pass"] = bool(verdicts) and all(verdicts)
    plain = [
        e["no_schedule_pass"]
        for e in res.get("filter", {}).get("summary", {}).values()
        if "no_schedule_pass" in e
    ]
    res["no_schedule_pass"] = all(plain) if plain else None

    busy = res["cpu"]
    if busy:
        lost = busy["other_cpu_s"] + busy["steal_s"]
        note = (
            f"machine: {busy['cpus']} CPUs; during the {busy['wall_s']:.0f} s run other processes "
            f"used {busy['other_cpu_s']:.1f} CPU-s, steal {busy['steal_s']:.1f} CPU-s"
        )
        if lost > par.NOISY_SHARE * busy["wall_s"] * (busy["cpus"] or 1):
            note += "; WARNING: timings are unreliable, rerun on an idle machine"
        texts.append(note)
    print("\n\n".join(texts))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(f"\ntargets: {'PASS' if res['all_pass'] else 'FAIL'}; results written to {out}")
    if res["no_schedule_pass"] is not None:
        print(f"no-schedule targets (issue 17): {'PASS' if res['no_schedule_pass'] else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
