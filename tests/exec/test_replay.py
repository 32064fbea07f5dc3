"""A call whose operands are the very objects of one of the thread's last calls replays
its argument list (ucf.exec.replay): every way an operand can change between calls must
either be read (in-place updates of the same buffer) or stop the replay."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS
from ucf.exec import replay as replay_module

STMT = "y(i) = A(i,j) * x(j) + z(i)"


@pytest.fixture
def case():
    rng = np.random.default_rng(0)
    m = sp.random(30, 20, density=0.3, format="csr", random_state=1)
    A = ucf.from_scipy(m)
    x, z = rng.standard_normal(20), rng.standard_normal(30)
    k = ucf.compile(STMT, {"A": "csr"})
    return k, m, A, x, z


def test_in_place_updates_are_read_and_outputs_are_fresh(case, replays):
    k, m, A, x, z = case
    m0 = m.copy()  # A shares m's arrays
    first = k(A=A, x=x, z=z).to_numpy()
    x *= 2.0
    A.vals[:] += 1.0  # the same buffers, new values
    second = k(A=A, x=x, z=z).to_numpy()
    assert len(replays) == 1
    m2 = m0.copy()
    m2.data = m2.data + 1.0
    np.testing.assert_allclose(second, m2 @ x + z)
    np.testing.assert_allclose(first, m0 @ (x / 2.0) + z)  # not overwritten by the replay
    assert not np.shares_memory(first, second)


def test_other_objects_shapes_or_arrays_are_bound_again(case, replays):
    k, m, A, x, z = case
    k(A=A, x=x, z=z)
    x2 = x.copy() + 1.0
    np.testing.assert_allclose(k(A=A, x=x2, z=z).to_numpy(), m @ x2 + z)
    assert replays == []
    # a tensor holding other arrays (same shape and format)
    m3 = sp.random(30, 20, density=0.3, format="csr", random_state=2)
    A3 = ucf.from_scipy(m3)
    A.levels[1] = A3.levels[1]
    A.vals = A3.vals
    np.testing.assert_allclose(k(A=A, x=x2, z=z).to_numpy(), m3 @ x2 + z)
    assert replays == []
    # an operand reshaped in place: refused by shape, as a fresh call would be
    z.shape = (5, 6)
    with pytest.raises(ucf.ShapeError):
        k(A=A, x=x2, z=z)


def test_a_dead_operands_id_reused_is_not_replayed(case, replays):
    k, m, A, x, z = case
    k(A=A, x=x.copy(), z=z)  # the copy dies after the call
    for _ in range(5):  # new arrays may take the dead one's id
        x2 = np.full(20, 3.0)
        np.testing.assert_allclose(k(A=A, x=x2, z=z).to_numpy(), m @ x2 + z)
    assert replays == []


def test_given_output_is_zeroed_or_accumulated(case, replays):
    k, m, A, x, z = case
    y = np.full(30, 7.0)
    k(A=A, x=x, z=z, out=y)
    k(A=A, x=x, z=z, out=y)
    assert len(replays) == 1
    np.testing.assert_allclose(y, m @ x + z)
    acc = ucf.compile("y(i) += A(i,j) * x(j)", {"A": "csr"})
    y = np.ones(30)
    for _ in range(3):
        acc(A=A, x=x, out=y)
    np.testing.assert_allclose(y, 1.0 + 3 * (m @ x))
    assert len(replays) == 3


def test_thread_count_change_chooses_again(case, replays):
    k, m, A, x, z = case
    ucf.set_num_threads(1)
    k(A=A, x=x, z=z)
    ucf.set_num_threads(2)
    np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ x + z)
    assert replays == []


def test_threads_replay_their_own_calls(case):
    k, m, A, x, z = case
    xs = [np.full(20, float(t + 1)) for t in range(4)]
    results: dict[int, list] = {}

    def work(t):
        results[t] = [k(A=A, x=xs[t], z=z).to_numpy() for _ in range(50)]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in range(4):
        for y in results[t]:
            np.testing.assert_allclose(y, m @ xs[t] + z)


def test_sparse_outputs_and_converted_operands_are_not_replayed(replays):
    m = sp.random(10, 10, density=0.3, format="csr", random_state=3)
    add = ucf.compile("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "csr"})
    for _ in range(2):
        np.testing.assert_allclose(add(A=m, B=m).to_numpy(), (m + m).toarray())
    spmv = ucf.compile("y(i) = A(i,j) * x(j)", {"A": "csr"})
    x = np.ones(10, dtype=np.float32)  # converted to float64 every call
    for _ in range(2):
        np.testing.assert_allclose(spmv(A=m, x=x).to_numpy(), m @ x)
    assert replays == []


def test_alternating_buffers_replay_and_the_oldest_call_is_forgotten(case, replays):
    k, m, A, x, z = case
    rng = np.random.default_rng(5)
    pair = [rng.standard_normal(20) for _ in range(2)]
    for step in range(6):  # ping-pong: two remembered calls, both replayed
        xs = pair[step % 2]
        np.testing.assert_allclose(k(A=A, x=xs, z=z).to_numpy(), m @ xs + z)
    assert len(replays) == 4
    ring = [rng.standard_normal(20) for _ in range(replay_module.REMEMBERED + 1)]
    before = len(replays)
    for step in range(2 * len(ring)):  # one more than remembered: never replayed
        xs = ring[step % len(ring)]
        np.testing.assert_allclose(k(A=A, x=xs, z=z).to_numpy(), m @ xs + z)
    assert len(replays) == before


@pytest.mark.parametrize("target", TARGETS)
def test_packed_replays_read_updates_and_stop_at_any_change(target, replays):
    """After PACK_AFTER replays the arguments go through a trampoline; in-place updates
    are still read, and every change of an operand binds the call again."""
    rng = np.random.default_rng(7)
    m = sp.random(30, 20, density=0.3, format="csr", random_state=4)
    A = ucf.from_scipy(m)
    x, z, y = rng.standard_normal(20), rng.standard_normal(30), np.zeros(30)
    k = ucf.compile(STMT, {"A": "csr"}, target=target)
    for _ in range(replay_module.PACK_AFTER + 3):
        k(A=A, x=x, z=z)
        k(A=A, x=x, z=z, out=y)
    assert all(r.packed is not None for r in k._local.replays[:2])
    x *= 3.0
    A.vals[:] = rng.standard_normal(A.vals.size)
    m = sp.csr_array((A.vals.copy(), m.indices.copy(), m.indptr.copy()), shape=m.shape)
    count = len(replays)
    np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ x + z)
    np.testing.assert_allclose(k(A=A, x=x, z=z, out=y).to_numpy(), m @ x + z)
    np.testing.assert_allclose(y, m @ x + z)
    assert len(replays) == count + 2
    # the column indices swapped for others (same length, so only identity tells)
    old = A.levels[1]["crd"]  # kept alive: only the identity check can tell
    crd = rng.integers(0, 20, size=old.size).astype(A.index_dtype)
    A.levels[1]["crd"] = crd
    m = sp.csr_array((A.vals.copy(), crd.copy(), m.indptr.copy()), shape=m.shape)
    np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ x + z)
    np.testing.assert_allclose(k(A=A, x=x, z=z, out=y).to_numpy(), m @ x + z)
    assert len(replays) == count + 2
    del old
    # another output array: written, the old one left alone
    y2, before = np.zeros(30), y.copy()
    k(A=A, x=x, z=z, out=y2)
    np.testing.assert_allclose(y2, m @ x + z)
    np.testing.assert_array_equal(y, before)
    assert len(replays) == count + 2


def test_a_numpy_operand_retyped_in_place_is_converted_again(case, replays):
    """``x.dtype = ...`` keeps the object and its buffer; the replay must see the new type
    (read as float64 the int64 bits below are denormals, nowhere near the answer)."""
    k, m, A, x, z = case
    x = np.arange(20, dtype=np.int64).view(np.float64)
    for _ in range(replay_module.PACK_AFTER + 2):
        k(A=A, x=x, z=z)
    x.dtype = np.int64
    np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ np.arange(20.0) + z)


def test_a_tensor_reshaped_in_place_is_checked_again(case, replays):
    k, m, A, x, z = case
    for _ in range(3):
        k(A=A, x=x, z=z)
    A.shape = (30, 21)  # x has 20 entries: refused, as a fresh call would be
    with pytest.raises(ucf.ShapeError, match="index variable j"):
        k(A=A, x=x, z=z)
    A.shape = (30, 20)
    np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ x + z)
    count = len(replays)
    A.levels[1] = {"pos": A.levels[1]["pos"], "crd": A.levels[1]["crd"]}  # equal, rebuilt
    np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ x + z)
    assert len(replays) == count + 1  # the same arrays under the same keys replay


def test_zero_points_changed_in_place_are_checked_again(replays):
    """The int32 sums of quantized products are bounded by the zero points' values, which
    no identity shows: such kernels are never replayed."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((12, 300)) * (rng.random((12, 300)) < 0.6)
    A = ucf.quantize(a, format="csr@qint8")
    x = ucf.quantize(rng.standard_normal(300), format="dense@qint8")
    k = ucf.compile("y(i) = A(i,k)*x(k)", {"A": "csr@qint8", "x": "dense@qint8"})
    assert k._plan.integer_sums
    for _ in range(3):
        k(A=A, x=x)
    A.scales.zero_point[:] = 1_000_000
    with pytest.raises(ucf.FormatError, match="can overflow int32"):
        k(A=A, x=x)
    assert replays == []


def test_an_array_gone_from_a_tensor_is_never_replayed(case, replays):
    """A remembered array that dies ends its replay, even when what took its place
    compares like a dead reference (None)."""
    k, m, A, x, z = case
    for _ in range(3):
        k(A=A, x=x, z=z)
    count = len(replays)
    A.vals = None  # the old values die here
    with pytest.raises(ucf.UcfError):
        k(A=A, x=x, z=z)
    assert len(replays) == count


def test_a_tensor_read_twice_in_two_orders_is_not_replayed():
    """A(j,i) beside A(i,j) binds a converted copy of A; a replay would neither check it
    nor keep it alive, so it would read the first call's (freed) copy."""
    A = ucf.from_scipy(sp.random(6, 6, density=0.5, format="csr", random_state=0))
    x = np.random.default_rng(0).random(6)
    k = ucf.compile("y(i) = A(i,j) * A(j,i) * x(j)", formats={"A": "csr"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        for scale in (1, 1, 2, 3):
            A.vals[:] *= scale  # in place: the same arrays, as a replay would see them
            dense = A.to_numpy()
            np.testing.assert_allclose(k(A=A, x=x).to_numpy(), (dense * dense.T) @ x)


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_kernels_replay_when_the_blocks_divide_the_extents(target, replays):
    """A blocked kernel reads a bcsr operand's own arrays and a dense operand through a
    view (when its block size divides it), and writes the result's own values: its
    calls replay, reading in-place updates, into fresh outputs or a given one."""
    rng = np.random.default_rng(11)
    a = rng.integers(-5, 6, (16, 12)) * (rng.random((4, 3)) < 0.6).repeat(4, 0).repeat(4, 1)
    b = rng.integers(-5, 6, (12, 10)).astype(np.int32)
    k = ucf.compile("C(i,j) = A(i,k) * B(k,j)", {"A": "bcsr(4,4)"}, dtype="int32", target=target)
    A = ucf.from_numpy(a.astype(np.int32), format="bcsr(4,4)")
    first = k(A=A, B=b).to_numpy()
    b *= 2  # in place
    A.vals[:] += 1  # the stored blocks, in place (their explicit zeros too)
    dense = A.to_numpy()
    second = k(A=A, B=b).to_numpy()
    assert len(replays) == 1
    np.testing.assert_array_equal(second, dense @ b)
    np.testing.assert_array_equal(first, a @ (b // 2))  # not overwritten by the replay
    out = np.full((16, 10), 7, dtype=np.int32)
    for _ in range(3):
        assert np.shares_memory(k(A=A, B=b, out=out).vals, out)
    np.testing.assert_array_equal(out, dense @ b)
    assert len(replays) == 3


def test_blocked_kernels_whose_operands_are_padded_are_not_replayed(replays):
    """Blocks that do not divide a dense operand's extent pad it into a copy each call,
    which a replay would neither check nor keep alive; an int8 activation widened to
    the kernel's dtype is a copy too."""
    rng = np.random.default_rng(12)
    a = rng.integers(-5, 6, (10, 10)).astype(np.int32)
    b = rng.integers(-5, 6, (10, 6)).astype(np.int32)
    k = ucf.compile("C(i,j) = A(i,k) * B(k,j)", {"A": "bcsr(4,4)"}, dtype="int32")
    A = ucf.from_numpy(a, format="bcsr(4,4)")
    for step in range(3):
        b[0, 0] = step
        np.testing.assert_array_equal(k(A=A, B=b).to_numpy(), a @ b)
    a8 = rng.integers(-5, 6, (8, 8)).astype(np.int32)
    k8 = ucf.compile("C(i,j) = A(i,k) * B(k,j)", {"A": "bcsr(4,4)"}, dtype="int32")
    A8 = ucf.from_numpy(a8, format="bcsr(4,4)")
    b8 = rng.integers(-5, 6, (8, 3)).astype(np.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        for step in range(3):
            b8[0, 0] = step
            np.testing.assert_array_equal(k8(A=A8, B=b8).to_numpy(), a8 @ b8)
    assert replays == []


def test_int8_blocks_times_uint8_activations_replay_exactly(replays):
    """The TeSA int8 row's kernel: bcsr@int8 weights times uint8 activations into int32.
    The activations are read where they lie (no copy to the kernel's dtype), so a call
    with the same arrays replays, and reads activations updated in place."""
    rng = np.random.default_rng(13)
    pattern = (rng.random((4, 4)) < 0.5).repeat(8, 0).repeat(8, 1)
    a = np.where(pattern, rng.integers(-127, 128, pattern.shape), 0).astype(np.int8)
    b = rng.integers(0, 256, (32, 24)).astype(np.uint8)
    formats = {"A": "bcsr(8,8)@int8", "B": "dense@uint8"}
    k = ucf.compile("C(i,j) = A(i,k) * B(k,j)", formats, dtype="int32")
    A = ucf.from_numpy(a, format="bcsr(8,8)@int8")
    for step in range(3):
        b[step] = 255 - b[step]
        got = k(A=A, B=b).to_numpy()
        np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
    assert len(replays) == 2


def test_positional_operands_and_masks_are_refused_after_replays(case, replays):
    """A replay is looked up before the call's arguments are checked, only for calls
    whose arguments need no check: positional operands and masks= are still refused."""
    k, m, A, x, z = case
    for _ in range(3):
        k(A=A, x=x, z=z)
    with pytest.raises(ucf.ArgumentError, match="passed by name"):
        k(A, x=x, z=z)
    with pytest.raises(ucf.OperandError, match="masks="):
        k(A=A, x=x, z=z, masks={"A": np.ones((30, 20))})
    with pytest.raises(ucf.ArgumentError, match="shapes= takes a dict"):
        k(A=A, x=x, z=z, shapes=[1])
    np.testing.assert_allclose(k(A=A, x=x, z=z, shapes={}).to_numpy(), m @ x + z)
    assert len(replays) == 2


def _address(t) -> int:
    return t.vals.__array_interface__["data"][0]


@pytest.fixture
def taken(monkeypatch):
    """How many replays took a new dense output."""
    count = []
    values = replay_module._values

    def counting(*args):
        count.append(1)
        return values(*args)

    monkeypatch.setattr(replay_module, "_values", counting)
    return count


@pytest.mark.parametrize("target", TARGETS)
def test_a_dropped_result_is_written_again_and_a_held_one_never(target, replays, taken):
    """A replay keeps the dense output it returned and writes it again where the caller
    let go of it, taking no new one; a result, its values or a view of them still held
    get a new output and keep their values."""
    rng = np.random.default_rng(11)
    n = 4 * replay_module._Arena.SIZE // 16  # over the arenas' outputs
    m = sp.random(n, 20, density=0.3, format="csr", random_state=6)
    A = ucf.from_scipy(m)
    x, z = rng.standard_normal(20), rng.standard_normal(n)
    k = ucf.compile(STMT, {"A": "csr"}, target=target)
    k(A=A, x=x, z=z)
    k(A=A, x=x, z=z)  # replayed: the replay keeps its output
    where = _address(k(A=A, x=x, z=z))
    again = k(A=A, x=x, z=z)
    assert _address(again) == where
    assert len(replays) == 3 and len(taken) == 1
    np.testing.assert_allclose(again.to_numpy(), m @ x + z)
    expected = again.vals.copy()
    for hold in (lambda r: r, lambda r: r.vals, lambda r: r.vals[3:7]):
        held = hold(again)
        del again
        x *= 2.0
        again = k(A=A, x=x, z=z)
        np.testing.assert_allclose(again.to_numpy(), m @ x + z)
        mine = held if isinstance(held, np.ndarray) else held.vals
        assert not np.shares_memory(again.vals, mine)
        np.testing.assert_array_equal(mine, expected[3:7] if mine.size == 4 else expected)
        expected = again.vals.copy()
        del held, mine
    assert len(taken) == 4
    swapped = again.vals  # values swapped for others: the kept ones are not written again
    again.vals = np.zeros_like(swapped)
    del again
    x *= 2.0
    np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ x + z)
    np.testing.assert_array_equal(swapped, expected)
    assert len(replays) == 7 and len(taken) == 5


def test_outputs_over_keep_bytes_or_zeroed_first_are_not_kept(case, replays, taken, monkeypatch):
    k, m, A, x, z = case
    monkeypatch.setattr(replay_module, "KEEP_BYTES", 8 * 30 - 1)
    for _ in range(4):
        np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ x + z)
    assert len(replays) == len(taken) == 3
    # a kernel that does not write every element: zeroed afresh at every call
    scatter = ucf.compile("y(j) = A(i,j) * x(i)", {"A": "csr"})
    w = np.random.default_rng(3).standard_normal(30)
    for _ in range(4):
        np.testing.assert_allclose(scatter(A=A, x=w).to_numpy(), m.T @ w)
    assert all(r.zero and r.kept is None for r in scatter._local.replays)


def test_a_threads_kept_outputs_are_bounded_oldest_first(monkeypatch):
    """Each kernel's replay keeps its last output, but one thread's replays keep at most
    ``KEPT_BYTES`` together: a third kernel's output lets go of the one kept longest ago
    (a program of many kernels would otherwise hold an output for each), and that
    kernel's next call takes a new output and is right."""
    n = 4 * replay_module._Arena.SIZE // 16  # over the arenas' outputs
    monkeypatch.setattr(replay_module, "KEPT_BYTES", 2 * 8 * n)
    m = sp.random(n, 20, density=0.3, format="csr", random_state=7)
    A = ucf.from_scipy(m)
    rng = np.random.default_rng(12)
    x, z = rng.standard_normal(20), rng.standard_normal(n)
    kernels = [ucf.compile(STMT, {"A": "csr"}) for _ in range(3)]
    kept = []
    for k in kernels:
        for _ in range(2):  # the second call is replayed and keeps its output
            np.testing.assert_allclose(k(A=A, x=x, z=z).to_numpy(), m @ x + z)
        kept.append([r.kept is not None for r in k._local.replays])
    assert kept == [[True], [True], [True]]  # each kept when it ran
    now = [[r.kept is not None for r in k._local.replays] for k in kernels]
    assert now == [[False], [True], [True]]
    x *= 2.0
    np.testing.assert_allclose(kernels[0](A=A, x=x, z=z).to_numpy(), m @ x + z)
    now = [[r.kept is not None for r in k._local.replays] for k in kernels]
    assert now == [[True], [False], [True]]
