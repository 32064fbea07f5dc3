"""What a trial costs the tuner (issue 34: the headroom run must fit its budget): a
nest whose first call was stopped is not run again in its variants, a first call that
lost in the child is not made twice, and the default is timed again per timed trials.
Decisions are driven by injected probes and fake times; results checked against scipy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import parsed_formats
from tests.tuning.test_tune import CSC_SPMM, QUADRATIC, SPMV, spmv_operands
from ucf.schedule import parse_schedule
from ucf.tuning import measure, probe, search_problem
from ucf.tuning.measure import Objective

optuna = pytest.importorskip("optuna")


@pytest.fixture
def spmm(tmp_path, monkeypatch):
    """An objective of SpMM with A in CSC (60 rows), its default timed, on one thread in
    a cache of its own; extents so large that every reshaping plan is probed."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    ucf.set_num_threads(1)
    n = 60
    A = sp.random(n, n, density=0.1, format="csc", random_state=1)
    B = np.random.default_rng(2).random((n, 8))
    fmts = parsed_formats(CSC_SPMM, {"A": "csc", "B": "UU"})
    ops = {"A": ucf.from_scipy(A), "B": ucf.from_numpy(B)}
    objective = Objective(CSC_SPMM, fmts, "llvm", "float64", "int32", ops, None, {}, {})
    objective.reference = measure.comparable(objective.rebase())
    objective.extents = {"i": 10**6, "j": 10**6, "k": 10**6}
    return objective, A, B, ops


def test_a_nest_whose_first_call_was_stopped_is_not_run_again(spmm, monkeypatch):
    """Once a loop nest (order and workspaces) ran past the limit, the schedules that only
    split, bound or parallelize its loops are pruned with the reason, neither compiled
    nor called (each such call cost a stopped child and a new one: 1.4 s a trial, 98 of the
    112 schedules of SpGEMM's sweep); another nest is still run, and wins on its time."""
    objective, A, B, ops = spmm
    probed = []

    def first_call(request, operands, seconds):
        probed.append(request.schedule)
        if "precompute" in request.schedule:
            raise probe.TrialTimeout("its first call ran longer than the limit")
        return 0.0

    monkeypatch.setattr(objective._probe, "first_call", first_call)
    built, kernel = [], objective.kernel
    monkeypatch.setattr(objective, "kernel", lambda s, f=None: built.append(s) or kernel(s, f))
    v = objective.variant(objective.formats)
    with pytest.raises(probe.TrialTimeout):
        objective.measure(parse_schedule(QUADRATIC), v)
    split = QUADRATIC + "; split(k, ko, ki, 4); parallelize(j, CPUThread, Atomics)"
    with pytest.raises(ucf.UcfError, match="those of 'reorder.j, k, i.; precompute"):
        objective.measure(parse_schedule(split), v)
    assert len(probed) == len(built) == 1  # the split variant was neither built nor called
    other = "reorder(j, i, k)"  # another nest: probed, run, timed, and it agrees with scipy
    assert objective.measure(parse_schedule(other), v) > 0 and len(probed) == 2
    k = ucf.compile(CSC_SPMM, formats={"A": "csc"}, schedule=other)
    np.testing.assert_allclose(k(**ops).to_numpy(), A @ B, rtol=1e-12)


def test_with_more_threads_than_the_limit_a_stopped_nest_may_run_in_parallel(spmm, monkeypatch):
    """Where the threads outnumber the limit's factor, a parallel loop can take most of a
    stopped serial nest's work away: its parallel variants are probed, not pruned."""
    objective, A, B, ops = spmm
    probed = []

    def first_call(request, operands, seconds):
        probed.append(request.schedule)
        raise probe.TrialTimeout("its first call ran longer than the limit")

    monkeypatch.setattr(objective._probe, "first_call", first_call)
    monkeypatch.setattr("ucf.toolchain.jit.num_threads", lambda: probe.LIMIT)
    v = objective.variant(objective.formats)
    with pytest.raises(probe.TrialTimeout):
        objective.measure(parse_schedule(QUADRATIC), v)
    split = QUADRATIC + "; split(k, ko, ki, 4)"
    with pytest.raises(ucf.UcfError, match="those of 'reorder.j, k, i.; precompute"):
        objective.measure(parse_schedule(split), v)  # serial: still pruned
    parallel = QUADRATIC + "; parallelize(j, CPUThread, Atomics)"
    with pytest.raises(probe.TrialTimeout):
        objective.measure(parse_schedule(parallel), v)  # probed, not pruned
    assert len(probed) == 2


def test_a_first_call_in_the_child_that_has_lost_is_not_made_again(spmm, monkeypatch):
    """A probed trial whose first call in the child took over LOST times the bar of a lost
    trial is pruned without a call in the tuning process; one that took less is called,
    checked and timed there."""
    objective, A, B, ops = spmm
    objective.baseline = 1e-3  # so the bar of a lost trial is 3 ms
    child = iter([0.1, 2e-3])
    monkeypatch.setattr(objective._probe, "first_call", lambda *_: next(child))
    called, kernel = [], objective.kernel

    def counted(schedule, formats=None):
        k = kernel(schedule, formats)
        return lambda **kw: called.append(schedule) or k(**kw)

    monkeypatch.setattr(objective, "kernel", counted)
    v = objective.variant(objective.formats)
    with pytest.raises(ucf.UcfError, match="first call took 100 ms, over 2 times the 3 ms"):
        objective.measure(parse_schedule(QUADRATIC), v, objective.hopeless())
    assert not called
    other = parse_schedule("reorder(j, i, k)")
    assert objective.measure(other, v, objective.hopeless()) > 0 and called
    assert measure.LOST >= 2  # a fresh process's first call is not held to a warm one's


def test_the_default_is_timed_again_after_every_rebase_timed_trials(tmp_path, monkeypatch):
    """Trials pruned before their call (a refused schedule, a stopped nest) take no time
    in which the load could change: the default is timed again after every REBASE trials
    that were timed, not every REBASE trials. Every distinct schedule of SpMV's space,
    one in three timed (a fake time), the others pruned."""
    from optuna.trial import FixedTrial

    from ucf.tuning.sweep import every_schedule

    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    A, x = spmv_operands(50)
    fmts = parsed_formats(SPMV, {"A": "csr", "x": "U"})
    ops = {"A": ucf.from_scipy(A), "x": ucf.from_numpy(x)}
    objective = Objective(SPMV, fmts, "llvm", "float64", "int32", ops, None, {}, {})
    objective.reference = measure.comparable(objective.rebase())
    objective.extents = {"i": 50, "j": 50}
    rebased, tried = [], []
    monkeypatch.setattr(objective, "rebase", lambda: rebased.append(len(tried)))

    def fake(commands, v, enough):
        tried.append(commands)
        if len(tried) % 3:
            raise ucf.UcfError("refused")
        return 1e-3

    monkeypatch.setattr(objective, "measure", fake)
    schedules = every_schedule(search_problem.problem(SPMV, fmts, objective.extents))
    for params in schedules.values():
        try:
            objective(FixedTrial(params))
        except optuna.TrialPruned:
            pass
    timed = len(tried) // 3
    assert len(tried) == len(schedules) and timed > 2 * measure.REBASE
    assert len(rebased) == (timed - 1) // measure.REBASE
    assert all(n % 3 == 0 and n // 3 % measure.REBASE == 0 for n in rebased)
