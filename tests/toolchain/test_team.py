"""The team a parallel loop runs on (issue 34: a busy machine): ``ucf_parallel``
shrinks a loop's team when a region waited for a late thread and tries the whole
team again later; kernels stay right while another thread burns a core; libgomp is
loaded with a bounded spin; the thread count follows the cgroup's quota."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import assert_exact, whole_team
from ucf.codegen import llvm_team
from ucf.toolchain import jit, team

ROOT = Path(__file__).resolve().parents[2]
REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@pytest.fixture
def parallel():
    """``ucf_parallel`` called directly on a region written in Python: each thread
    records the team size it saw, and the threads other than the caller sleep for
    ``late`` seconds (a thread the OS descheduled: wall time passes, CPU time does not)."""
    lib = jit.openmp_runtime()
    if lib is None:
        pytest.skip("no libgomp")
    entry = ctypes.CFUNCTYPE(
        None, REGION, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p
    )(jit._RUNTIME[0].address(llvm_team.ENTRY))
    state = (ctypes.c_int64 * 4)()
    seen: list[int] = []
    late = [0.0]
    won = [False]

    def body(_):
        seen.append(lib.omp_get_num_threads())
        if won[0] and lib.omp_get_num_threads() > 1:
            # A region that wins: 0.2 s of the caller's wall time, 0.03 s of CPU time on
            # the other thread, 0.23 s on one thread, done in about 0.2 s. It wins while
            # the other thread gets 0.03 s of CPU within 0.9 * 0.23 s: 15 % of a core, which
            # a loaded machine (load 11 on 2 cores: about 18 % each) mostly grants.
            if lib.omp_get_thread_num() == 0:
                time.sleep(0.2)
            else:
                start = time.thread_time()
                while time.thread_time() - start < 0.03:
                    pass
        elif lib.omp_get_thread_num() != 0:
            time.sleep(late[0])

    region = REGION(body)

    def run(threads: int = 0, sleep: float = 0.0, win: bool = False) -> list[int]:
        seen.clear()
        late[0], won[0] = sleep, win
        entry(region, None, threads, 0, ctypes.addressof(state))
        return sorted(seen)

    ucf.set_num_threads(2)
    return run, state


def test_a_region_that_waits_for_a_late_thread_shrinks_its_team(parallel):
    run, state = parallel
    before = jit.team_counters()
    assert run(sleep=0.05) == [2, 2]  # the second thread is 50 ms late: the region lost
    after = jit.team_counters()
    assert after["timed"] == before["timed"] + 1 and after["lost"] == before["lost"] + 1
    assert state[0] == 1 and state[2] == 2 * llvm_team.BACKOFF_NS
    _within_the_wait(run, state, after["timed"])
    _until_the_wait_ends(state)
    wait = state[2]
    assert run(sleep=0.05) == [2, 2]  # then one region tries the whole team: lost again
    assert state[0] == 1 and state[2] == 2 * max(wait, llvm_team.BACKOFF_NS)  # doubled
    # A probe that wins halves the wait. Whether a region wins depends on the other
    # thread getting 30 ms of CPU within about 207 ms: a loaded machine can deny it, and
    # the probe then loses and doubles the wait, up to MAX_BACKOFF_NS (after 9 losses in
    # a row: 2 ms doubled to 1.024 s is capped); so probe until one wins.
    for _ in range(12):
        _until_the_wait_ends(state)
        wait = state[2]
        assert run(win=True) == [2, 2]
        if state[0] == 2:
            break
        assert state[2] == min(2 * wait, llvm_team.MAX_BACKOFF_NS)  # it lost: doubled
    else:
        pytest.fail("no probe won in 12 tries")
    halved = wait // 2 if wait // 2 >= llvm_team.BACKOFF_NS else 0
    assert state[2] == halved  # the whole team, the wait halved
    assert run(win=True) == [2, 2]
    if state[0] == 2:  # a region that is not a probe and wins leaves the wait alone
        assert state[2] == halved


def test_a_wait_that_keeps_doubling_stops_at_its_cap(parallel):
    """A loop that keeps losing waits at most MAX_BACKOFF_NS: a loaded machine reaches
    the cap in 9 losses (the probe loop above may meet it); written here, not slept
    through."""
    run, state = parallel
    state[0], state[1], state[2] = 1, 0, 3 * llvm_team.MAX_BACKOFF_NS // 4
    assert run(sleep=0.05) == [2, 2]  # a probe (the wait is over) that loses
    assert state[0] == 1 and state[2] == llvm_team.MAX_BACKOFF_NS
    start = state[1] - 3 * llvm_team.MAX_BACKOFF_NS // 4  # it waits what it was told
    assert start <= time.monotonic_ns()
    state[1] = 0
    assert run(sleep=0.05) == [2, 2] and state[2] == llvm_team.MAX_BACKOFF_NS


def _within_the_wait(run, state, timed: int) -> None:
    """Within the wait the loop runs on the calling thread alone, untimed. The wait is
    2 ms: a descheduled test process may wake after it, so the check holds only then."""
    if time.monotonic_ns() < state[1]:
        seen = run()
        assert seen == [1] or time.monotonic_ns() >= state[1]
        if seen == [1]:
            assert jit.team_counters()["timed"] == timed


def _until_the_wait_ends(state) -> None:
    time.sleep(max(0, state[1] - time.monotonic_ns()) / 1e9 + 1e-3)


def test_a_fixed_team_keeps_every_thread(parallel):
    """UCF_ADAPTIVE_TEAM=0 (read when the runtime is linked), or jit.set_whole_team,
    runs every region on the whole team, as plain OpenMP does: what benchmarks compare
    with."""
    run, state = parallel
    before = jit.team_counters()
    assert jit.set_whole_team(True) is False
    try:
        assert run(sleep=0.02) == [2, 2] and run(sleep=0.02) == [2, 2]
    finally:
        assert jit.set_whole_team(False) is True
    assert jit.team_counters() == before and list(state) == [0, 0, 0, 0]


def test_below_the_work_threshold_a_loop_runs_alone_untimed(parallel):
    run, state = parallel
    before = jit.team_counters()
    assert run(threads=1, sleep=0.05) == [1]
    assert jit.team_counters() == before and list(state) == [0, 0, 0, 0]


#: Kernels of each parallel shape: a static row loop, dynamic chunks of a split, a
#: reduction into a scalar (private sums added atomically), and Gustavson's SpGEMM
#: (a workspace per thread, a sparse output assembled in parallel).
KERNELS = [
    ("y(i) = A(i,j) * x(j)", "parallelize(i,CPUThread,NoRaces)"),
    ("y(i) = A(i,j) * x(j)", "split(i,i0,i1,16); parallelize(i0,CPUThread,NoRaces)"),
    ("s = A(i,j) * x(j)", "parallelize(i,CPUThread,Atomics)"),
    (
        "C(i,k) = A(i,j) * B(j,k)",
        "precompute(A(i,j)*B(j,k),k,k,w); parallelize(i,CPUThread,NoRaces)",
    ),
]


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_kernels_are_right_while_another_thread_burns_a_core(target, monkeypatch):
    """A kernel called from a thread of its own, 2 threads, while another thread keeps a
    core busy (hashing releases the GIL): every result is checked against scipy."""
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")
    rng = np.random.default_rng(34)
    A = sp.random(300, 200, density=0.05, format="csr", random_state=rng)
    B = sp.random(200, 150, density=0.05, format="csr", random_state=rng)
    x = rng.random(200)
    expected = {
        "y(i)": A @ x,
        "s =": float(np.asarray(A.sum(axis=0)).ravel() @ x),
        "C(i,": (A @ B).toarray(),
    }
    kernels = []
    for text, schedule in KERNELS:
        formats = {"A": "csr", "B": "csr", "C": "csr"} if "C(" in text else {"A": "csr"}
        kernels.append((text, ucf.compile(text, formats=formats, schedule=schedule, target=target)))
    stop = threading.Event()
    data = bytes(1 << 20)

    def burn():
        while not stop.is_set():
            hashlib.sha256(data).digest()

    wrong: list[str] = []

    def call():
        for _ in range(40):
            for text, k in kernels:
                out = k(A=A, x=x) if "B(" not in text else k(A=A, B=B)
                got = out.to_scipy().toarray() if "C(" in text else out.to_numpy()
                want = next(v for key, v in expected.items() if text.startswith(key))
                if not np.allclose(got, want):
                    wrong.append(text)

    ucf.set_num_threads(2)
    burner = threading.Thread(target=burn)
    caller = threading.Thread(target=call)
    burner.start()
    try:
        caller.start()
        caller.join()
    finally:
        stop.set()
        burner.join()
    assert wrong == []


def test_libgomp_spins_briefly_unless_told_otherwise(tmp_path):
    """ucf loads libgomp with a bounded spin and takes the setting out of the
    environment again; a wait policy the user chose stands."""
    script = (
        "import os, numpy as np, ucf\n"
        "k = ucf.compile('y(i) = x(i) * 2.0', schedule='parallelize(i,CPUThread,NoRaces)')\n"
        "k(x=np.ones(4))\n"
        "print('GOMP_SPINCOUNT' in os.environ)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), UCF_CACHE_DIR=str(tmp_path))
    env.update(OMP_DISPLAY_ENV="verbose")
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    ours = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert ours.returncode == 0, ours.stderr
    assert f"GOMP_SPINCOUNT = '{team.SPIN_COUNT}'" in ours.stderr
    assert ours.stdout.split() == ["False"]
    env["OMP_WAIT_POLICY"] = "active"
    theirs = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert theirs.returncode == 0, theirs.stderr
    assert f"GOMP_SPINCOUNT = '{team.SPIN_COUNT}'" not in theirs.stderr
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in theirs.stderr


@pytest.mark.parametrize(
    "quota, period, cpus",
    [
        ("200000 100000", None, 2.0),
        ("max 100000", None, None),
        ("150000", "100000", 1.5),
        ("-1", "100000", None),
        ("garbled", None, None),
    ],
)
def test_a_cgroup_quota_is_read_in_cpus(quota, period, cpus):
    assert team._quota(lambda: quota, None if period is None else lambda: period) == cpus


def test_the_cores_follow_the_affinity_mask():
    assert 1 <= team.available_cores() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "text,formats",
    [
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "csr"}),
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}),  # a dense output: the remembered call
    ],
)
def test_a_team_shrunk_to_one_runs_the_one_thread_plan(text, formats):
    """While every parallel loop of a kernel's plan runs on a team of one, a call runs
    the plan for one thread (a sparse add's one pass); once the wait is over, the
    parallel plan and its larger team again. Each result is checked against scipy."""
    if jit.openmp_runtime() is None:
        pytest.skip("no libgomp")
    rng = np.random.default_rng(34)
    A = sp.random(50_000, 50_000, density=8 / 50_000, format="csr", random_state=rng)
    B = sp.random(50_000, 50_000, density=8 / 50_000, format="csr", random_state=rng)
    x = rng.random(50_000)
    ops = {"A": ucf.from_scipy(A, format="csr")}
    if "B(" in text:
        ops["B"] = ucf.from_scipy(B, format="csr")
        want = (A + B).tocsr()
    else:
        ops["x"] = x
        want = A @ x

    def call() -> str:
        assert_exact(k(**ops), want)
        return k.cin

    # Regions on the whole team leave the loops' states as the test writes them, whatever
    # the machine's load.
    ucf.set_num_threads(2)
    with whole_team():
        k = ucf.compile(text, formats=formats)
        call()
        assert "runs in parallel" in call()
        teams = k._built.compiled.teams
        assert teams is not None and teams.states and not _alone(teams)
        end = time.monotonic_ns() + 600 * 10**9  # no stall of a loaded machine ends it
        for state in teams.states:  # as ucf_parallel leaves a loop that lost
            state[0], state[1], state[3] = 1, end, 1000
        jit.team_counter("lost").value += 1  # and counts it
        assert _alone(teams)
        for _ in range(2):
            cin = call()
            assert "runs in parallel" not in cin and "one thread is available" in cin
            assert "the plan for one thread for now" in cin
        if "B(" in text:
            assert "appended in one pass" in cin
        for state in teams.states:  # the wait is over (written, not slept through)
            state[1] = time.monotonic_ns() - 1
        jit.team_counter("lost").value += 1  # so that plan() looks again
        # The parallel plan tries again.
        assert not _alone(teams) and "runs in parallel" in call()


def _alone(loops: team.LoopStates) -> bool:
    """Whether the loops' states put a call now on the plan for one thread (not a race
    of the plans: the one opened when a wait ends runs that plan too, untimed)."""
    plan = loops.plan()
    return bool(plan & team.SOLO) and not plan & (team.TIMED | team.WARM)


def _loops(works: dict[str, int]):
    """LoopStates over states written by the test: loops f1, f2 of function f and g1 of
    g, with their works (ns); a counter of lost regions of the test's own."""
    arrays = {n: (ctypes.c_int64 * 4)() for n in works}
    lookup = {llvm_team.state_name(n[0], int(n[1])): ctypes.addressof(a) for n, a in arrays.items()}
    lost = ctypes.c_int64(0)
    loops = team.LoopStates(lambda name: lookup.get(name, 0), ["f", "g", "h"], lost)
    for n, a in arrays.items():
        a[3] = works[n]
    return loops, arrays, lost


def test_the_loops_holding_most_of_the_work_decide_the_plan():
    """``LoopStates.decide`` on a fake clock: the loops that wait on one thread must hold
    most of the timed loops' work. A cheap first region (an SDDMM's, 0.4 % of the work)
    that lost does not put the kernel on one thread; a sparse add's fill pass (80 %)
    does, its count pass (20 %) alone does not. Loops never timed weigh nothing; a loop
    whose wait is over weighs against."""
    loops, a, _ = _loops({"f1": 14, "f2": 3960, "g1": 0})
    now = 10**12
    assert loops.decide(now) == 0  # never timed
    a["f1"][:3] = [1, now + 5, 2]  # the cheap region lost; the main loop won on two
    a["f2"][0] = 2
    assert loops.decide(now) == 0
    a["f2"][:2] = [1, now + 9]  # the main loop waits too: until the first wait ends
    assert loops.decide(now) == now + 5 and loops.decide(now + 5) == now + 9
    assert loops.decide(now + 9) == 0  # every wait is over

    loops, a, _ = _loops({"f1": 5725, "f2": 20990})  # count, then fill
    a["f1"][:2] = [2, 0]
    a["f2"][:2] = [1, now + 7]
    assert loops.decide(now) == now + 7
    a["f1"][:2] = [1, now + 3]
    a["f2"][:2] = [2, 0]
    assert loops.decide(now) == 0
    a["f1"][:2] = [1, now + 3]
    a["f2"][:2] = [0, 0]  # only the count pass was timed (the fill below the threshold)
    assert loops.decide(now) == now + 3


def test_the_answer_is_kept_until_a_region_is_lost_or_a_wait_ends(monkeypatch):
    """``LoopStates.plan`` reads the states again only when the count of lost regions
    moves, or when the first wait of a yes ends: a remembered call on a quiet machine
    reads one counter. On a fake clock (a stalled test process must not end a wait)."""
    now = [10**12]
    monkeypatch.setattr(team, "time", SimpleNamespace(monotonic_ns=lambda: now[0]))
    loops, a, lost = _loops({"f1": 100, "f2": 100, "g1": 100})
    assert not _alone(loops)
    end = now[0] + 50_000_000
    for n in ("f1", "f2"):
        a[n][:2] = [1, end]
    assert not _alone(loops)  # no region lost since it last looked
    lost.value += 1
    assert _alone(loops)
    now[0] = end - 1
    assert _alone(loops)
    now[0] = end
    assert not _alone(loops)  # the wait ended
    later = now[0] + 600 * 10**9
    for n in ("f1", "f2"):
        a[n][:2] = [1, later]
    assert not _alone(loops)
    lost.value += 1
    assert _alone(loops)


def test_a_remembered_call_watches_team_states_only_where_they_decide():
    """A replay reads team states only where a team of one would run another plan: a
    kernel with a schedule of its own keeps its plan (``Replay.teams`` is None: the
    remembered call does no team work), a default kernel's parallel plan at two
    threads watches its loops. Results against scipy."""
    if jit.openmp_runtime() is None:
        pytest.skip("no libgomp")
    rng = np.random.default_rng(7)
    A = sp.random(50_000, 50_000, density=8 / 50_000, format="csr", random_state=rng)
    x = rng.random(50_000)
    ops = {"A": ucf.from_scipy(A, format="csr"), "x": x}
    ucf.set_num_threads(2)
    with whole_team():
        for schedule in ("parallelize(i,CPUThread,NoRaces)", None):
            k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=schedule)
            for _ in range(3):
                np.testing.assert_allclose(k(**ops).to_numpy(), A @ x, rtol=1e-12)
            teams = k._local.replays[0].teams
            if schedule is not None:
                assert teams is None
            else:
                assert "runs in parallel" in k.cin
                assert teams is k._built.compiled.teams and teams.states


def test_a_cheap_loop_that_lost_keeps_the_parallel_plan():
    """An SDDMM's parallel plan has a cheap first region and the main loop: the first
    losing to a sleeping worker's wake-up (its state written as ucf_parallel leaves it,
    a small share of the work) keeps the parallel plan; the main loop waiting on one
    thread runs the plan for one thread. Results against scipy."""
    if jit.openmp_runtime() is None:
        pytest.skip("no libgomp")
    rng = np.random.default_rng(11)
    A = sp.random(20_000, 20_000, density=8 / 20_000, format="csr", random_state=rng)
    u, v = rng.random((20_000, 16)), rng.random((20_000, 16))
    c = A.tocoo()
    want = sp.csr_matrix(
        (c.data * np.einsum("ik,ik->i", u[c.row], v[c.col]), (c.row, c.col)), shape=A.shape
    )
    ops = {"A": ucf.from_scipy(A, format="csr"), "U": u, "V": v}

    def call() -> str:
        assert abs(k(**ops).to_scipy().tocsr() - want).max() <= 1e-9
        return k.cin

    ucf.set_num_threads(2)
    with whole_team():
        text = "C(i,j) = A(i,j) * U(i,k) * V(j,k)"
        k = ucf.compile(text, formats={"A": "csr", "C": "csr"})
        assert "runs in parallel" in call()
        states = k._built.compiled.teams.states
        assert len(states) == 2
        end = time.monotonic_ns() + 600 * 10**9
        for s in states:  # every loop won on two threads
            s[0], s[1], s[3] = 2, 0, 4_000_000
        states[0][:] = [1, end, 2 * llvm_team.BACKOFF_NS, 14_000]  # the cheap one lost
        jit.team_counter("lost").value += 1
        assert "runs in parallel" in call()
        states[-1][:] = [1, end, 2 * llvm_team.BACKOFF_NS, 4_000_000]  # the main one too
        jit.team_counter("lost").value += 1
        assert "the plan for one thread for now" in call()
