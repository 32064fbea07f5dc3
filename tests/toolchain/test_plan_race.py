"""The race of a kernel's parallel plan against its plan for one thread (issue 34: a
busy machine). A region compares itself with itself on one thread; a parallel plan
that does more work than the plan for one thread (a count pass its one-pass plan
has not) can win its regions under a load that leaves each thread 2/3 of a core while
the whole call loses. The call path races the two plans now and then and keeps the
faster (``ucf.toolchain.team.LoopStates``)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import assert_exact
from ucf.codegen import llvm_team
from ucf.exec.kernel import forget_loaded
from ucf.schedule.loops import SplitCommand
from ucf.schedule.records import Parallel
from ucf.schedule.requests import Parallelize, PrecomputeCommand
from ucf.toolchain import jit, team
from ucf.toolchain.team import (
    RACE_CALLS,
    RACE_EVERY,
    RACE_EVERY_MAX,
    RACE_FIRST,
    SOLO,
    TIMED,
    WARM,
    race_plan,
)

#: The plans a race's calls run, in Thue-Morse order.
RACED = [race_plan(n) for n in range(2 * RACE_CALLS)]


def _loops(timed: bool = True, fixed: int = 0):
    """LoopStates over two loops of function f written by the test (both timed once and
    won on two threads, unless ``timed`` is false), with a counter of lost regions and
    a fixed-team flag of the test's own. LoopStates views the loops' arrays without
    owning them, as it views a kernel library's: the caller keeps ``arrays`` bound for
    as long as it uses the LoopStates (a ``for _ in`` that rebinds ``_`` frees them,
    and the race then reads freed memory)."""
    arrays = [(ctypes.c_int64 * 4)(2 if timed else 0, 0, 0, 5000) for _ in range(2)]
    lookup = {llvm_team.state_name("f", n + 1): ctypes.addressof(a) for n, a in enumerate(arrays)}
    lost, flag = ctypes.c_int64(0), ctypes.c_int64(fixed)
    return team.LoopStates(lambda name: lookup.get(name, 0), ["f"], lost, flag), arrays, lost


def _race(loops, parallel_ns: int, solo_ns: int) -> list[int]:
    """Run one race to its end, clocking each plan at the given time: the plans the
    race's timed calls ran (after the untimed call that opens it on the plan for one
    thread)."""
    assert loops.plan() == SOLO | WARM
    ran = []
    for _ in range(2 * RACE_CALLS):
        plan = loops.plan()
        assert plan & TIMED
        ran.append(plan & SOLO)
        loops.clocked(plan, solo_ns if plan & SOLO else parallel_ns)
    return ran


def _between(loops, calls: int) -> set[int]:
    """The plans of ``calls`` calls that are not raced."""
    plans = {loops.plan() for _ in range(calls)}
    assert not any(p & TIMED for p in plans)
    return plans


@pytest.fixture
def clock(monkeypatch):
    """A fake monotonic clock for ``ucf.toolchain.team``: a stalled test process must not
    end a wait."""
    now = [10**12]
    monkeypatch.setattr(team, "time", SimpleNamespace(monotonic_ns=lambda: now[0]))
    return now


def test_a_parallel_plan_that_loses_as_a_whole_is_set_aside_and_retried(clock):
    """No region lost (the count never moves), yet the parallel plan takes 1.6 times the
    plan for one thread's time per call (count and fill passes against
    its one pass, each thread having 2/3 of a core): after the race the plan for one
    thread runs; the next race comes ``RACE_EVERY`` calls later and, while it keeps
    winning, twice as many calls later each time. When the machine is quiet again the
    parallel plan wins its race and runs from then on."""
    loops, arrays, lost = _loops()
    assert _between(loops, RACE_FIRST - 1) == {0}
    assert _race(loops, 16, 10) == RACED
    assert _between(loops, RACE_EVERY - 1) == {SOLO}
    every = RACE_EVERY
    for _ in range(3):  # it keeps winning: the calls between races double
        assert _race(loops, 16, 10) == RACED
        every = min(2 * every, RACE_EVERY_MAX)
        assert _between(loops, every - 1) == {SOLO}
    assert _race(loops, 8, 10) == RACED  # quiet: the parallel plan is back
    assert _between(loops, RACE_EVERY - 1) == {0}
    assert loops.plan() == SOLO | WARM  # and races again after RACE_EVERY calls
    assert lost.value == 0


def test_on_a_quiet_machine_the_parallel_plan_stays_and_races_ever_less(clock):
    """The parallel plan that wins every race keeps running; the calls between races
    double up to ``RACE_EVERY_MAX``, so a quiet machine races in few of its calls. A race
    is decided by medians: one slow call of the parallel plan (a busy moment) and one
    fast call of the plan for one thread do not decide it."""
    loops, arrays, _ = _loops()
    _between(loops, RACE_FIRST - 1)
    every, raced, calls = RACE_EVERY, 0, RACE_FIRST - 1
    while calls < 20 * RACE_EVERY_MAX:
        # parallel 8, 50, 8, 8; one thread 10, 10, 3, 10
        times = {0: iter([8, 50, 8, 8]), SOLO: iter([10, 10, 3, 10])}
        assert loops.plan() == SOLO | WARM
        for _ in range(2 * RACE_CALLS):
            plan = loops.plan()
            loops.clocked(plan, next(times[plan & SOLO]))
        raced += 2 * RACE_CALLS + 1
        every = min(2 * every, RACE_EVERY_MAX)  # the plan that ran won again
        assert _between(loops, every - 1) == {0}
        calls += 2 * RACE_CALLS + 1 + every - 1
    assert every == RACE_EVERY_MAX and raced / calls < 0.03


def test_no_race_on_a_fixed_team_below_the_work_threshold_or_while_loops_wait(clock):
    """A fixed team (``UCF_ADAPTIVE_TEAM=0``: the reference benchmarks compare with) runs
    the parallel plan; a kernel whose loops were never timed ran on one thread anyway;
    while the loops wait on one thread after a lost region, the plan for one thread
    runs untimed, and the race comes when the wait is over."""
    for loops, _, _ in (_loops(fixed=1), _loops(timed=False)):
        assert _between(loops, 3 * RACE_EVERY_MAX) == {0}
    loops, arrays, lost = _loops()
    end = clock[0] + 10**9
    for a in arrays:  # both loops lost: they wait on one thread until `end`
        a[:2] = [1, end]
    lost.value += 1
    assert _between(loops, 3 * RACE_EVERY) == {SOLO}
    clock[0] = end
    assert _race(loops, 8, 10) == RACED


def test_a_race_with_calls_missing_waits_for_them(clock):
    """A call asked for its plan twice (a remembered call whose plan for one thread is
    not remembered yet goes on to the full path) or not clocked (it raised) leaves the
    race where it was: the next call runs the same plan."""
    loops, arrays, _ = _loops()
    _between(loops, RACE_FIRST - 1)
    assert loops.plan() == SOLO | WARM
    for want in RACED[:-1]:
        plan = loops.plan()
        assert plan == want | TIMED and loops.plan() == plan  # asked twice: the same call
        loops.clocked(plan, 10 if plan & SOLO else 8)
    plan = loops.plan()
    assert plan == RACED[-1] | TIMED and loops.plan() == plan
    assert loops.plan() == plan  # the last call raised: the next takes its place
    assert loops.plan() == plan


def test_the_plans_race_only_where_they_do_different_work():
    """``same_work``: a plan for one thread that is the parallel plan without its
    ``parallelize`` (an SpMV's, a workspace kept) does not race; one with
    another pass over the sparse output (one pass against a parallel plan's two) or other commands
    does. A split whose blocks the parallel plan shares out is no other work where both
    append in one pass or both write a dense output (bcsr SpMM's block rows in dynamic
    chunks), and is where both fill a sparse output in two passes."""
    par = Parallelize("i", Parallel("CPUThread", "NoRaces"))
    ws = PrecomputeCommand("A(i, j) * B(j, k)", "k", "k")
    dense, sparse = SimpleNamespace(is_dense=True), SimpleNamespace(is_dense=False)

    def built(commands, one_pass=False, compiled=None, out=sparse):
        plan = SimpleNamespace(one_pass=one_pass, computed_format=out)
        return SimpleNamespace(commands=commands, compiled=compiled or SimpleNamespace(plan=plan))

    assert team.same_work(built([par]), built([]))
    assert team.same_work(built([ws, par]), built([ws]))
    assert not team.same_work(built([par]), built([], one_pass=True))
    assert not team.same_work(built([ws, par]), built([]))
    # one-pass rows run in chunks of their own, whatever split shared them out
    split = SplitCommand("i", "i_c", "i_r", 64)
    blocks = Parallelize("i_c", Parallel("CPUThread", "NoRaces"))
    assert team.same_work(built([split, blocks], True), built([], True))
    assert not team.same_work(built([split, blocks]), built([]))
    assert team.same_work(built([split, blocks], out=dense), built([], out=dense))
    assert not team.same_work(built([split, blocks], out=dense), built([]))
    other = SplitCommand("j", "j_c", "j_r", 8)  # a split of another loop is other work
    assert not team.same_work(built([other, split, blocks], out=dense), built([], out=dense))
    static = built(None)
    assert team.same_work(static, built(None, compiled=static.compiled))
    assert not team.same_work(built([par]), static)


def test_plans_of_the_same_work_race_no_more(clock):
    """After ``unrace`` no call is raced, and the loops' own timing still decides."""
    loops, arrays, lost = _loops()
    _between(loops, RACE_FIRST - 1)
    assert loops.plan() == SOLO | WARM
    loops.unrace()
    assert _between(loops, 3 * RACE_EVERY_MAX) == {0}
    for a in arrays:  # both loops lost: they wait on one thread
        a[:2] = [1, clock[0] + 10**9]
    lost.value += 1
    assert _between(loops, 3) == {SOLO}
    clock[0] += 10**9  # the wait is over: the parallel plan, and still no race
    assert _between(loops, 3 * RACE_EVERY_MAX) == {0}


@pytest.mark.parametrize(
    "text,formats,races",
    [
        # A sparse add appends in one pass on both plans (its parallel rows in chunks,
        # ucf.lower.row_chunks): they do the same work and do not race; made to race,
        # the calls follow the race through the full path.
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "csr"}, False),
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "csr"}, True),
        # A dense output, on the remembered call: an SpMV's plans do the same work and do
        # not race; made to race, its calls follow the race too.
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, False),
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, True),
    ],
)
def test_calls_follow_the_race_and_stay_exact(text, formats, races, monkeypatch):
    """Real calls at two threads whose races are clocked by the test (the plan for one
    thread faster, then the parallel plan): the call runs what won, through the full
    path (a sparse output) and the remembered call (a dense one), and every result
    matches scipy's on both plans; plans of the same work keep the parallel plan. Lost
    regions do not decide here (the test makes ``decide`` answer no), so the machine's
    load cannot change what runs."""
    if jit.openmp_runtime() is None:
        pytest.skip("no libgomp")
    faster = [SOLO]
    real = team.LoopStates.clocked

    def clocked(self, plan, ns):
        real(self, plan, 10 if plan & SOLO == faster[0] else 16)

    monkeypatch.setattr(team.LoopStates, "clocked", clocked)
    monkeypatch.setattr(team.LoopStates, "decide", lambda self, now: 0)
    if races:
        # LoopStates.stepped: the full path's check and the remembered call's
        monkeypatch.setattr(team, "same_work", lambda parallel, solo: False)
    rng = np.random.default_rng(45)
    n = 50_000
    A = sp.random(n, n, density=8 / n, format="csr", random_state=rng)
    ops = {"A": ucf.from_scipy(A, format="csr")}
    if "B(" in text:
        B = sp.random(n, n, density=8 / n, format="csr", random_state=rng)
        ops["B"] = ucf.from_scipy(B, format="csr")
        want = (A + B).tocsr()
    else:
        ops["x"] = rng.random(n)
        want = A @ ops["x"]

    def call() -> str:
        assert_exact(k(**ops), want)
        return "P" if "runs in parallel" in k.cin else "S"

    ucf.set_num_threads(2)
    forget_loaded()  # the plan's team states fresh, not left by another test's calls
    k = ucf.compile(text, formats=formats)
    if not races:  # a remembered call of the plan for one thread, as a bench has
        ucf.set_num_threads(1)
        call()
        ucf.set_num_threads(2)
    assert call() == "P"
    if not any(s[0] for s in k._built.compiled.teams.states):
        pytest.skip("no parallel loop was timed: the call is below the work threshold")
    # The first call loads the plan, and its team states; the first race comes at
    # the RACE_FIRST-th call after, and the plan for one thread runs after it.
    ran = "".join(call() for _ in range(RACE_FIRST + 1 + 2 * RACE_CALLS))
    if not races:
        ran += "".join(call() for _ in range(2 * RACE_EVERY))
        assert ran == "P" * len(ran)
        return
    raced = "".join("S" if p else "P" for p in RACED)
    assert ran == "P" * (RACE_FIRST - 1) + "S" + raced + "S"  # opened on one thread
    assert "".join(call() for _ in range(RACE_EVERY - 4)) == "S" * (RACE_EVERY - 4)
    assert "the plan for one thread for now" in k.cin
    faster[0] = 0  # the machine is quiet again: the parallel plan wins the next race
    ran = "".join(call() for _ in range(1 + 2 * RACE_CALLS + 8))
    assert ran.endswith("PPPP")
    assert "".join(call() for _ in range(RACE_EVERY - 8)) == "P" * (RACE_EVERY - 8)


def test_block_rows_in_chunks_race_no_more(monkeypatch):
    """bcsr SpMM whose block rows are uneven runs them in dynamic chunks (a split the
    plan for one thread has not): the same work into a dense output, so the plans do not
    race and no call runs on one thread while its regions win (on main each race ran 5
    calls of the plan for one thread, a quarter of a short benchmark's calls). Every
    call's result is the first's bit for bit, and numpy's to rounding."""
    if jit.openmp_runtime() is None:
        pytest.skip("no libgomp")
    monkeypatch.setattr(team.LoopStates, "decide", lambda self, now: 0)
    rng = np.random.default_rng(46)
    n, bs = 512, 32
    rows = n // bs
    # block row r stores r + 1 blocks: a static split gives one thread 2.8x the other's
    keep = np.arange(rows)[None, :] <= np.arange(rows)[:, None]
    a = (np.kron(keep, np.ones((bs, bs))) * rng.random((n, n))).astype(np.float32)
    b = rng.random((n, 64), dtype=np.float32)
    t = ucf.from_numpy(a, format="bcsr(32,32)")
    ucf.set_num_threads(2)
    forget_loaded()
    k = ucf.compile("C(i,j) = A(i,k) * B(k,j)", formats={"A": "bcsr(32,32)"}, dtype="float32")
    first = k(A=t, B=b).to_numpy().copy()
    np.testing.assert_allclose(first, a @ b, rtol=1e-4)
    commands = k._local.built.commands
    assert any(isinstance(c, SplitCommand) for c in commands), commands
    ran = ""
    for _ in range(RACE_FIRST + 1 + 2 * RACE_CALLS + 2 * RACE_EVERY):
        out = k(A=t, B=b).to_numpy()
        assert np.array_equal(out, first)
        ran += "P" if any(isinstance(c, Parallelize) for c in k._local.built.commands) else "S"
    assert ran == "P" * len(ran)
