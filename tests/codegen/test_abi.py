"""The exported C ABI from the caller's side: ``NAME_check`` finds each kind of bad
operand array, and ``--abi taco`` kernels run from drivers written against
TACO's ``taco_tensor_t``. Every program builds under ASan and UBSan and its
answers are compared with scipy."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.codegen.c import ABI_VERSION
from ucf.errors import UcfError
from ucf.resources import runtime_dir

CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler")
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-g"]
ENV = {"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}

# Error codes from runtime/ucf.h, read from the header so the test follows it.
CODES = {
    m[1]: int(m[2])
    for m in re.finditer(
        r"#define (UCF_OK|UCF_ERR_\w+) (\d+)\b", (runtime_dir() / "ucf.h").read_text()
    )
}


def _build(d: Path, sources: list[str], exe: str) -> Path:
    """The driver and the kernels, all with -Wall -Werror and the sanitizers."""
    flags = ["-std=c99", "-O1", "-Wall", "-Werror", *SANITIZE]
    proc = subprocess.run(
        [CC, *flags, *sources, "-lm", "-o", exe], cwd=d, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return d / exe


def _run(exe: Path, stdin: str = "") -> str:
    proc = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_ucf_h_version_matches_the_generator():
    text = (runtime_dir() / "ucf.h").read_text()
    assert f"#define UCF_ABI_VERSION_MAJOR {ABI_VERSION}\n" in text
    assert CODES["UCF_OK"] == 0 and len(set(CODES.values())) == len(CODES)


# ------------------------------------------------------------------ <name>_check
CHECK_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "add.h"

static int32_t* ints(int64_t n) {
  int32_t* a = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  for (int64_t q = 0; q < n; q++) if (scanf("%d", &a[q]) != 1) exit(2);
  return a;
}
static double* reals(int64_t n) {
  double* a = (double*)malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  for (int64_t q = 0; q < n; q++) if (scanf("%lf", &a[q]) != 1) exit(2);
  return a;
}

int main(void) {
  long long ni, nj, a0, a1, annz, b0, b1, bnnz;
  if (scanf("%lld %lld %lld %lld %lld", &ni, &nj, &a0, &a1, &annz) != 5) return 2;
  int32_t* ap = ints(a0 + 1); int32_t* ac = ints(annz); double* av = reals(annz);
  if (scanf("%lld %lld %lld", &b0, &b1, &bnnz) != 3) return 2;
  int32_t* bp = ints(2); int32_t* bc0 = ints(bnnz); int32_t* bc1 = ints(bnnz);
  double* bv = reals(bnnz);
  char msg[200] = "";
  int code = add_check(ni, nj, a0, a1, ap, ac, av, b0, b1, bp, bc0, bc1, bv, msg, sizeof msg);
  printf("%d\n%s\n", code, msg);
  if (code == UCF_OK) {
    int64_t counts[2];
    int32_t* sp = (int32_t*)malloc(sizeof(int32_t) * (size_t)(ni + 1));
    add_assemble(ni, nj, a0, a1, ap, ac, av, b0, b1, bp, bc0, bc1, bv, counts, sp);
    int32_t* sc = (int32_t*)malloc(sizeof(int32_t) * (size_t)(counts[1] > 0 ? counts[1] : 1));
    double* sv = (double*)calloc((size_t)(counts[1] > 0 ? counts[1] : 1), sizeof(double));
    add(ni, nj, a0, a1, ap, ac, av, b0, b1, bp, bc0, bc1, bv, ni, nj, sp, sc, sv, counts);
    for (int64_t i = 0; i < ni; i++)
      for (int32_t q = sp[i]; q < sp[i + 1]; q++)
        printf("%lld %d %.17g\n", (long long)i, sc[q], sv[q]);
    free(sp); free(sc); free(sv);
  }
  free(ap); free(ac); free(av); free(bp); free(bc0); free(bc1); free(bv);
  return 0;
}
"""


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    k = ucf.compile(
        "S(i,j) = A(i,j) + B(i,j)", formats={"A": "csr", "B": "coo", "S": "csr"}, target="c"
    )
    assert [f.name for f in k.save(d / "add")] == ["add.c", "add.h"]
    assert (d / "ucf.h").exists()
    (d / "main.c").write_text(CHECK_DRIVER)
    return _build(d, ["main.c", "add.c"], "main")


M, N = 8, 6
GOOD_A = sp.random(M, N, density=0.4, format="csr", random_state=3)
GOOD_B = sp.random(M, N, density=0.3, format="coo", random_state=4)


def _input(a_pos, a_crd, b_row, b_col, shape_a=(M, N), shape_b=(M, N), extents=(M, N)):
    a_vals = np.arange(1.0, len(a_crd) + 1)
    b_vals = np.arange(1.0, len(b_row) + 1) / 8
    words = [*extents, *shape_a, len(a_crd), *a_pos, *a_crd, *a_vals]
    words += [*shape_b, len(b_row), 0, len(b_row), *b_row, *b_col, *b_vals]
    return " ".join(str(w) for w in words)


def _good():
    order = np.lexsort((GOOD_B.col, GOOD_B.row))
    return {
        "a_pos": GOOD_A.indptr.tolist(),
        "a_crd": GOOD_A.indices.tolist(),
        "b_row": GOOD_B.row[order].tolist(),
        "b_col": GOOD_B.col[order].tolist(),
    }


def test_check_accepts_good_arrays_and_the_kernel_agrees_with_scipy(checker):
    good = _good()
    out = _run(checker, _input(**good)).splitlines()
    assert out[0] == "0" and out[1] == ""
    a = sp.csr_matrix((np.arange(1.0, GOOD_A.nnz + 1), GOOD_A.indices, GOOD_A.indptr), shape=(M, N))
    b = sp.coo_matrix(
        (np.arange(1.0, GOOD_B.nnz + 1) / 8, (good["b_row"], good["b_col"])), shape=(M, N)
    )
    got = np.zeros((M, N))
    for line in out[2:]:
        i, j, v = line.split()
        got[int(i), int(j)] = float(v)
    np.testing.assert_allclose(got, (a + b).toarray(), rtol=1e-15)


def _bad_cases():
    g = _good()
    row = next(i for i in range(M) if g["a_pos"][i + 1] - g["a_pos"][i] >= 2)
    lo = g["a_pos"][row]

    def a_crd(fn):
        crd = list(g["a_crd"])
        fn(crd)
        return {**g, "a_crd": crd}

    def swap(crd):  # unsorted columns within a row: valid CSR for most libraries
        crd[lo], crd[lo + 1] = crd[lo + 1], crd[lo]

    def dup(crd):
        crd[lo + 1] = crd[lo]

    def out_of_range(crd):
        crd[lo] = N

    def negative(crd):
        crd[lo] = -1

    pos_start = [1, *g["a_pos"][1:]]
    pos_down = list(g["a_pos"])
    pos_down[row + 1] = pos_down[row] - 1 if pos_down[row] > 0 else pos_down[row + 2] + 1
    b_swap = dict(g, b_row=g["b_row"][::-1], b_col=g["b_col"][::-1])
    b_dup = dict(
        g, b_row=[g["b_row"][0], *g["b_row"][:-1]], b_col=[g["b_col"][0], *g["b_col"][:-1]]
    )
    b_col_range = dict(g, b_col=[N + 3, *g["b_col"][1:]])
    return {
        "unsorted CSR columns": ({**a_crd(swap)}, {}, "UCF_ERR_CRD_ORDER"),
        "duplicate CSR column": (a_crd(dup), {}, "UCF_ERR_CRD_DUPLICATE"),
        "column >= dim": (a_crd(out_of_range), {}, "UCF_ERR_CRD_RANGE"),
        "negative column": (a_crd(negative), {}, "UCF_ERR_CRD_RANGE"),
        "pos not from 0": ({**g, "a_pos": pos_start}, {}, "UCF_ERR_POS"),
        "pos decreases": ({**g, "a_pos": pos_down}, {}, "UCF_ERR_POS"),
        "operand size != extent": (g, {"shape_b": (M, N + 1)}, "UCF_ERR_DIM"),
        "negative extent": (g, {"extents": (M, -1), "shape_a": (M, -1)}, "UCF_ERR_DIM"),
        "unsorted COO": (b_swap, {}, "UCF_ERR_CRD_ORDER"),
        "duplicate COO entry": (b_dup, {}, "UCF_ERR_CRD_DUPLICATE"),
        "COO column >= dim": (b_col_range, {}, "UCF_ERR_CRD_RANGE"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_check_rejects_bad_arrays_with_the_right_code(checker, case):
    arrays, shapes, code = _bad_cases()[case]
    out = _run(checker, _input(**arrays, **shapes)).splitlines()
    assert int(out[0]) == CODES[code], out
    assert out[1].startswith("operand") or out[1].startswith("extent"), out
    assert len(out) == 2  # the kernel did not run


# ------------------------------------------------------------------ quantized operands' scales
def _quantized_check(tmp_path, fmt):
    """``NAME_check`` of an exported SpMV over a quantized ``A`` and ``x``, called through
    ctypes with the operands' own arrays: ``call(A_groups, x_groups)`` returns the code
    and message."""
    import ctypes

    from ucf.codegen.c_check import check_params, group_counts

    rng = np.random.default_rng(30)
    a = rng.standard_normal((9, 12)) * (rng.random((9, 12)) < 0.3)
    a[4] = 0  # an empty row: a stored row for dcsr is a scale group, an empty one is not
    fmts = {"A": fmt, "x": "dense@qint8"}
    k = ucf.compile("y(i) = A(i,k)*x(k)", formats=fmts, target="c")
    (lib,) = [p for p in k.save(tmp_path / "qspmv", lib="shared") if p.suffix == ".so"]
    check = ctypes.CDLL(str(lib)).qspmv_check
    check.restype = ctypes.c_int
    plan = k._plan
    ops = {
        "A": ucf.quantize(a, format=fmt),
        "x": ucf.quantize(rng.standard_normal(12), format=fmts["x"]),
    }
    tensor = {s.name: s.tensor for s in plan.cin.slots.values()}
    b = plan.blocking
    extents = {"i": 9, "k": 12} if b is None else b.split_extents({"i": 9, "k": 12})
    args = []
    params = check_params(plan.compute, "y")
    for p in params:
        kind, t = p.role[0], ops[tensor[p.role[1]]] if p.role[0] != "extent" else None
        if kind == "extent":
            args.append(ctypes.c_int64(extents[p.role[1]]))
        elif kind == "dim":
            shape = t.shape if b is None else b.split_shape(tensor[p.role[1]], t.shape)
            args.append(ctypes.c_int64(shape[p.role[2]]))
        elif kind in ("vals", "scale", "zero"):
            what = {"vals": t.vals, "scale": t.scales.scale, "zero": t.scales.zero_point}
            args.append(ctypes.c_void_p(what[kind].ctypes.data))
        else:
            args.append(ctypes.c_void_p(t.levels[p.role[2]][kind].ctypes.data))
    assert list(group_counts(params)) == ["A", "x"]

    def call(a_groups, x_groups):
        msg = ctypes.create_string_buffer(300)
        counts = [ctypes.c_int64(a_groups), ctypes.c_int64(x_groups)]
        return check(*args, *counts, msg, len(msg)), msg.value.decode()

    return call, ops


def _blocks(a, size):
    padded = np.pad(a, [(0, -d % size) for d in a.shape])
    tiles = padded.reshape(padded.shape[0] // size, size, padded.shape[1] // size, size)
    return int(tiles.any(axis=(1, 3)).sum())


@pytest.mark.parametrize(
    ("fmt", "groups"),
    [
        ("csr@qint8:0", lambda a: a.shape[0]),  # a scale per row, empty or not
        ("dcsr@quint8:0", lambda a: int(a.any(axis=1).sum())),  # per stored row
        ("csr@qint4", lambda a: 1),  # per tensor
        ("bcsr(4,4)@qint8:1", lambda a: _blocks(a, 4)),  # per stored block
    ],
)
def test_check_reports_a_scale_array_of_the_wrong_length(tmp_path, fmt, groups):
    """The scale and zero point arrays' length is one more argument of NAME_check per
    quantized operand, compared with the operand's scale groups (counted by numpy); a
    bad scale or zero point is reported too."""
    call, ops = _quantized_check(tmp_path, fmt)
    n = groups(ops["A"].to_numpy())
    assert call(n, 1) == (CODES["UCF_OK"], "")
    code, msg = call(n - 1, 1)
    assert code == CODES["UCF_ERR_SCALE"]
    assert msg.startswith("operand A: ") and f"A_groups is {n - 1}, but the format has {n}" in msg
    code, msg = call(n, 2)
    assert code == CODES["UCF_ERR_SCALE"] and "operand x: x_groups is 2" in msg
    ops["x"].scales.scale[0] = 0.0
    code, msg = call(n, 1)
    assert code == CODES["UCF_ERR_SCALE"] and "scale 0 is 0, not positive and finite" in msg
    ops["x"].scales.scale[0] = 1.0
    ops["x"].scales.zero_point[0] = 200
    code, msg = call(n, 1)
    assert code == CODES["UCF_ERR_SCALE"] and "zero point 0 is 200, outside the qint8" in msg


# ------------------------------------------------------------------ --abi taco
TACO_SPMV = r"""
#include <stdio.h>
#include <stdlib.h>
#include "spmv.h"
{arrays}
int main(void) {{
  int32_t adims[2] = {{{m}, {n}}}, xdims[1] = {{{n}}}, ydims[1] = {{{m}}};
  int32_t ord2[2] = {{0, 1}}, ord1[1] = {{0}};
  taco_mode_t csr[2] = {{taco_mode_dense, taco_mode_sparse}}, dense[1] = {{taco_mode_dense}};
  uint8_t* a0[1] = {{NULL}};
  uint8_t* a1[2] = {{(uint8_t*)pos, (uint8_t*)crd}};
  uint8_t** aidx[2] = {{a0, a1}};
  uint8_t* x0[1] = {{NULL}};
  uint8_t** xidx[1] = {{x0}};
  uint8_t* y0[1] = {{NULL}};
  uint8_t** yidx[1] = {{y0}};
  taco_tensor_t A = {{2, adims, sizeof(double), ord2, csr, aidx, (uint8_t*)vals, {nnz}}};
  taco_tensor_t x = {{1, xdims, sizeof(double), ord1, dense, xidx, (uint8_t*)xv, {n}}};
  taco_tensor_t y = {{1, ydims, sizeof(double), ord1, dense, yidx, NULL, 0}};
  if (assemble(&y, &A, &x) != 0) return 3;
  for (int rep = 0; rep < 2; rep++) if (compute(&y, &A, &x) != 0) return 4;
  double* yv = (double*)y.vals;
  for (int i = 0; i < y.vals_size; i++) printf("%.17g\n", yv[i]);
  taco_tensor_t wrong = A;
  wrong.csize = 4;
  printf("%d\n", compute(&y, &wrong, &x));
  free(y.vals);
  return 0;
}}
"""

TACO_ADD = r"""
#include <stdio.h>
#include <stdlib.h>
#include "add.h"
{arrays}
static taco_tensor_t csr(int32_t* dims, uint8_t*** idx, uint8_t** l0, uint8_t** l1,
                         const int32_t* pos, const int32_t* crd, const double* vals, int32_t nnz) {{
  static int32_t ord[2] = {{0, 1}};
  static taco_mode_t kinds[2] = {{taco_mode_dense, taco_mode_sparse}};
  l1[0] = (uint8_t*)pos; l1[1] = (uint8_t*)crd;
  idx[0] = l0; idx[1] = l1;
  taco_tensor_t t = {{2, dims, sizeof(double), ord, kinds, idx, (uint8_t*)vals, nnz}};
  return t;
}}

int main(void) {{
  int32_t dims[2] = {{{m}, {n}}};
  uint8_t* l0[3][1] = {{{{NULL}}, {{NULL}}, {{NULL}}}};
  uint8_t* l1[3][2] = {{{{NULL, NULL}}, {{NULL, NULL}}, {{NULL, NULL}}}};
  uint8_t** idx[3][2];
  taco_tensor_t A = csr(dims, idx[0], l0[0], l1[0], apos, acrd, avals, {annz});
  taco_tensor_t B = csr(dims, idx[1], l0[1], l1[1], bpos, bcrd, bvals, {bnnz});
  taco_tensor_t S = csr(dims, idx[2], l0[2], l1[2], NULL, NULL, NULL, 0);
  if (assemble(&S, &A, &B) != 0) return 3;
  if (compute(&S, &A, &B) != 0) return 4;
  const int32_t* sp = (const int32_t*)S.indices[1][0];
  const int32_t* sc = (const int32_t*)S.indices[1][1];
  const double* sv = (const double*)S.vals;
  printf("%d\n", S.vals_size);
  for (int i = 0; i < {m}; i++)
    for (int q = sp[i]; q < sp[i + 1]; q++) printf("%d %d %.17g\n", i, sc[q], sv[q]);
  free(S.indices[1][0]); free(S.indices[1][1]); free(S.vals);
  return 0;
}}
"""


def _c_array(name: str, ctype: str, values) -> str:
    items = ", ".join(repr(float(v)) if ctype == "double" else str(int(v)) for v in values)
    return f"static const {ctype} {name}[] = {{{items or 0}}};"


def test_taco_driver_runs_a_ucf_spmv(tmp_path):
    a = sp.random(11, 7, density=0.35, format="csr", random_state=8)
    x = np.linspace(-1, 2, 7)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    k.save(tmp_path / "spmv", abi="taco")
    text = (tmp_path / "spmv.h").read_text()
    assert "#ifndef TACO_TENSOR_T_DEFINED" in text
    assert "int compute(taco_tensor_t* y, taco_tensor_t* A, taco_tensor_t* x);" in text
    arrays = "\n".join(
        [
            _c_array("pos", "int32_t", a.indptr),
            _c_array("crd", "int32_t", a.indices),
            _c_array("vals", "double", a.data),
            _c_array("xv", "double", x),
        ]
    )
    driver = TACO_SPMV.format(arrays=arrays, m=11, n=7, nnz=a.nnz)
    (tmp_path / "main.c").write_text(driver)
    out = _run(_build(tmp_path, ["main.c", "spmv.c"], "main")).split()
    np.testing.assert_allclose([float(v) for v in out[:-1]], a @ x, rtol=1e-14)
    assert int(out[-1]) == CODES["UCF_ERR_ARG"]


def test_taco_driver_runs_a_ucf_sparse_add(tmp_path):
    m, n = 9, 8
    a = sp.random(m, n, density=0.3, format="csr", random_state=1)
    b = sp.random(m, n, density=0.3, format="csr", random_state=2)
    k = ucf.compile("S(i,j) = A(i,j) + B(i,j)", formats={"A": "csr", "B": "csr", "S": "csr"})
    k.save(tmp_path / "add", abi="taco")
    arrays = "\n".join(
        [
            _c_array(f"{t}{key}", ctype, getattr(mat, attr))
            for t, mat in (("a", a), ("b", b))
            for key, ctype, attr in (
                ("pos", "int32_t", "indptr"),
                ("crd", "int32_t", "indices"),
                ("vals", "double", "data"),
            )
        ]
    ).replace("static const int32_t", "static int32_t")
    driver = TACO_ADD.format(arrays=arrays, m=m, n=n, annz=a.nnz, bnnz=b.nnz)
    (tmp_path / "main.c").write_text(driver)
    out = _run(_build(tmp_path, ["main.c", "add.c"], "main")).splitlines()
    expected = (a + b).tocsr()
    expected.sum_duplicates()
    assert int(out[0]) == expected.nnz
    got = np.zeros((m, n))
    for line in out[1:]:
        i, j, v = line.split()
        got[int(i), int(j)] = float(v)
    np.testing.assert_allclose(got, expected.toarray(), rtol=1e-15)


def test_taco_abi_refuses_what_taco_tensor_t_cannot_hold(tmp_path):
    coo = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "coo"})
    with pytest.raises(UcfError, match="dense .U. and compressed .C. levels only"):
        coo.save(tmp_path / "k", abi="taco")
    wide = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, index_dtype="int64")
    with pytest.raises(UcfError, match="int32 indices"):
        wide.save(tmp_path / "k", abi="taco")
    with pytest.raises(UcfError, match="unknown ABI"):
        wide.save(tmp_path / "k", abi="mkl")


def test_cli_writes_the_taco_abi(tmp_path):
    from ucf.cli import main

    args = ["compile", "y(i) = A(i,j) * x(j)", "-f", "A:csr", "-o", str(tmp_path / "t")]
    assert main([*args, "--abi", "taco"]) == 0
    assert "int assemble(taco_tensor_t* y" in (tmp_path / "t.h").read_text()
    assert (tmp_path / "ucf.h").exists()
