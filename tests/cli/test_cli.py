"""The ``ucf`` command line: output, files written, and exit status contract (0/1/2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

import ucf
from ucf.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPMV = "y(i) = A(i,j) * x(j)"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ucf-cache"))


@pytest.fixture
def files(tmp_path):
    """A 6x5 sparse matrix in .mtx and a dense vector in .npy, plus their product."""
    A = sp.random(6, 5, density=0.4, format="csr", random_state=1)
    x = np.arange(1.0, 6.0)
    scipy.io.mmwrite(tmp_path / "A.mtx", A)
    np.save(tmp_path / "x.npy", x)
    return tmp_path, A, x


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _fails(capsys, *argv: str) -> str:
    status, out, err = _run(capsys, *argv)
    assert status == 1, (out, err)
    assert err.startswith("ucf: error: ")
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------------- compile


def test_compile_prints_cin_by_default(capsys):
    status, out, _ = _run(capsys, "compile", SPMV, "-f", "A:csr")
    assert status == 0
    assert "forall(i" in out and "y(i)" in out


def test_compile_print_source_and_llir(capsys):
    status, out, _ = _run(capsys, "compile", SPMV, "-f", "A:csr", "--print", "source")
    assert status == 0
    assert "define void" in out  # LLVM IR for the default target
    status, out, _ = _run(capsys, "compile", SPMV, "-f", "A:UC:1,0", "--print", "llir")
    assert status == 0
    assert "A1_crd" in out and "func kernel(" in out and " in [" in out


def test_compile_save_writes_c_and_header(capsys, tmp_path):
    prefix = tmp_path / "out" / "spmv"
    status, out, _ = _run(capsys, "compile", SPMV, "-f", "A:csr", "-o", str(prefix))
    assert status == 0
    c, h = prefix.with_suffix(".c"), prefix.with_suffix(".h")
    assert c.exists() and h.exists()
    assert str(c) in out and str(h) in out
    assert '#include "spmv.h"' in c.read_text()


# --------------------------------------------------------------------------- run


def test_run_mtx_npy_prints_summary(capsys, files):
    d, A, x = files
    status, out, _ = _run(capsys, "run", SPMV, "-i", f"A:{d / 'A.mtx'}", "-i", f"x:{d / 'x.npy'}")
    assert status == 0
    assert "y: shape (6,)" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("  y(")]
    got = [float(ln.split("=")[1]) for ln in lines]
    np.testing.assert_allclose(got, A @ x)


def test_run_writes_output_and_converts_format(capsys, files):
    d, A, x = files
    dest = d / "y.npy"
    argv = ["run", SPMV, "-f", "A:csc", "-i", f"A:{d / 'A.mtx'}", "-i", f"x:{d / 'x.npy'}"]
    status, _, _ = _run(capsys, *argv, "-o", f"y:{dest}")
    assert status == 0
    np.testing.assert_allclose(np.load(dest), A @ x)


def test_run_sparse_output_to_mtx(capsys, files):
    d, A, _ = files
    dest = d / "S.mtx"
    argv = ["run", "S(i,j) = A(i,j) + B(i,j)", "-f", "S:csr"]
    argv += ["-i", f"A:{d / 'A.mtx'}", "-i", f"B:{d / 'A.mtx'}", "-o", f"S:{dest}"]
    status, _, _ = _run(capsys, *argv)
    assert status == 0
    np.testing.assert_allclose(scipy.io.mmread(dest).toarray(), 2 * A.toarray())
    assert ucf.read(dest).shape == (6, 5)


def test_run_time(capsys, files):
    d, _, _ = files
    argv = ["run", SPMV, "-i", f"A:{d / 'A.mtx'}", "-i", f"x:{d / 'x.npy'}", "--time", "3"]
    status, out, _ = _run(capsys, *argv)
    assert status == 0
    assert re.search(r"time: median [\d.e+-]+ ms per call \(samples [\d.e+-]+ \.\. ", out)
    assert re.search(r"; (\d+) samples of \d+ calls?; load average", out)
    assert 3 <= int(re.search(r"; (\d+) samples", out).group(1)) <= 9


# --------------------------------------------------------------------------- errors


def test_parse_error_keeps_caret(capsys):
    err = _fails(capsys, "compile", "y(i) = A(i,j * x(j)")
    assert "^" in err and "column" in err


def test_unknown_tensor_in_format(capsys):
    err = _fails(capsys, "compile", SPMV, "-f", "Q:csr")
    assert "Q" in err and len(err.strip().splitlines()) == 1


def test_bad_format_string(capsys):
    err = _fails(capsys, "compile", SPMV, "-f", "A:cxr")
    assert "cxr" in err and len(err.strip().splitlines()) == 1


def test_missing_input_file(capsys, files):
    d, _, _ = files
    err = _fails(capsys, "run", SPMV, "-i", f"A:{d / 'A.mtx'}", "-i", f"x:{d / 'nope.npy'}")
    assert "nope.npy" in err and len(err.strip().splitlines()) == 1


def test_shape_mismatch(capsys, files):
    d, _, _ = files
    np.save(d / "short.npy", np.ones(3))
    err = _fails(capsys, "run", SPMV, "-i", f"A:{d / 'A.mtx'}", "-i", f"x:{d / 'short.npy'}")
    assert "j" in err and len(err.strip().splitlines()) == 1


def test_output_file_must_name_output(capsys, files):
    d, _, _ = files
    argv = ["run", SPMV, "-i", f"A:{d / 'A.mtx'}", "-i", f"x:{d / 'x.npy'}"]
    _fails(capsys, *argv, "-o", f"z:{d / 'z.npy'}")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["compile"],
        ["compile", SPMV, "-f", "A"],
        ["compile", SPMV, "--target", "fpga"],
        ["run", SPMV],  # -i is required
        ["run", SPMV, "-i", "A:a.mtx", "--time", "0"],
        ["run", SPMV, "-i", "A:a.mtx", "--emulate"],
    ],
)
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_help_has_examples(capsys):
    for cmd in ("compile", "run", "demo"):
        with pytest.raises(SystemExit) as info:
            main([cmd, "--help"])
        assert info.value.code == 0
        assert "example" in capsys.readouterr().out


# --------------------------------------------------------------------------- demo


def test_demo_small(capsys):
    status, out, _ = _run(capsys, "demo", "--size", "300")
    assert status == 0
    for name in ("SpMV", "SpMM", "Add", "MTTKRP"):
        assert name in out
    assert "FAIL" not in out


# --------------------------------------------------------------------------- subprocess


def _subprocess(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["UCF_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "ucf", *argv], capture_output=True, text=True, env=env, timeout=120
    )


def test_subprocess_exit_status(tmp_path, files):
    d, A, x = files
    ok = _subprocess(tmp_path, "run", SPMV, "-i", f"A:{d / 'A.mtx'}", "-i", f"x:{d / 'x.npy'}")
    assert ok.returncode == 0, ok.stderr
    assert "y: shape (6,)" in ok.stdout

    bad = _subprocess(tmp_path, "compile", SPMV, "-f", "A:cxr")
    assert bad.returncode == 1
    assert bad.stderr.startswith("ucf: error: ") and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr

    usage = _subprocess(tmp_path, "compile")
    assert usage.returncode == 2
    assert "usage: ucf compile" in usage.stderr

    version = _subprocess(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"ucf {ucf.__version__}"


def test_a_reader_that_stops_early_is_no_error(tmp_path):
    """`ucf compile ... --print source | head -1`: no "Broken pipe" error, status 0."""
    env = dict(os.environ, UCF_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "ucf", "compile", SPMV, "-f", "A:csr", "--print", "source"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # before ucf writes (importing and compiling take far longer)
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""


def test_run_tns_mttkrp(capsys, tmp_path):
    rng = np.random.default_rng(0)
    coords = np.array([[0, 1, 2], [1, 0, 0], [2, 2, 1], [2, 0, 2]])
    vals = rng.random(4)
    B = ucf.from_coo(coords, vals, (3, 3, 3), "csf")
    ucf.write(tmp_path / "B.tns", B)
    C, D = rng.random((3, 2)), rng.random((3, 2))
    np.save(tmp_path / "C.npy", C)
    np.save(tmp_path / "D.npy", D)
    dest = tmp_path / "A.npy"
    argv = ["run", "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)", "-f", "B:csf"]
    for name in "BCD":
        suffix = "tns" if name == "B" else "npy"
        argv += ["-i", f"{name}:{tmp_path / f'{name}.{suffix}'}"]
    status, _, err = _run(capsys, *argv, "-o", f"A:{dest}")
    assert status == 0, err
    dense = np.zeros((3, 3, 3))
    dense[tuple(coords.T)] = vals
    np.testing.assert_allclose(np.load(dest), np.einsum("ikl,kj,lj->ij", dense, C, D))


def test_run_extent_for_lhs_only_variable(capsys, files):
    d, _, x = files
    err = _fails(capsys, "run", "A(i,j) = x(i)", "-i", f"x:{d / 'x.npy'}")
    assert "--extent j=N" in err
    status, out, _ = _run(
        capsys, "run", "A(i,j) = x(i)", "-i", f"x:{d / 'x.npy'}", "--extent", "j=2"
    )
    assert status == 0 and "shape (5, 2)" in out


def test_run_input_names_checked(capsys, files):
    d, _, _ = files
    a, x = f"A:{d / 'A.mtx'}", f"x:{d / 'x.npy'}"
    assert "does not read" in _fails(capsys, "run", SPMV, "-i", a, "-i", x, "-i", f"z:{x[2:]}")
    assert "-i x:FILE" in _fails(capsys, "run", SPMV, "-i", a)
    assert "output" in _fails(capsys, "run", SPMV, "-i", a, "-i", x, "-i", f"y:{x[2:]}")


def test_an_input_of_the_wrong_order_is_said_as_the_api_says_it(capsys, files):
    """A 2-D .npy for x(j): the order, not the format's levels (issue 32)."""
    path, _, _ = files
    np.save(path / "x2.npy", np.ones((5, 5)))
    err = _fails(
        capsys,
        "run",
        "y(i) = A(i,j) * x(j)",
        "-i",
        f"A:{path / 'A.mtx'}",
        "-i",
        f"x:{path / 'x2.npy'}",
    )
    assert "operand x has order 2 (shape (5, 5)) but is accessed with 1 index" in err
