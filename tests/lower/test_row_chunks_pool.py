"""One-pass outputs in pooled memory (``ucf.exec.recycled``, ``ucf.exec.outputs.sparse_output``)
and the chunks' shares (``ucf.lower.row_chunks``: one block of chunks per thread, the
moves in dynamic pieces).

A sparse output's arrays are taken from the pool of dropped outputs with whatever
their last user left in them. Here every array is pooled (``MIN_BYTES`` 1) and each
pooled buffer is filled with garbage before the call that takes it, so a kernel that
read a position or value it had not written would give a wrong result: checked
against scipy and bit for bit against the one-thread plan, on llvm and c, one thread
and two, over empty rows, one long row, fewer rows than chunks and no entries, random
shapes (hypothesis), and an output of an operand's structure."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import TARGETS, needs_cc, rand_sparse
from tests.lower.test_row_chunks import ADD, PARALLEL, PRODUCT, SERIAL, operands, reference
from ucf.exec import recycled
from ucf.lower import row_chunks

CASES = ["empty rows", "one dense row", "few rows", "no entries", "power-law"]


@pytest.fixture
def pooled(monkeypatch):
    """Every output array from a pool of this test's own."""
    monkeypatch.setattr(recycled, "MIN_BYTES", 1)
    monkeypatch.setattr(recycled, "_idle", {})
    return recycled._idle


def poison(idle: dict) -> int:
    """Fill every pooled buffer with 0xff bytes (int32 -1, float64 NaN): the buffers
    poisoned."""
    bufs = [b for bs in idle.values() for b in bs]
    for b in bufs:
        b.fill(0xFF)
    return len(bufs)


def case_operands(case: str, expr: str):
    if case != "few rows":
        return operands(case, expr)
    rng = np.random.default_rng(5)  # 3 rows: most of the 256 chunks are empty
    a = rand_sparse(rng, (3, 40), 0.5, empty_rows=1, signed=False)
    b = rand_sparse(rng, (3, 40) if expr == ADD else (40, 50), 0.5, empty_rows=0, signed=False)
    return a, b


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("expr", [ADD, PRODUCT])
@pytest.mark.parametrize("case", CASES)
def test_poisoned_pool_gives_scipys_result_and_the_serial_bits(pooled, target, expr, case, threads):
    a, b = case_operands(case, expr)
    ops = {"A": sp.csr_matrix(a), "B": sp.csr_matrix(b)}
    fmt = {t: "csr" for t in "ABC"}
    par = ucf.compile(expr, formats=fmt, schedule=PARALLEL[expr], target=target)
    ser = ucf.compile(expr, formats=fmt, schedule=SERIAL[expr], target=target)
    want = ser(**ops).to_scipy().copy()  # its arrays go back to the pool
    assert (want != sp.csr_matrix(reference(expr, a, b))).nnz == 0
    for _ in range(2):  # the second call takes the first's poisoned buffers
        assert poison(pooled) > 0
        got = par(**ops)
        got.validate()
        np.testing.assert_array_equal(got.to_numpy(), reference(expr, a, b))
        c = got.to_scipy()
        for x in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(c, x), getattr(want, x))
        del got, c


def test_a_dropped_output_is_taken_again_and_a_small_one_is_copied(pooled, threads):
    """A product's arrays go back to the pool when the result is dropped and the next
    call of the same size takes them; a sum of two equal patterns keeps half its bound,
    so its arrays are copies (the bound's memory goes back at once)."""
    a, b = operands("power-law", PRODUCT)
    k = ucf.compile(PRODUCT, formats={t: "csr" for t in "ABC"}, schedule=PARALLEL[PRODUCT])
    first = k(A=sp.csr_matrix(a), B=sp.csr_matrix(b))
    at = first.vals.ctypes.data, first.levels[1]["crd"].ctypes.data
    del first
    again = k(A=sp.csr_matrix(a), B=sp.csr_matrix(b))
    assert (again.vals.ctypes.data, again.levels[1]["crd"].ctypes.data) == at
    np.testing.assert_array_equal(again.to_numpy(), a @ b)

    x = sp.csr_matrix(operands("random", ADD)[0])
    add = ucf.compile(ADD, formats={t: "csr" for t in "ABC"}, schedule=PARALLEL[ADD])
    held = sum(len(v) for v in pooled.values())
    s = add(A=x, B=x)
    assert s.vals.base is None and s.levels[1]["crd"].base is None  # copied
    assert sum(len(v) for v in pooled.values()) >= held + 2  # crd and vals back
    np.testing.assert_array_equal(s.to_numpy(), 2 * x.toarray())


@needs_cc
def test_each_thread_takes_one_block_of_chunks_and_the_moves_go_in_pieces():
    """The C source: the chunks' loop is OpenMP's static share (one block a thread), the
    moves' loops dynamic in ``MOVED_PIECE`` chunks (a static share would leave the
    first thread's block, which does not move, to one thread)."""
    k = ucf.compile(
        PRODUCT, formats={t: "csr" for t in "ABC"}, schedule=PARALLEL[PRODUCT], target="c"
    )
    src = k.c_source
    chunks = src.index("for (int64_t chunk = ")
    assert src.rfind("omp for schedule(static)", 0, chunks) > src.rfind("omp parallel", 0, chunks)
    moves = src.count(f"schedule(dynamic, {row_chunks.MOVED_PIECE})")
    assert moves == 2


@settings(max_examples=25)
@given(
    rows=st.integers(0, 600),
    cols=st.integers(1, 60),
    density=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**16),
    expr=st.sampled_from([ADD, PRODUCT]),
)
def test_fuzzed_shapes_from_a_poisoned_pool_on_two_threads(rows, cols, density, seed, expr):
    """Random shapes and densities (rows fewer than the chunks, or many; empty ones), each
    call on two threads taking poisoned buffers: scipy's result."""
    rng = np.random.default_rng(seed)
    a = rand_sparse(rng, (rows, cols), density, empty_rows=rows // 4, signed=False)
    b = rand_sparse(rng, (rows, cols) if expr == ADD else (cols, 50), density, signed=False)
    k = ucf.compile(expr, formats={t: "csr" for t in "ABC"}, schedule=PARALLEL[expr])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recycled, "MIN_BYTES", 1)
        mp.setattr(recycled, "_idle", {})
        ucf.set_num_threads(2)
        k(A=sp.csr_matrix(a), B=sp.csr_matrix(b))  # its arrays go back to the pool
        poison(recycled._idle)
        got = k(A=sp.csr_matrix(a), B=sp.csr_matrix(b))
        got.validate()
        np.testing.assert_array_equal(got.to_numpy(), reference(expr, a, b))


@pytest.mark.parametrize("target", TARGETS)
def test_an_operands_structure_from_a_poisoned_pool(pooled, target, threads):
    """An output of an operand's structure (``C(i,j) = 2*A(i,j)``: its positions copied,
    every value stored by the compute pass) takes poisoned buffers too."""
    m = sp.csr_matrix(operands("empty rows", ADD)[0])
    k = ucf.compile("C(i,j) = 2*A(i,j)", formats={"A": "csr", "C": "csr"}, target=target)
    k(A=m)
    for _ in range(2):
        assert poison(pooled) > 0
        got = k(A=m)
        got.validate()
        np.testing.assert_array_equal(got.to_numpy(), 2 * m.toarray())
        del got
