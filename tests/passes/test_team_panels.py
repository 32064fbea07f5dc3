"""The panel cache a team of threads shares (``ucf.passes.panels``): in a parallel loop
the first thread to name a block column packs its panel of B, and any other thread
that names it meanwhile waits for the panel's tag. Two threads on the whole team, many
calls of a skewed matrix (the first block rows full, so both threads want the same
panels at once; then rows of one block, and empty ones), bit for bit the plan on one
thread, on llvm and c, with static halves and with dynamic chunks of one block row, and
against numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ucf
from tests.helpers import needs_cc
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes
from ucf.toolchain import jit

SPMM = "C(i,j) = A(i,k) * B(k,j)"
SERIAL = "reorder(i_blk,k_blk,i_in,k_in,j)"
PARALLEL = [
    "parallelize(i_blk, CPUThread, NoRaces)",
    "split(i_blk, i_blk_c, i_blk_r, 1); parallelize(i_blk_c, CPUThread, NoRaces)",
]


def skewed(rng, block: int, dtype) -> np.ndarray:
    """12 block rows over 16 block columns: 4 full rows, 4 of one block each (in turn
    over the columns), 4 empty; random values, which round."""
    live = np.zeros((12, 16), dtype=bool)
    live[:4] = True
    live[4 + np.arange(4), (5 * np.arange(4)) % 16] = True
    mask = np.kron(live, np.ones((block, block)))
    return (mask * rng.standard_normal(mask.shape)).astype(dtype)


def _on_two_threads(formats, dtype, operands, want, note: str, skip_unless=None) -> None:
    """40 calls of each parallel schedule on llvm and c, two threads on the whole team,
    each bit for bit ``want``; every kernel says ``note`` in its cin and claims panels
    with an atomic add. ``skip_unless(k)`` says whether this CPU builds what is tested."""
    old, fixed = jit._threads.get("requested"), jit.set_whole_team(True)
    try:
        ucf.set_num_threads(2)
        for target in ("llvm", "c"):
            for schedule in PARALLEL:
                k = ucf.compile(
                    SPMM, formats=formats, dtype=dtype, schedule=schedule, target=target
                )
                if skip_unless is not None and not skip_unless(k):
                    pytest.skip("no 8-bit words on this CPU (AVX2)")
                assert note in k.cin
                assert any(isinstance(n, ir.FetchAdd) for n in nodes(k.llir))
                for _ in range(40):
                    np.testing.assert_array_equal(k(**operands).to_numpy(), want)
    finally:
        jit.set_whole_team(fixed)
        jit._threads.pop("requested", None)
        if old is not None:
            ucf.set_num_threads(old)


@needs_cc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_two_threads_share_the_panels_bit_for_bit(dtype):
    rng = np.random.default_rng(38)
    block = 16
    fmt = f"bcsr({block},{block})"
    a = skewed(rng, block, dtype)
    b = rng.standard_normal((a.shape[1], 200)).astype(dtype)
    t = ucf.from_numpy(a, format=fmt)
    ucf.set_num_threads(1)  # conftest restores the count
    want = ucf.compile(SPMM, formats={"A": fmt}, dtype=dtype, schedule=SERIAL)(A=t, B=b)
    want = want.to_numpy()
    note = "packed once per call and team for each k_blk"
    _on_two_threads({"A": fmt}, dtype, {"A": t, "B": b}, want, note)
    np.testing.assert_allclose(want, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@needs_cc
@pytest.mark.parametrize("b_type", ["uint8", "int8"], ids=["quads", "pairs"])
def test_two_threads_share_the_8bit_words_bit_for_bit(b_type):
    """The words of 8-bit B that int8 block products pack (``ucf.passes.pairs``: quads
    for int8 x uint8 where the CPU has VNNI, else pairs) go into the team's cache too:
    the skewed matrix on two threads, 40 calls a configuration, llvm and c, static halves
    and dynamic chunks, exactly numpy's int64 product."""
    rng = np.random.default_rng(39)
    block = 16
    fmt, info = f"bcsr({block},{block})@int8", np.iinfo(b_type)
    a = np.where(skewed(rng, block, np.float32) != 0, rng.integers(-128, 128, (192, 256)), 0)
    a = a.astype(np.int8)
    b = rng.integers(info.min, info.max + 1, (a.shape[1], 96)).astype(b_type)
    want = a.astype(np.int64) @ b.astype(np.int64)
    formats = {"A": fmt, "B": f"dense@{b_type}"}
    t = ucf.from_numpy(a, format=fmt)
    note = "once per call and team (where the words exceed"

    def words(k) -> bool:
        return any(isinstance(n, ir.PairDot | ir.QuadDot) for n in nodes(k.llir))

    _on_two_threads(formats, "int32", {"A": t, "B": b}, want, note, words)


def _wait_loop(source: str, start: str, end: str) -> str:
    """The text of the wait for a panel's tag: from the acquire load the loop tests to
    the end of its body (``end``, first seen after ``start``)."""
    at = source.index(start)
    return source[at : source.index(end, at)]


@needs_cc
def test_the_wait_for_a_panel_pauses_and_then_yields():
    """A thread that waits for the panel another thread of its team packs pauses each
    turn (x86) and yields its core past ``panels.SPINS`` turns: on a busy machine the
    packer may be the thread the OS descheduled (issue 34). On both targets; a kernel
    of one thread (no team cache) has neither."""
    from ucf.codegen.llvm import _x86
    from ucf.passes.panels import SPINS

    fmt = "bcsr(16,16)"
    old, fixed = jit._threads.get("requested"), jit.set_whole_team(True)
    try:
        ucf.set_num_threads(2)
        kernels = {
            t: ucf.compile(SPMM, formats={"A": fmt}, schedule=PARALLEL[0], target=t)
            for t in ("llvm", "c")
        }
        ucf.set_num_threads(1)
        alone = ucf.compile(SPMM, formats={"A": fmt}, schedule=SERIAL, target="c")
    finally:
        jit.set_whole_team(fixed)
        jit._threads.pop("requested", None)
        if old is not None:
            ucf.set_num_threads(old)
    body = _wait_loop(kernels["llvm"].source, "while.body:", 'br label %"while.cond"')
    assert ('call void @"llvm.x86.sse2.pause"()' in body) == _x86()
    assert re.search(rf'icmp sgt i64 %"[^"]+", {SPINS}', body)
    assert 'call i32 @"sched_yield"()' in body
    c = kernels["c"].source
    assert "#include <sched.h>" in c
    loop = _wait_loop(c, "__ATOMIC_ACQUIRE) == INT64_C(0))) {", "\n              }")
    pause = "#if defined(__x86_64__) || defined(__i386__)\n"
    assert pause in loop and "__builtin_ia32_pause();" in loop
    assert f"> INT64_C({SPINS})" in loop and "sched_yield();" in loop
    for text in (alone.source, alone.c_source):
        assert "pause" not in text and "sched_yield" not in text


@needs_cc
@pytest.mark.parametrize("threads", [1, 2])
def test_panels_of_2mb_or_more_take_huge_pages_bit_for_bit(threads):
    """A cache of panels of a huge page or more (``ir.Alloc.huge``: 16 block columns of
    16 rows of 2048 float32, 2 MB) starts on a huge page's boundary and asks Linux for
    transparent huge pages, on both targets; the results are bit for bit the plan on one
    thread's and match numpy, on one thread (a thread's own cache) and two (the team's)."""
    rng = np.random.default_rng(40)
    fmt = "bcsr(16,16)"
    a = skewed(rng, 16, np.float32)
    b = rng.standard_normal((a.shape[1], 2048)).astype(np.float32)
    t = ucf.from_numpy(a, format=fmt)
    ucf.set_num_threads(1)  # conftest restores the count
    want = ucf.compile(SPMM, formats={"A": fmt}, dtype="float32", schedule=SERIAL)(A=t, B=b)
    want = want.to_numpy()
    np.testing.assert_allclose(want, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    fixed = jit.set_whole_team(True)
    try:
        ucf.set_num_threads(threads)
        for target in ("llvm", "c"):
            schedule = SERIAL if threads == 1 else PARALLEL[1]
            k = ucf.compile(
                SPMM, formats={"A": fmt}, dtype="float32", schedule=schedule, target=target
            )
            assert any(isinstance(n, ir.Alloc) and n.huge for n in nodes(k.llir))
            assert ("ucf_huge_start" in k.source) if target == "c" else ('@"madvise"' in k.source)
            for _ in range(5):
                np.testing.assert_array_equal(k(A=t, B=b).to_numpy(), want)
    finally:
        jit.set_whole_team(fixed)
