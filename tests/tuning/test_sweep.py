"""The tuner's measure and its answer: an exhaustive sweep of a space, the sums of
products' workspaces in the space, and ``Tuned.schedule`` (never None: the chosen
schedule's text, the default's too, compiling to the chosen kernel)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import parsed_formats
from ucf.schedule import parse_schedule
from ucf.tuning import search_problem, space
from ucf.tuning.sweep import every_schedule

pytest.importorskip("optuna")

ELEMENTWISE = "y(i) = A(i) * x(i)"
SUM2 = "C(i,j) = A(i,k)*B(k,j) + D(i,l)*E(l,j)"
SPGEMM = "C(i,k) = A(i,j) * B(j,k)"


@pytest.fixture(autouse=True)
def one_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    ucf.set_num_threads(1)


def vector(n=300, seed=0):
    rng = np.random.default_rng(seed)
    a = np.where(rng.random(n) < 0.2, rng.random(n), 0.0)
    return ucf.from_numpy(a, format="C"), a, rng.random(n)


def sum2_operands(n=40, seed=3):
    ms = [sp.random(n, n, density=0.1, format="csr", random_state=seed + k) for k in range(4)]
    return dict(zip("ABDE", ms, strict=True)), ms[0] @ ms[1] + ms[2] @ ms[3]


def test_a_sweep_tries_every_schedule_of_the_space_once():
    A, a, x = vector()
    found = every_schedule(
        search_problem.problem(ELEMENTWISE, parsed_formats(ELEMENTWISE, {"A": "C"}), {"i": 300})
    )
    assert "" in found and "parallelize(i, CPUThread, NoRaces)" in found
    result = ucf.tune(
        ELEMENTWISE, formats={"A": "C"}, trials=len(found), exhaustive=True, progress=False,
        A=A, x=x,
    )  # fmt: skip
    tried = [t.user_attrs.get("schedule", t.params) for t in result.study.trials]
    assert len(tried) == len(found)
    assert isinstance(result.schedule, str) and result.time <= result.default_time
    k = ucf.compile(ELEMENTWISE, formats={"A": "C"}, schedule=result.schedule)
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), a * x)
    # a space larger than the trials given is refused, naming the limit
    with pytest.raises(ucf.UcfError, match="more than 3 schedules"):
        ucf.tune(ELEMENTWISE, formats={"A": "C"}, trials=3, exhaustive=True, A=A, x=x)
    with pytest.raises(ucf.UcfError, match="formats only"):
        ucf.tune(ELEMENTWISE, trials=3, exhaustive=True, search_formats=True, A=A, x=x)


def test_a_sum_of_products_space_offers_one_workspace_and_one_per_term():
    ops, expect = sum2_operands()
    fmts = dict.fromkeys("ABCDE", "csr")
    p = search_problem.problem(SUM2, parsed_formats(SUM2, fmts), {v: 40 for v in "ijkl"})
    order = ",".join(p.base[1])  # ucf's order with a workspace: Gustavson's
    places = p.placeable(p.base[1])
    spelled = {space.spell(p, {"order": order, f"precompute[{order}]": w}) for w in places}
    assert any(s.count("precompute(") == 1 and " + " in s for s in spelled)
    assert any(s.count("precompute(") == 2 for s in spelled)
    for schedule in spelled:
        k = ucf.compile(SUM2, formats=fmts, schedule=schedule)
        np.testing.assert_allclose(k(**ops).to_numpy(), expect.toarray(), err_msg=schedule)


def nest(k) -> list[str]:
    """The kernel's concrete index notation, without the default model's reasons."""
    return [line for line in k.cin.splitlines() if not line.lstrip().startswith("#")]


@pytest.mark.parametrize("statement", [ELEMENTWISE, SPGEMM, SUM2])
def test_tuned_schedule_is_never_none_and_builds_the_chosen_kernel(statement):
    if statement == ELEMENTWISE:
        formats, (A, _, x) = {"A": "C"}, vector()
        ops = {"A": A, "x": x}
    elif statement == SPGEMM:
        formats = dict.fromkeys("ABC", "csr")
        ops = {t: sp.random(50, 50, density=0.08, format="csr", random_state=s)
               for t, s in (("A", 5), ("B", 6))}  # fmt: skip
    else:
        formats, ops = dict.fromkeys("ABCDE", "csr"), sum2_operands()[0]
    # one trial, the default's: the default stays, and its schedule is spelled out
    result = ucf.tune(statement, formats=formats, trials=1, seed=0, progress=False, **ops)
    assert result.is_default and isinstance(result.schedule, str)
    assert result.schedule == result.kernel.schedule_used
    k = ucf.compile(statement, formats=formats, schedule=result.schedule)
    np.testing.assert_allclose(k(**ops).to_numpy(), result.kernel(**ops).to_numpy())
    assert nest(k) == nest(result.kernel)
    if statement != ELEMENTWISE:  # the default's Gustavson workspace is in its text
        assert "precompute(" in result.schedule


def test_a_plan_that_drops_the_defaults_workspace_runs_where_it_can_be_stopped():
    from ucf.tuning import probe

    default = parse_schedule(
        "precompute(A(i, j) * B(j, k), k, k); parallelize(i, CPUThread, NoRaces)"
    )
    big = {"i": 3000, "j": 3000, "k": 3000}
    # the default's own loops, however spelled, are timed in the process
    same = parse_schedule("precompute(A(i,j)*B(j,k), k, k, w); parallelize(i0, CPUThread, NoRaces)")
    assert not probe.needed(same, big, 0.01, default)
    # the plain nest (or another order) where the default has Gustavson's workspace is not
    assert probe.needed([], big, 0.01, default)
    assert probe.needed(parse_schedule("reorder(i, k, j)"), big, 0.01, default)
    assert not probe.needed([], big, 0.01, []) and not probe.needed([], big, 0.01)
    assert not probe.needed([], {"i": 10, "j": 10, "k": 10}, 0.01, default)  # too small to stall
