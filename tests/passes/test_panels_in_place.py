"""B's rows read in place where packing its panels would not pay (``block_rows.IN_PLACE_USES``:
few blocks stored a block column, panels beyond ``block_rows.NEAR_BYTES``), decided at the
call: the same kernel packs at one density and reads in place at another. Ragged extents
(partial blocks, a tail of columns after the tiles), 0 to 100 % zero blocks, llvm and c,
one thread and two (the team's cache), against numpy and bit for bit against the kernel
that always packs."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

import ucf
from tests.helpers import needs_cc
from ucf.ir import nodes as ir
from ucf.schedule import block_rows
from ucf.toolchain import cc, jit

SPMM = "C(i,j) = A(i,k) * B(k,j)"
FMT = "bcsr(32,32)"
NOTE = "read in place, not packed"
#: 300 x 520 over blocks of 32 (10 x 17 block rows and columns, both partial) times
#: 520 x 600 (18 tiles of 32 columns and a tail of 24): 17 panels of 72 KB, 1.2 MB.
M, K, N = 300, 520, 600
#: One thread; two, the block rows halved statically (the plan before any call); two,
#: in dynamic chunks of one (the default's plan on two threads for a call's own stats).
SCHEDULES = [
    "reorder(i_blk,k_blk,i_in,k_in,j)",
    "parallelize(i_blk, CPUThread, NoRaces)",
    "split(i_blk, i_blk_c, i_blk_r, 1); parallelize(i_blk_c, CPUThread, NoRaces)",
]


def blocks(rng, zero: float) -> np.ndarray:
    """A with ``zero`` of its blocks zero, the rest random."""
    live = rng.random((-(-M // 32), -(-K // 32))) >= zero
    mask = np.kron(live, np.ones((32, 32)))[:M, :K]
    return (mask * rng.standard_normal((M, K))).astype(np.float32)


def compiled(monkeypatch, tmp_path, target: str, schedule: str, uses: int):
    """The kernel with ``IN_PLACE_USES`` at ``uses`` (0: it always packs), in a kernel
    cache of its own (the constant is not in the cache's key), under ``schedule``: a
    schedule of its own, so that no call compiles a plan of its own later (with
    whatever ``IN_PLACE_USES`` then holds)."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / f"cache-{target}-{uses}"))
    monkeypatch.setattr(block_rows, "IN_PLACE_USES", uses)
    return ucf.compile(SPMM, formats={"A": FMT}, dtype="float32", target=target, schedule=schedule)


@needs_cc
@pytest.mark.parametrize("schedule", SCHEDULES, ids=["serial", "static", "chunks"])
@pytest.mark.parametrize("target", ["llvm", "c"])
def test_in_place_or_packed_bit_for_bit(monkeypatch, tmp_path, target, schedule):
    """90 % and 100 % zero blocks (1.7 and 0 blocks a block column) read B in place, 50 %
    and none (8.5, 17) pack; each equals the kernel that packs at every density, and
    numpy. On two threads the whole team runs every call."""
    rng = np.random.default_rng(85)
    fixed = jit.set_whole_team(True)
    try:
        ucf.set_num_threads(1 if schedule == SCHEDULES[0] else 2)  # conftest restores it
        k = compiled(monkeypatch, tmp_path, target, schedule, block_rows.IN_PLACE_USES)
        packing = compiled(monkeypatch, tmp_path, target, schedule, 0)
        # in chunks of a block row the next row's first block is not known: it packs
        assert (NOTE in k.cin) == (schedule != SCHEDULES[2]) and NOTE not in packing.cin
        for zero in (0.0, 0.5, 0.9, 1.0):
            # a B of its own: the panels a call packed and freed hold no other call's
            b = rng.standard_normal((K, N)).astype(np.float32)
            a = blocks(rng, zero)
            t = ucf.from_numpy(a, format=FMT)
            got = k(A=t, B=b).to_numpy()
            np.testing.assert_array_equal(got, packing(A=t, B=b).to_numpy())
            np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    finally:
        jit.set_whole_team(fixed)


#: Linked into the c kernel (``-Wl,--wrap``): the largest block the kernel mallocs in a
#: call, filled with 0xa5 bytes, and whether any of them changed by its free. A panel the
#: call packs is that block, written; read in place, the panel is one element, and the
#: call mallocs nothing larger.
PROBE = r"""
#include <stddef.h>
#include <string.h>
void *__real_malloc(size_t);
void __real_free(void *);
static size_t largest;
static void *block;
static int written;
void *__wrap_malloc(size_t n) {
  void *p = __real_malloc(n);
  if (p && n > largest) { largest = n; block = p; memset(p, 0xa5, n); }
  return p;
}
void __wrap_free(void *p) {
  if (p && p == block) {
    const unsigned char *c = p;
    for (size_t i = 0; i < largest && !written; i++) written = c[i] != 0xa5;
    block = NULL;
  }
  __real_free(p);
}
size_t probe_largest(void) { return largest; }
int probe_written(void) { return written; }
void probe_reset(void) { largest = 0; block = NULL; written = 0; }
"""


def _panel_columns() -> tuple[int, int]:
    """Columns of B (whole tiles of 16 or 32) whose 17 panels of 32 rows of float32 come
    to at most ``NEAR_BYTES``, and the next 32 columns, over it."""
    below = block_rows.NEAR_BYTES // (17 * 32 * 4) // 32 * 32
    return below, below + 32


@needs_cc
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="links with GNU ld's --wrap")
def test_which_side_of_the_threshold_reads_in_place(monkeypatch, tmp_path):
    """The decision itself, which the results cannot show (both branches give the same
    bits): one kernel, one thread, called with operands either side of each threshold,
    its mallocs observed. 300 x 520 over blocks of 32 is 17 block columns: 68 blocks
    stored (``IN_PLACE_USES`` a column) read in place and 69 pack; with 68 blocks,
    panels of 512 columns (over ``NEAR_BYTES``) read in place and of 480 (under) pack."""
    probe = tmp_path / "probe.c"
    probe.write_text(PROBE)
    wrap = f"-Wl,--wrap=malloc,--wrap=free {probe}"
    monkeypatch.setenv("UCF_CFLAGS", f"{cc.DEFAULT_CFLAGS} {wrap}")
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    k = ucf.compile(SPMM, formats={"A": FMT}, dtype="float32", target="c", schedule=SCHEDULES[0])
    lib = k._loaded().library
    lib.probe_largest.restype = ctypes.c_size_t
    uses = block_rows.IN_PLACE_USES * 17
    below, above = _panel_columns()
    rng = np.random.default_rng(94)
    for stored, n, in_place in [
        (uses, above, True),
        (uses + 1, above, False),
        (uses, below, False),
    ]:
        live = np.zeros(10 * 17, bool)
        live[rng.choice(live.size, stored, replace=False)] = True
        mask = np.kron(live.reshape(10, 17), np.ones((32, 32)))[:M, :K]
        a = (mask * rng.standard_normal((M, K))).astype(np.float32)
        b = rng.standard_normal((K, n)).astype(np.float32)
        lib.probe_reset()
        got = k(A=ucf.from_numpy(a, format=FMT), B=b).to_numpy()
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        # what the kernel asks malloc for: the panels (one element read in place) and
        # ``ALIGN`` bytes to start them on a boundary
        panels = 4 if in_place else 17 * 32 * n * 4
        seen = (lib.probe_largest(), bool(lib.probe_written()))
        assert seen == (panels + ir.ALIGN, not in_place), (stored, n, seen)
