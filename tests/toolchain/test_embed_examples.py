"""examples/embed_c and examples/embed_cpp build with their Makefiles and
CMakeLists.txt under -Wall -Werror and ASan/UBSan, run on the sample matrix,
and print what scipy computes.

The make builds generate the kernels with ``python -m ucf compile``; the
default CMake builds reuse that directory (UCF_KERNELS) to keep the suite
fast, and a slow test runs CMake's own generation from scratch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.io

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
MATRIX = EXAMPLES / "embed_c" / "matrix.mtx"
SANITIZE = "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
NCOLS = 4  # as in the examples

pytestmark = pytest.mark.skipif(
    not (shutil.which("make") and shutil.which("cc") and shutil.which("g++")),
    reason="needs make, cc and g++",
)
needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "ASAN_OPTIONS": "detect_leaks=1"}


def _sh(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=_env())
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _check_output(stdout: str) -> None:
    a = scipy.io.mmread(MATRIX).tocsr()
    n = a.shape[1]
    x = 1.0 + 0.5 * np.arange(n)
    b = ((np.arange(n)[:, None] + 2 * np.arange(NCOLS)[None, :]) % 5) - 1.5
    y = np.zeros(a.shape[0])
    c = np.zeros((a.shape[0], NCOLS))
    for line in stdout.splitlines():
        word = line.split()
        if word[0] == "y":
            y[int(word[1])] = float(word[2])
        elif word[0] == "C":
            c[int(word[1]), int(word[2])] = float(word[3])
    np.testing.assert_allclose(y, a @ x, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(c, a @ b, rtol=1e-13, atol=1e-14)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """The kernels both Makefiles generate, into one directory."""
    return tmp_path_factory.mktemp("kernels")


def _make(example: str, kernels: Path, tmp: Path) -> Path:
    exe = tmp / example
    flags = {
        "CFLAGS": f"-O1 -std=c99 -Wall -Werror -fopenmp {SANITIZE}",
        "CXXFLAGS": f"-O1 -std=c++17 -Wall -Werror -fopenmp {SANITIZE}",
    }
    cmd = ["make", "-s", f"PYTHON={sys.executable}", f"BUILD={kernels}"]
    cmd += [f"{k}={v}" for k, v in flags.items()]
    _sh([*cmd, f"{example}"], EXAMPLES / example)
    shutil.move(EXAMPLES / example / example, exe)  # keep the source tree clean
    return exe


@pytest.mark.parametrize("example", ["embed_c", "embed_cpp"])
def test_example_builds_with_make_and_matches_scipy(example, kernels, tmp_path):
    exe = _make(example, kernels, tmp_path)
    _check_output(_sh([str(exe), str(MATRIX)], tmp_path))


def _cmake(example: str, build: Path, *defines: str) -> Path:
    _sh(
        [
            "cmake",
            "-S",
            str(EXAMPLES / example),
            "-B",
            str(build),
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DCMAKE_C_FLAGS={SANITIZE}",
            f"-DCMAKE_CXX_FLAGS={SANITIZE}",
            *defines,
        ],
        build.parent,
    )
    _sh(["cmake", "--build", str(build)], build.parent)
    return build / example


@needs_cmake
@pytest.mark.slow  # the make build of the same examples runs in the quick suite
@pytest.mark.parametrize("example", ["embed_c", "embed_cpp"])
def test_example_builds_with_cmake_and_matches_scipy(example, kernels, tmp_path):
    if not (kernels / "spmm.c").exists():
        _make(example, kernels, tmp_path)
    exe = _cmake(example, tmp_path / "build", f"-DUCF_KERNELS={kernels}")
    _check_output(_sh([str(exe), str(MATRIX)], tmp_path))


@needs_cmake
@pytest.mark.slow
def test_cmake_generates_the_kernels_itself(tmp_path):
    exe = _cmake("embed_c", tmp_path / "build")
    assert (tmp_path / "build" / "kernels" / "ucf.h").exists()
    _check_output(_sh([str(exe), str(MATRIX)], tmp_path))
