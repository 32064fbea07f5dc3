"""Fixtures shared by every test folder; plain helpers live in ``tests/helpers.py``."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import settings

import ucf
from tests.helpers import CC, TARGETS
from ucf.toolchain.jit import num_threads

# The suite's hypothesis profile (tests/helpers.py): the same examples every run.
# ``--hypothesis-profile=explore`` (hypothesis' pytest plugin) replaces it.
settings.load_profile("ci")


@pytest.fixture(scope="session", autouse=True)
def _always_parallel():
    """Parallel loops start their threads whatever the input size, so that small test
    inputs exercise them (the default threshold would run them serially)."""
    old = os.environ.get("UCF_WORK_THRESHOLD")
    os.environ["UCF_WORK_THRESHOLD"] = "0"
    yield
    if old is None:
        os.environ.pop("UCF_WORK_THRESHOLD", None)
    else:
        os.environ["UCF_WORK_THRESHOLD"] = old


@pytest.fixture(scope="session", autouse=True)
def _ucf_cache_dir(tmp_path_factory):
    """Point the kernel cache at a fresh per-session directory."""
    path = tmp_path_factory.mktemp("ucf-cache")
    old = os.environ.get("UCF_CACHE_DIR")
    os.environ["UCF_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("UCF_CACHE_DIR", None)
    else:
        os.environ["UCF_CACHE_DIR"] = old


@pytest.fixture(params=TARGETS)
def target(request):
    return request.param


@pytest.fixture(autouse=True)
def _thread_count_restored():
    """Every test leaves the thread count as it found it: fixtures that set one thread
    without restoring it (tests/tuning's) changed what later tests of the same worker
    compiled, and test_registers' work-threshold test failed after them."""
    before = num_threads()
    yield
    if num_threads() != before:
        ucf.set_num_threads(before)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Runs a test on one thread and on two (``_thread_count_restored`` restores the
    count after it)."""
    ucf.set_num_threads(request.param)
    return request.param


@pytest.fixture(scope="session")
def device():
    """A CUDA device through pycuda, with nvcc to build for it; ``gpu`` tests skip
    without one."""
    pytest.importorskip("pycuda")
    try:
        import pycuda.autoinit  # noqa: F401
    except Exception as e:  # no driver or no device
        pytest.skip(f"no CUDA device: {e}")
    from ucf.toolchain.cuda_build import nvcc_path

    if nvcc_path() is None:
        pytest.skip("needs nvcc")


@pytest.fixture(scope="session")
def asan_cc(tmp_path_factory):
    if CC is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("asan-probe")
    (d / "t.c").write_text(
        "#include <stdlib.h>\nint main(void){char *p = malloc(4); p[0] = 0; free(p); return 0;}\n"
    )
    proc = subprocess.run(
        [CC, "-fsanitize=address", "-g", str(d / "t.c"), "-o", str(d / "t")],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cc lacks AddressSanitizer support: {proc.stderr.strip()[:200]}")
    run = subprocess.run([str(d / "t")], capture_output=True, text=True)
    if run.returncode != 0:
        pytest.skip(f"ASan programs do not run here: {run.stderr.strip()[:200]}")
    return CC
