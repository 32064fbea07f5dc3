"""Exported kernels in programs built outside Python: two kernels link into one C
program and one C++ program, from source and from static and shared libraries,
and agree with numpy and scipy."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.exec.inspection import export_name

CC, CXX = shutil.which("cc"), shutil.which("g++")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler")

A = sp.random(9, 7, density=0.3, format="csr", random_state=5)
X = np.arange(1.0, 8.0)
B = np.arange(21.0).reshape(7, 3) / 4


def _literal(name: str, ctype: str, values) -> str:
    items = ", ".join(repr(float(v)) if "double" in ctype else str(int(v)) for v in values)
    return f"static const {ctype} {name}[] = {{{items}}};"


DRIVER = """
#include <stdio.h>
#include <stdint.h>
#include "spmv.h"
#include "spmm.h"
{arrays}
int main(void) {{
  double y[9] = {{0}}, C[27] = {{0}};
  spmv(9, 7, 9, 7, A1_pos, A1_crd, A_vals, 7, x, 9, y);
  matmul(9, 7, 3, 9, 7, A1_pos, A1_crd, A_vals, 7, 3, B, 9, 3, C);
  for (int q = 0; q < 9; q++) printf("%.17g\\n", y[q]);
  for (int q = 0; q < 27; q++) printf("%.17g\\n", C[q]);
  return 0;
}}
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, target="c").save(d / "spmv")
    ucf.compile("C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr"}, target="c").save(
        d / "spmm", name="matmul"
    )
    arrays = "\n".join(
        [
            _literal("A1_pos", "int32_t", A.indptr),
            _literal("A1_crd", "int32_t", A.indices),
            _literal("A_vals", "double", A.data),
            _literal("x", "double", X),
            _literal("B", "double", B.ravel()),
        ]
    )
    return d, DRIVER.format(arrays=arrays)


def _check(stdout: str) -> None:
    got = np.array([float(v) for v in stdout.split()])
    np.testing.assert_allclose(got[:9], A @ X, rtol=1e-15)
    np.testing.assert_allclose(got[9:].reshape(9, 3), A @ B, rtol=1e-15)


def _run(cmd: list[str], cwd: Path, exe: Path, env=None) -> str:
    build = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_two_kernels_link_into_one_c_program(exported):
    d, driver = exported
    (d / "main.c").write_text(driver)
    flags = ["-std=c99", "-Wall", "-Werror", "-fopenmp", "-fsanitize=address,undefined"]
    cmd = [CC, *flags, "main.c", "spmv.c", "spmm.c", "-lm", "-o", "main"]
    _check(_run(cmd, d, d / "main", env={"ASAN_OPTIONS": "detect_leaks=0"}))


@pytest.mark.skipif(CXX is None, reason="needs g++")
def test_the_headers_are_cpp_and_link_from_cpp(exported):
    d, driver = exported
    (d / "main.cpp").write_text(driver)
    objs = []
    for stem in ("spmv", "spmm"):
        obj = d / f"{stem}.o"
        proc = subprocess.run(
            [CC, "-std=c99", "-O2", "-fopenmp", "-c", f"{stem}.c", "-o", str(obj)],
            cwd=d,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        objs.append(str(obj))
    cmd = [CXX, "-std=c++17", "-Wall", "-Werror", "-fopenmp", "main.cpp", *objs, "-o", "maincc"]
    _check(_run(cmd, d, d / "maincc"))


@pytest.mark.parametrize("kind", ["static", "shared"])
def test_libraries(tmp_path, kind):
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, target="c")
    _, _, lib = k.save(tmp_path / "spmv", lib=kind)
    assert lib.name == f"libspmv.{'a' if kind == 'static' else 'so'}" and lib.exists()
    k2 = ucf.compile("C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr"}, target="c")
    k2.save(tmp_path / "spmm", name="matmul", lib=kind)
    arrays = "\n".join(
        [
            _literal("A1_pos", "int32_t", A.indptr),
            _literal("A1_crd", "int32_t", A.indices),
            _literal("A_vals", "double", A.data),
            _literal("x", "double", X),
            _literal("B", "double", B.ravel()),
        ]
    )
    (tmp_path / "main.c").write_text(DRIVER.format(arrays=arrays))
    cmd = [CC, "-std=c99", "main.c", f"-L{tmp_path}", "-lspmv", "-lmatmul", "-fopenmp", "-lm"]
    cmd += ["-o", "main"]
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    _check(_run(cmd, tmp_path, tmp_path / "main", env=env))


def test_header_declares_the_abi_version_and_cpp_linkage(tmp_path):
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    c, h = k.save(tmp_path / "my-kernel.v2")
    assert (c.name, h.name) == ("my-kernel.v2.c", "my-kernel.v2.h")  # the dot is kept
    assert k.save(tmp_path / "spmv.c")[0].name == "spmv.c"  # a .c given is not doubled
    assert (tmp_path / "ucf.h").exists() and '#include "ucf.h"' in h.read_text()
    text = h.read_text()
    assert "#define UCF_MY_KERNEL_V2_ABI_VERSION 2" in text
    assert 'extern "C" {' in text and "void my_kernel_v2(" in text


@pytest.mark.parametrize(
    "text, name", [("spmv", "spmv"), ("my-kernel", "my_kernel"), ("2d", "k2d"), ("", "kernel")]
)
def test_export_names_are_c_identifiers(text, name):
    assert export_name(text) == name


def test_cli_names_and_builds(tmp_path, capsys):
    from ucf.cli import main

    status = main(
        [
            "compile",
            "y(i) = A(i,j) * x(j)",
            "-f",
            "A:csr",
            "-o",
            str(tmp_path / "k"),
            "--name",
            "spmv",
            "--lib",
            "static",
        ]
    )
    assert status == 0
    assert (tmp_path / "libspmv.a").exists() and "void spmv(" in (tmp_path / "k.h").read_text()
    assert main(["compile", "y(i) = A(i,j) * x(j)", "--lib", "static"]) == 1
    assert "add -o PREFIX" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["csr", "dcsr"])
def test_sparse_output_kernels_compile_warning_free(tmp_path, fmt):
    """Lowering may declare a coordinate it never reads; the C printer leaves it out,
    so exported sparse additions build under -Wall -Werror."""
    k = ucf.compile("C(i,j) = A(i,j) + B(i,j)", formats={"A": fmt, "B": "coo", "C": fmt})
    c, _ = k.save(tmp_path / "add")
    cmd = [CC, "-std=c99", "-Wall", "-Werror", "-fopenmp", "-c", str(c), "-o", "add.o"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
