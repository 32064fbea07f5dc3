"""Convolutions written with affine indices, against the numpy reference in ``conv_reference``.

* 1-D, 2-D and 3-D convolutions, channels-first (``O(n,m,p,..) = I(n,c,p+r,..) *
  F(m,c,r,..)``) and channels-last (``O(n,p,..,m) = I(n,p+r,..,c) * F(r,..,c,m)``),
  with strides 1 and 2, dilation 2, padding 1 (a covering array of the combinations
  by default, every one in the slow run), and grouped convolutions with the group as
  an explicit mode.
* Every U/C choice of the 2-D filter's four levels and of the input's
  innermost level, with and without schedules (reorder, split, parallelize),
  on LLVM (every pair of the three by default, all in the slow run), and a sample
  on C.
* Masked (submanifold) convolutions in 2-D and 3-D: the output's compressed
  level must store exactly the mask's coordinates, with the reference values
  there, for empty, single-point and random point sets.

Operands are small integer-valued arrays with fixed seeds, so results are
exact.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

import ucf
from tests.helpers import (
    covered,
    needs_cc,
    nonzero_coords,
    rand_sparse,
    stored_coords,
    uc_combos,
)
from tests.lang.conv_reference import conv, conv_grouped, conv_output_size, submanifold

SEED = 20240918

OUT_VARS, RED_VARS = "pqu", "rst"


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by the test's parameters, so every case is reproducible."""
    return np.random.default_rng([SEED, *(zlib.crc32(str(k).encode()) for k in key)])


def c_param(*values):
    """A parameter set run on the C target (skipped without a C compiler)."""
    return pytest.param(*values, marks=needs_cc)


def affine(o: str, r: str, stride: int, dilation: int, padding: int) -> str:
    """``stride*o + dilation*r - padding`` as ucf text."""
    text = (f"{stride}*{o}" if stride != 1 else o) + "+"
    text += f"{dilation}*{r}" if dilation != 1 else r
    return text + (f"-{padding}" if padding else "")


def conv_expr(d: int, layout: str, stride=1, padding=0, dilation=1, grouped=False) -> str:
    """The ucf statement of a ``d``-dimensional convolution."""
    o, r = OUT_VARS[:d], RED_VARS[:d]
    spatial = ",".join(affine(a, b, stride, dilation, padding) for a, b in zip(o, r, strict=True))
    o, r = ",".join(o), ",".join(r)
    if grouped:
        return f"O(n,g,m,{o}) = I(n,g,c,{spatial}) * F(g,m,c,{r})"
    if layout == "NCHW":
        return f"O(n,m,{o}) = I(n,c,{spatial}) * F(m,c,{r})"
    return f"O(n,{o},m) = I(n,{spatial},c) * F({r},c,m)"


SPATIAL = {1: (9,), 2: (6, 7), 3: (5, 4, 6)}
KERNEL = {1: (3,), 2: (3, 2), 3: (3, 2, 2)}
N, C, M = 2, 3, 2


def operands(rng, d: int, layout: str, density=0.4):
    """(input, filter) with zeros in both (and an all-zero batch entry in the input)."""
    sp, ks = SPATIAL[d], KERNEL[d]
    if layout == "NCHW":
        x = rand_sparse(rng, (N, C, *sp), density)
        w = rand_sparse(rng, (M, C, *ks), 0.6, empty_rows=0)
    else:
        x = rand_sparse(rng, (N, *sp, C), density)
        w = rand_sparse(rng, (*ks, C, M), 0.6, empty_rows=0)
    return x, w


def run(expr, formats, schedule, target, arrays, **call):
    k = ucf.compile(expr, formats=formats, schedule=schedule, target=target)
    ops = {
        n: ucf.from_numpy(a, format=formats[n]) if n in formats else a for n, a in arrays.items()
    }
    return k(**ops, **call)


def assert_exact(result, expected) -> None:
    got = result.to_numpy() if isinstance(result, ucf.Tensor) else np.asarray(result)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


# --------------------------------------------------------------- 1-D, 2-D, 3-D

#: (stride, padding, dilation)
GEOMETRIES = [(1, 0, 1), (2, 0, 1), (1, 1, 1), (1, 0, 2), (2, 1, 1), (2, 1, 2)]


def conv_params():
    """Every row on llvm, those of a covering array (``pairwise``: 18 of 72, every pair of
    dimension, layout, geometry and inner format) by default and the rest in the slow
    run; a sample on c."""
    lists = ((1, 2, 3), ("NCHW", "NHWC"), GEOMETRIES, "UC")
    params = []  # each c row after its llvm row: the ids (geom<index>) stay as they were
    for llvm, (d, layout, geom, inner) in zip(
        covered(["llvm"], *lists), itertools.product(*lists), strict=True
    ):
        params.append(llvm)
        if inner == "C" and geom in ((1, 0, 1), (2, 1, 2)):
            params.append(c_param("c", d, layout, geom, inner))
    return params


@pytest.mark.parametrize("target,d,layout,geom,inner", conv_params())
def test_conv(target, d, layout, geom, inner):
    stride, padding, dilation = geom
    rng = rng_for("conv", d, layout, geom, inner)
    x, w = operands(rng, d, layout)
    fi = "U" * (d + 1) + inner
    expr = conv_expr(d, layout, stride, padding, dilation)
    got = run(expr, {"I": fi}, None, target, {"I": x, "F": w})
    expected = conv(x, w, stride, padding, dilation, layout=layout)
    sp = SPATIAL[d]
    sizes = [
        conv_output_size(n, k, stride, padding, dilation)
        for n, k in zip(sp, KERNEL[d], strict=True)
    ]
    out_spatial = expected.shape[2:] if layout == "NCHW" else expected.shape[1:-1]
    assert out_spatial == tuple(sizes)
    assert_exact(got, expected)


# ----------------------------------------------------- 2-D filter formats x schedules

#: Schedules that keep F(m,c,r,s) in its level order, so they apply to every filter format.
NCHW_SCHEDULES = {
    "default": None,
    "serial": "",
    "split-parallel": "split(p,p0,p1,2); parallelize(n,CPUThread,NoRaces)",
    "m-outer": "reorder(m,n,p,q,c,r,s); split(q,q0,q1,2); parallelize(m,CPUThread,NoRaces)",
}

FILTERS = uc_combos(4)  # UUUU ... CCCC


def filter_params():
    """On llvm every filter format with each inner format of the input and each schedule
    (a covering array: 32 of the 64 rows by default, the rest in the slow run); a sample
    on c."""
    params = covered(["llvm"], FILTERS, "UC", ["default", "m-outer"])
    for ff, inner in [("UCUU", "C"), ("CCCC", "C"), ("UUUC", "U"), ("CUCU", "C")]:
        params.append(c_param("c", ff, inner, "split-parallel"))
    return params


@pytest.mark.parametrize("target,ff,inner,sched", filter_params())
def test_conv2d_filter_formats(target, ff, inner, sched):
    """Strided, padded NCHW conv for every U/C filter and input-innermost choice."""
    rng = rng_for("filters", ff, inner)
    x, w = operands(rng, 2, "NCHW")
    formats = {"I": "UUU" + inner, "F": ff}
    expr = conv_expr(2, "NCHW", stride=2, padding=1)
    got = run(expr, formats, NCHW_SCHEDULES[sched], target, {"I": x, "F": w})
    assert_exact(got, conv(x, w, stride=2, padding=1))


@pytest.mark.parametrize("ff", FILTERS)
@pytest.mark.parametrize("inner", "UC")
def test_conv2d_nhwc_filter_formats(ff, inner):
    """``F(r,s,c,m)`` for every U/C choice, dilated and padded, serial."""
    rng = rng_for("nhwc-filters", ff, inner)
    x, w = operands(rng, 2, "NHWC")
    formats = {"I": "UUU" + inner, "F": ff}
    expr = conv_expr(2, "NHWC", padding=1, dilation=2)
    got = run(expr, formats, "", "llvm", {"I": x, "F": w})
    assert_exact(got, conv(x, w, padding=1, dilation=2, layout="NHWC"))


SCHEDULES = {
    "NCHW": [
        "parallelize(n,CPUThread,NoRaces)",
        "reorder(n,m,p,q,r,s,c)",  # input channel innermost
        "reorder(n,m,p,q,r,s,c); split(p,p0,p1,2); parallelize(n,CPUThread,NoRaces)",
        "reorder(n,p,q,m,c,r,s); parallelize(n,CPUThread,NoRaces)",
        "split(p,p0,p1,2); reorder(n,m,p0,q,p1,c,r,s); parallelize(p0,CPUThread,NoRaces)",
        "reorder(m,n,p,q,c,r,s); parallelize(m,CPUThread,NoRaces)",
    ],
    "NHWC": [
        "reorder(n,p,q,r,s,c,m); split(p,p0,p1,4); parallelize(p0,CPUThread,NoRaces)",
        "reorder(n,p,q,r,s,c,m)",
        "reorder(n,p,q,m,r,s,c)",
        "split(q,q0,q1,2); parallelize(n,CPUThread,NoRaces)",
        "reorder(p,n,q,r,s,c,m); parallelize(p,CPUThread,NoRaces)",
    ],
}


@pytest.mark.parametrize("layout,schedule", [(lay, s) for lay, ss in SCHEDULES.items() for s in ss])
@pytest.mark.parametrize("inner", "UC")
@pytest.mark.parametrize("geom", [(1, 1, 1), (2, 1, 1)], ids=["same", "stride2"])
def test_conv2d_schedules(layout, schedule, inner, geom):
    """Dense filter: any loop order is legal; the result never changes."""
    stride, padding, dilation = geom
    rng = rng_for("schedules", layout, schedule, inner, geom)
    x, w = operands(rng, 2, layout)
    formats = {"I": "UUU" + inner}
    expr = conv_expr(2, layout, stride, padding, dilation)
    got = run(expr, formats, schedule, "llvm", {"I": x, "F": w})
    assert_exact(got, conv(x, w, stride, padding, dilation, layout=layout))


@pytest.mark.parametrize("ff", ["UUUC:0,2,3,1", "CUCC:0,2,3,1", "UCUU:0,2,3,1"])
def test_sparse_filter_with_channel_innermost(ff):
    """A sparse F(m,c,r,s) stored m, r, s, c allows the c-innermost loop order."""
    rng = rng_for("c-inner", ff)
    x, w = operands(rng, 2, "NCHW")
    formats = {"I": "UUUC", "F": ff}
    schedule = "reorder(n,m,p,q,r,s,c); split(p,p0,p1,2); parallelize(n,CPUThread,NoRaces)"
    got = run(conv_expr(2, "NCHW", 1, 1), formats, schedule, "llvm", {"I": x, "F": w})
    assert_exact(got, conv(x, w, padding=1))


def test_sparse_filter_out_of_level_order_is_a_schedule_error():
    with pytest.raises(ucf.ScheduleError, match="F"):
        ucf.compile(conv_expr(2, "NCHW"), formats={"F": "UCUU"}, schedule="reorder(n,m,p,q,r,s,c)")


# ------------------------------------------------------------- input formats


@pytest.mark.parametrize(
    "fi",
    ["UUUC:0,2,3,1", "UUCU:0,2,3,1", "UCUU", "CUUU", "UUCU", "UUCC", "UCUC", "CCCC"],
)
@pytest.mark.parametrize("schedule", [None, "parallelize(n,CPUThread,NoRaces)"])
def test_conv2d_input_formats(fi, schedule):
    """NCHW data stored in other level kinds and orders (``:0,2,3,1`` is NHWC order)."""
    rng = rng_for("input-formats", fi)
    x, w = operands(rng, 2, "NCHW", density=0.5)
    got = run(conv_expr(2, "NCHW", 2, 1), {"I": fi}, schedule, "llvm", {"I": x, "F": w})
    assert_exact(got, conv(x, w, stride=2, padding=1))


@pytest.mark.parametrize("fo", ["UUUC", "UCUU", "UUCC", "CCCC"])
@pytest.mark.parametrize("schedule", [None, ""])
def test_conv2d_sparse_output(fo, schedule):
    """A sparse output stores every nonzero of the result (and only values the reference has)."""
    rng = rng_for("sparse-out", fo)
    x, w = operands(rng, 2, "NCHW", density=0.2)
    formats = {"I": "UUUC", "O": fo}
    got = run(conv_expr(2, "NCHW", 2, 1), formats, schedule, "llvm", {"I": x, "F": w})
    expected = conv(x, w, stride=2, padding=1)
    assert str(got.format).split(":")[0] == fo
    assert nonzero_coords(expected) <= stored_coords(got)
    assert_exact(got, expected)


# ------------------------------------------------------------------- grouped

GROUPS, CG = 2, 2  # 2 groups of 2 input channels


@pytest.mark.parametrize(
    "target,d,geom,fi,ff",
    [
        ("llvm", 2, (1, 0, 1), "UUUUU", "UUUUU"),
        ("llvm", 2, (1, 0, 1), "UUUUC", "UCUUU"),
        ("llvm", 2, (2, 1, 1), "UUUUC", "UUCUU"),
        ("llvm", 2, (1, 1, 2), "UUUUU", "CCCCC"),
        ("llvm", 1, (2, 1, 1), "UUUC", "UUUU"),
        ("llvm", 3, (1, 1, 1), "UUUUUC", "UUUUUU"),
        c_param("c", 2, (2, 1, 1), "UUUUC", "UCUUU"),
    ],
)
def test_grouped_conv(target, d, geom, fi, ff):
    stride, padding, dilation = geom
    rng = rng_for("grouped", d, geom, fi, ff)
    sp, ks = SPATIAL[d], KERNEL[d]
    x = rand_sparse(rng, (N, GROUPS, CG, *sp), 0.5)
    w = rand_sparse(rng, (GROUPS, M, CG, *ks), 0.6, empty_rows=0)
    expr = conv_expr(d, "NCHW", stride, padding, dilation, grouped=True)
    got = run(expr, {"I": fi, "F": ff}, None, target, {"I": x, "F": w})
    expected = conv_grouped(x, w, stride, padding, dilation)
    assert_exact(got, expected)
    # the same numbers as an ordinary grouped convolution on flattened channels
    flat = conv(
        x.reshape(N, GROUPS * CG, *sp),
        w.reshape(GROUPS * M, CG, *ks),
        stride,
        padding,
        dilation,
        groups=GROUPS,
    )
    np.testing.assert_array_equal(expected.reshape(flat.shape), flat)


# ---------------------------------------------------------- masked / submanifold

SUB2 = "O(n,p,q,m) = Mask(n,p,q) * I(n,p+r-1,q+s-1,c) * F(r,s,c,m)"
SUB3 = "O(n,p,q,u,m) = Mask(n,p,q,u) * I(n,p+r-1,q+s-1,u+t-1,c) * F(r,s,t,c,m)"
SUB_FORMATS = {
    2: {"O": "UUCU", "Mask": "UUC", "I": "UUCU"},
    3: {"O": "UUUCU", "Mask": "UUUC", "I": "UUUCU"},
}
SUB_SPATIAL = {2: (6, 7), 3: (4, 5, 6)}
SUB_C, SUB_M = 3, 2


def point_cloud(rng, d: int, count: int) -> np.ndarray:
    """An NHWC input with nonzero channel vectors at about ``count`` random sites."""
    sp = SUB_SPATIAL[d]
    x = np.zeros((N, *sp, SUB_C))
    for _ in range(count):
        site = (int(rng.integers(N)), *(int(rng.integers(n)) for n in sp))
        x[site] = rng.integers(1, 5, SUB_C) * rng.choice([-1, 1], SUB_C)
    return x


def point_sets(d: int):
    """Empty, one point, one point in a corner, a few, many (key, input) pairs."""
    rng = rng_for("points", d)
    corner = np.zeros((N, *SUB_SPATIAL[d], SUB_C))
    corner[(N - 1, *(n - 1 for n in SUB_SPATIAL[d]))] = [1.0, -2.0, 3.0]
    return [
        ("empty", point_cloud(rng, d, 0)),
        ("single", point_cloud(rng, d, 1)),
        ("corner", corner),
        ("few", point_cloud(rng, d, 5)),
        ("many", point_cloud(rng, d, 40)),
    ]


def check_submanifold(k, d: int, mask: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    fmts = SUB_FORMATS[d]
    mask_t = ucf.from_numpy(mask, format=fmts["Mask"])
    out = k(Mask=mask_t, I=ucf.from_numpy(x, format=fmts["I"]), F=w)
    assert str(out.format).split(":")[0] == fmts["O"]
    level = d  # the compressed level: n and d-1 dense spatial levels above it
    np.testing.assert_array_equal(out.levels[level]["pos"], mask_t.levels[level]["pos"])
    np.testing.assert_array_equal(out.levels[level]["crd"], mask_t.levels[level]["crd"])
    assert out.vals.shape == (len(mask_t.levels[level]["crd"]) * SUB_M,)
    assert_exact(out, submanifold(mask, x, w))


SUB_SCHEDULES = [
    None,
    "",
    "reorder(n,p,q,r,s,c,m)",
    "reorder(n,p,q,r,s,c,m); split(p,p0,p1,2); parallelize(p0,CPUThread,NoRaces)",
]


@pytest.mark.parametrize(
    "target,schedule", [("llvm", s) for s in SUB_SCHEDULES] + [c_param("c", SUB_SCHEDULES[2])]
)
def test_submanifold_2d(target, schedule):
    k = ucf.compile(SUB2, formats=SUB_FORMATS[2], schedule=schedule, target=target)
    rng = rng_for("sub2", schedule)
    for _, x in point_sets(2):
        w = rand_sparse(rng, (3, 3, SUB_C, SUB_M), 0.8, empty_rows=0)
        mask = (np.abs(x).sum(-1) != 0).astype(np.float64)
        check_submanifold(k, 2, mask, x, w)


@pytest.mark.parametrize(
    "target,schedule", [("llvm", None), ("llvm", "reorder(n,p,q,u,r,s,t,c,m)"), c_param("c", "")]
)
def test_submanifold_3d(target, schedule):
    k = ucf.compile(SUB3, formats=SUB_FORMATS[3], schedule=schedule, target=target)
    rng = rng_for("sub3", schedule)
    for _, x in point_sets(3):
        w = rand_sparse(rng, (3, 3, 3, SUB_C, SUB_M), 0.8, empty_rows=0)
        mask = (np.abs(x).sum(-1) != 0).astype(np.float64)
        check_submanifold(k, 3, mask, x, w)


def test_submanifold_mask_other_than_the_input():
    """Mask sites with no input neighbours are stored too (as zeros): the pattern is the mask's."""
    k = ucf.compile(SUB2, formats=SUB_FORMATS[2])
    rng = rng_for("sub-mask")
    x = point_cloud(rng, 2, 6)
    w = rand_sparse(rng, (3, 3, SUB_C, SUB_M), 0.8, empty_rows=0)
    active = np.abs(x).sum(-1) != 0
    mask = active.astype(np.float64)
    mask[0, 0, 0] = mask[1, 5, 6] = mask[0, 3, 3] = 1.0
    first = tuple(int(i) for i in np.argwhere(active)[0])
    mask[first] = 0.0  # an active input site outside the mask
    check_submanifold(k, 2, mask, x, w)
