"""The CUDA runtime: device helpers (runtime/ucf_cuda.cuh), the CPU emulator
(runtime/ucf_cuda_emu.h) and the builders in ucf/toolchain/cuda_build.py.

The test kernels live in tests/toolchain/cuda/runtime_kernels.cu. Its launchers take
pointers and int64 scalars only, so the ``check_*`` functions below run them
unchanged on the emulator (numpy arrays in host memory) and, in the gpu-marked
test, on a real device (pycuda copies of the same arrays).
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ucf.errors import CompileError
from ucf.toolchain.cuda_build import build_device, build_emulated, nvcc_check, nvcc_path

KERNELS = Path(__file__).parent / "cuda" / "runtime_kernels.cu"

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")

#: A launcher call: name, then arrays and ints; returns ucf_launch_error().
Run = Callable[..., int]


def _c_arg(a):
    if isinstance(a, np.ndarray):
        assert a.flags.c_contiguous
        return ctypes.c_void_p(a.ctypes.data)
    return ctypes.c_int64(a)


class Emulated:
    """The emulator build; arrays are passed as host pointers and updated in place."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.ucf_emu_message.restype = ctypes.c_char_p

    def __call__(self, name: str, *args) -> int:
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        return fn(*[_c_arg(a) for a in args])

    def message(self) -> str:
        return self.lib.ucf_emu_message().decode()


class Device:
    """The nvcc build; arrays go to the device and come back into the same numpy arrays."""

    def __init__(self, path: Path, gpuarray):
        self.lib = ctypes.CDLL(str(path))
        self.gpuarray = gpuarray

    def __call__(self, name: str, *args) -> int:
        dev = [self.gpuarray.to_gpu(a) if isinstance(a, np.ndarray) else None for a in args]
        c_args = [
            ctypes.c_void_p(int(d.gpudata)) if d is not None else ctypes.c_int64(a)
            for a, d in zip(args, dev, strict=True)
        ]
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        rc = fn(*c_args)
        for a, d in zip(args, dev, strict=True):
            if d is not None:
                d.get(a)
        return rc


@pytest.fixture(scope="module")
def emu(tmp_path_factory) -> Emulated:
    so = tmp_path_factory.mktemp("cuda-emu") / "runtime_kernels.so"
    so.write_bytes(build_emulated(KERNELS.read_text()))
    return Emulated(so)


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# ---- segReduceGroup and atomicAddGroup -----------------------------------------

GROUPS = [1, 2, 4, 8, 16, 32]
DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64}
THREADS = 128
#: Four blocks of four warps; the last block is partial, so its tail lanes are
#: inactive through the kernel's bounds check as well.
LANES = 4 * THREADS - 20


def pattern(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Adversarial destination indices (idx < 0 is inactive)."""
    lane = np.arange(n)
    if name == "same":
        return np.full(n, 3)
    if name == "distinct":
        return rng.permutation(n)
    if name.startswith("run"):
        return lane // int(name[3:])
    if name == "tail_inactive":
        return np.where(lane % 32 >= 27, -1, lane // 3)
    if name == "holes":
        return np.where(rng.random(n) < 0.3, -1, lane // 2)
    if name == "recurring":  # equal idx in non-adjacent lanes: 5, 7, 5 are three segments
        return rng.integers(0, 3, n)
    if name == "sorted":  # like the row indices of a CSR matrix's nonzeros
        return np.sort(rng.integers(0, n // 6, n))
    if name == "none":
        return np.full(n, -1)
    raise AssertionError(name)


PATTERNS = [
    "same",
    "distinct",
    "run1",
    "run2",
    "run3",
    "run31",
    "tail_inactive",
    "holes",
    "recurring",
    "sorted",
    "none",
]


def check_group(run: Run, helper: str, dtype: str, g: int, name: str) -> None:
    rng = _rng(helper, dtype, g, name)
    n = LANES
    if helper == "seg_reduce":
        idx = pattern(name, n, rng)
    else:  # atomicAddGroup: one idx per tile, and lanes with a negative idx add nothing
        idx = np.repeat(pattern(name, -(-n // g), rng), g)[:n]
        if name == "holes":  # idle lanes inside active tiles, the tile's first lane too
            idx = np.where(rng.random(n) < 0.3, -1, idx)
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    val = rng.integers(-9, 10, n).astype(DTYPES[dtype])
    out = np.full(n + 1, 5, dtype=DTYPES[dtype])
    expected = out.copy()
    np.add.at(expected, idx[idx >= 0], val[idx >= 0])
    assert run(f"{helper}_{dtype}_g{g}", out, idx, val, n, THREADS) == 0
    np.testing.assert_array_equal(out, expected, err_msg=f"{helper} G={g} {dtype} {name}")


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("helper", ["seg_reduce", "atomic_group"])
def test_group_helpers(emu, helper, dtype, g, name):
    check_group(emu, helper, dtype, g, name)


# ---- warp, tile and block semantics --------------------------------------------


def check_warp_sum(run: Run) -> None:
    x = _rng("warp_sum").integers(-50, 50, 3 * 128).astype(np.float64)
    out = np.zeros(3 * 4)
    assert run("warp_sum", out, x, 3, 128) == 0
    np.testing.assert_array_equal(out, x.reshape(-1, 32).sum(1))


def check_shuffle_modes(run: Run) -> None:
    blocks, threads = 2, 64
    n = blocks * threads
    v = _rng("shuffle").integers(-1000, 1000, n).astype(np.int32)
    out = np.zeros((10, n), dtype=np.int64)
    assert run("shuffle_modes", out, v, blocks, threads) == 0
    i = np.arange(n)
    lane = i % 32
    warp = i - lane

    def seg(width):  # first lane (warp-relative) of each lane's width-lane segment
        return lane - lane % width

    wide = (v.astype(np.int64) << 32) | ((v.astype(np.int64) + 1) & 0xFFFFFFFF)
    xor12 = lane ^ 12
    expected = [
        v[warp + (lane * 7 + 3) % 32],
        v[warp + seg(16) + 3],
        np.where(lane >= 3, v[np.maximum(i - 3, 0)], v),
        np.where(lane % 8 >= 2, v[np.maximum(i - 2, 0)], v),
        np.where(lane + 5 < 32, v[np.minimum(i + 5, n - 1)], v),
        np.where(lane % 8 + 3 < 8, v[np.minimum(i + 3, n - 1)], v),
        v[warp + (lane ^ 6)],
        # xor may read an earlier segment, but a later one returns the own value
        np.where(xor12 < seg(8) + 8, v[warp + np.minimum(xor12, 31)], v),
        v.reshape(-1, 8).sum(1).repeat(8),
        np.where(lane < 31, wide[np.minimum(i + 1, n - 1)], wide),
    ]
    for mode, want in enumerate(expected):
        np.testing.assert_array_equal(out[mode], want, err_msg=f"mode {mode}")


def check_scan(run: Run) -> None:
    x = _rng("scan").integers(-9, 10, 2 * 64).astype(np.int64)
    warp_out, tile_out = np.zeros_like(x), np.zeros_like(x)
    assert run("scan", warp_out, tile_out, x, 2, 64) == 0
    np.testing.assert_array_equal(warp_out, x.reshape(-1, 32).cumsum(1).ravel())
    np.testing.assert_array_equal(tile_out, x.reshape(-1, 8).cumsum(1).ravel())


def check_ballot(run: Run) -> None:
    blocks, threads = 2, 96
    n = blocks * threads
    pred = (_rng("ballot").random(n) < 0.5).astype(np.int32)
    pred[:8] = 1  # one all-true tile
    pred[8:16] = 0  # one all-false tile
    pred[32:64] = 0  # an all-false warp
    out = np.zeros(n // 32, dtype=np.int64)
    tiles = np.zeros((n // 8, 3), dtype=np.int64)
    assert run("ballot", out, tiles, pred, blocks, threads) == 0
    np.testing.assert_array_equal(out, (pred.reshape(-1, 32) << np.arange(32)).sum(1))
    t = pred.reshape(-1, 8)
    np.testing.assert_array_equal(tiles[:, 0], (t << np.arange(8)).sum(1))
    np.testing.assert_array_equal(tiles[:, 1], t.any(1))
    np.testing.assert_array_equal(tiles[:, 2], t.all(1))


def check_exchange(run: Run) -> None:
    blocks, threads = 3, 96
    x = _rng("exchange").integers(-1000, 1000, blocks * threads).astype(np.int32)
    warp_out, tile_out = np.zeros_like(x), np.zeros_like(x)
    assert run("exchange", warp_out, tile_out, x, blocks, threads) == 0
    np.testing.assert_array_equal(warp_out, np.roll(x.reshape(-1, 32), -1, axis=1).ravel())
    np.testing.assert_array_equal(tile_out, 2 * np.roll(x.reshape(-1, 8), -1, axis=1).ravel())


def check_block_sum(run: Run) -> None:
    x = _rng("block_sum").integers(-99, 100, 5 * 256).astype(np.float64)
    out = np.zeros(5)
    assert run("block_sum", out, x, 5, 256) == 0
    np.testing.assert_array_equal(out, x.reshape(5, 256).sum(1))


def check_reverse(run: Run) -> None:
    x = np.arange(3 * 96, dtype=np.float32)
    out = np.zeros_like(x)
    assert run("reverse", out, x, 3, 96) == 0
    np.testing.assert_array_equal(out, x.reshape(3, 96)[:, ::-1].ravel())


def check_layout(run: Run) -> None:
    gx, gy, bx, by, bz = 3, 2, 8, 4, 2
    per_block = bx * by * bz
    nblocks = gx * gy
    out = np.zeros((nblocks * per_block, 7), dtype=np.int64)
    assert run("layout", out, gx, gy, bx, by, bz) == 0
    t = np.tile(np.arange(per_block), nblocks)
    b = np.repeat(np.arange(nblocks), per_block)
    want = np.stack(
        [t, t - t % 32, b, np.full_like(t, per_block), t // 32, t % 32 // 8, np.full_like(t, 4)],
        axis=1,
    )
    np.testing.assert_array_equal(out, want)


HISTOGRAMS = {
    "i32": (np.int32, 1, 4),
    "u32": (np.uint32, 1, 4),
    "u64": (np.uint64, 2**40, 2**41),
    "f32": (np.float32, -3, 4),
    "f64": (np.float64, -3, 4),
    "i64": (np.int64, -(2**40), 2**40),
}


def check_histogram(run: Run, kind: str) -> None:
    dtype, lo, hi = HISTOGRAMS[kind]
    rng = _rng("histogram", kind)
    n = 64 * 128 - 7  # 64 blocks: they run concurrently on several OS threads
    keys = rng.integers(0, 16, n).astype(np.int32)
    weights = rng.integers(lo, hi, n).astype(dtype)
    hist = np.zeros(16, dtype=dtype)
    assert run(f"histogram_{kind}", hist, keys, weights, n, 128) == 0
    want = np.zeros(16, dtype=dtype)
    np.add.at(want, keys, weights)
    np.testing.assert_array_equal(hist, want)


def check_bounds(run: Run) -> None:
    rng = _rng("bounds")
    a = np.sort(rng.integers(0, 40, 100)).astype(np.int32)
    keys = np.arange(-2, 43, dtype=np.int64)
    lower, upper = np.zeros_like(keys), np.zeros_like(keys)
    assert run("bounds", lower, upper, a, len(a), keys, len(keys)) == 0
    np.testing.assert_array_equal(lower, np.searchsorted(a, keys, "left"))
    np.testing.assert_array_equal(upper, np.searchsorted(a, keys, "right"))


SEMANTICS = [
    check_warp_sum,
    check_shuffle_modes,
    check_scan,
    check_ballot,
    check_exchange,
    check_block_sum,
    check_reverse,
    check_layout,
    check_bounds,
]


@pytest.mark.parametrize("check", SEMANTICS, ids=lambda c: c.__name__[6:])
def test_semantics(emu, check):
    check(emu)


@pytest.mark.parametrize("threads", ["1", "4"])
@pytest.mark.parametrize("kind", list(HISTOGRAMS))
def test_histogram_atomics(emu, monkeypatch, kind, threads):
    monkeypatch.setenv("UCF_EMU_THREADS", threads)
    check_histogram(emu, kind)


def test_search_helpers_on_host(emu):
    a = np.array([1, 1, 2, 5, 5, 5, 9], dtype=np.int64)
    keys = np.arange(-1, 11, dtype=np.int64)
    lower, upper = np.zeros_like(keys), np.zeros_like(keys)
    assert emu("bounds_host", lower, upper, a, len(a), keys, len(keys)) == 0
    np.testing.assert_array_equal(lower, np.searchsorted(a, keys, "left"))
    np.testing.assert_array_equal(upper, np.searchsorted(a, keys, "right"))


def test_read_outside_mask_is_poisoned(emu):
    out = np.zeros(32, dtype=np.int64)
    assert emu("outside_mask", out) == 0
    lane = np.arange(32)
    np.testing.assert_array_equal(out[:8], lane[:8] + 8)
    assert (out[8:16].view(np.uint64) == 0x7FF4DEAD7FA0DEAD).all()
    assert np.isnan(out[8:16].view(np.float64)).all()
    np.testing.assert_array_equal(out[16:], lane[16:])


# ---- misuse: reported, never a hang ---------------------------------------------

_MISUSE_SCRIPT = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.ucf_emu_message.restype = ctypes.c_char_p
out = (ctypes.c_int * 64)()
results = []
for name, *args in json.loads(sys.argv[2]):
    rc = getattr(lib, name)(out, *[ctypes.c_int64(a) for a in args])
    results.append([rc, lib.ucf_emu_message().decode()])
print(json.dumps(results))
"""

#: (launcher and int args, status, fragments of the message)
MISUSE = [
    (["divergent_sync"], 2, ["block (0,0,0)", "__syncthreads() reached by 16 of 32 threads"]),
    (["exited_lane"], 2, ["__shfl_down_sync(mask=0xffffffff)", "lane 16", "exited"]),
    (
        ["crossed"],
        2,
        [
            "deadlock",
            "threads 0-15 wait at __syncthreads()",
            "threads 16-31 wait at __shfl_sync(mask=0xffffffff)",
        ],
    ),
    (["foreign_mask"], 3, ["__shfl_sync(mask=0x00000001)", "lane 1", "not in its mask"]),
    (["bad_config", 1, 2048], 1, ["invalid launch configuration", "1024 threads"]),
    (["bad_config", 0, 32], 1, ["invalid launch configuration", "grid dimension is 0"]),
    # the first failing block stops the launch: 5000 blocks take no time
    (["bad_config", 5000, 32], 2, ["__syncthreads() reached by 16 of 32 threads"]),
    (["fill"], 0, []),
]


def test_misuse_is_reported_without_hanging(emu):
    cases = json.dumps([case for case, _, _ in MISUSE])
    proc = subprocess.run(
        [sys.executable, "-c", _MISUSE_SCRIPT, str(emu.path), cases],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    for (case, status, fragments), (rc, message) in zip(MISUSE, results, strict=True):
        assert rc == status, (case, message)
        for fragment in fragments:
            assert fragment in message, (case, message)


UNSUPPORTED = """
#include "ucf_cuda.cuh"
__global__ void k(unsigned* out) {{ out[threadIdx.x] = {call}; }}
extern "C" int run(unsigned* out) {{
  UCF_LAUNCH(k, 1, 32, 0, out);
  return ucf_launch_error();
}}
"""


@pytest.mark.parametrize(
    "call", ["__match_any_sync(0xffffffffu, threadIdx.x)", "__reduce_add_sync(0xffffffffu, 1u)"]
)
def test_unsupported_intrinsic_is_a_compile_error(tmp_path, call):
    with pytest.raises(CompileError) as err:
        build_emulated(UNSUPPORTED.format(call=call))
    assert call.split("(")[0] in str(err.value)


# ---- nvcc ---------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", pytest.param("sm_90", marks=pytest.mark.slow)])
def test_kernels_compile_with_nvcc(arch):
    nvcc_check(KERNELS.read_text(), arch)


@needs_nvcc
def test_nvcc_check_reports_errors():
    with pytest.raises(CompileError) as err:
        nvcc_check('#include "ucf_cuda.cuh"\n__global__ void k() { no_such_function(); }\n')
    assert "no_such_function" in str(err.value)


# ---- a real device ----------------------------------------------------------------


@pytest.mark.gpu
def test_on_device(tmp_path):
    drv = pytest.importorskip("pycuda.driver")
    gpuarray = pytest.importorskip("pycuda.gpuarray")
    if nvcc_path() is None:
        pytest.skip("needs nvcc")
    try:
        drv.init()
        device = drv.Device(0)
    except drv.Error as exc:
        pytest.skip(f"no CUDA device: {exc}")
    context = device.retain_primary_context()
    context.push()
    try:
        major, minor = device.compute_capability()
        so = tmp_path / "runtime_kernels.so"
        so.write_bytes(build_device(KERNELS.read_text(), arch=f"sm_{major}{minor}"))
        run = Device(so, gpuarray)
        for helper in ("seg_reduce", "atomic_group"):
            for dtype in DTYPES:
                for g in GROUPS:
                    for name in PATTERNS:
                        check_group(run, helper, dtype, g, name)
        for check in SEMANTICS:
            check(run)
        for kind in HISTOGRAMS:
            check_histogram(run, kind)
    finally:
        context.pop()
