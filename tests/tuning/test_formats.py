"""ucf.tune(search_formats=True): blocked and ELL formats offered where the operand's fill
says they can pay, dense factors in the mode order their loops walk, trials in them checked
against scipy, formats that do not fit pruned."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import parsed_formats
from ucf.exec import tuned
from ucf.format.format import parse_format
from ucf.tuning import format_space, measure, space, structure, study
from ucf.tuning.measure import Objective

optuna = pytest.importorskip("optuna")

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,j) = A(i,k) * B(k,j)"
SDDMM = "C(i,j) = A(i,j) * B(i,k) * D(k,j)"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One cache directory for the module's tests: they compile many of the same kernels
    (their studies and plans differ, by statement and shape class)."""
    return tmp_path_factory.mktemp("ucf-cache")


@pytest.fixture(autouse=True)
def one_thread(cache_dir, monkeypatch):
    monkeypatch.setenv("UCF_CACHE_DIR", str(cache_dir))
    ucf.set_num_threads(1)


def block_diagonal(blocks: int, size: int = 8, density: float = 0.9) -> sp.csr_matrix:
    parts = [sp.random(size, size, density=density, random_state=s) for s in range(blocks)]
    m = sp.block_diag(parts, format="csr")
    m.sort_indices()
    return m


def offered(m) -> dict[str, float]:
    return {o.format.name: o.fill for o in structure.offers(ucf.from_scipy(m, format="csr"))}


def test_block_fill_is_scipy_bsr_fill():
    """The fill of bh x bw blocks is nnz over the values scipy's BSR stores."""
    m = sp.random(96, 120, density=0.05, format="csr", random_state=3)
    coo = m.tocoo()
    for bh, bw in structure.BLOCKS:
        bsr = sp.bsr_matrix(m, blocksize=(bh, bw))
        fill = structure.block_fill(coo.row, coo.col, bh, bw, m.shape[1])
        assert fill == pytest.approx(m.nnz / bsr.data.size)


def test_blocks_and_ell_are_offered_only_where_they_fill():
    dense_blocks = offered(block_diagonal(12, density=1.0))
    assert dense_blocks["bcsr(8,8)"] == pytest.approx(1.0)
    assert dense_blocks["ell(8)"] == pytest.approx(1.0)
    uniform = sp.random(400, 400, density=0.01, format="csr", random_state=0)
    assert not [f for f in offered(uniform) if f.startswith("bcsr")]
    lengths = np.diff(uniform.indptr)
    assert ("ell" in " ".join(offered(uniform))) == (lengths.mean() / lengths.max() >= 0.5)
    fmts = parsed_formats(SPMV, {"A": "csr"})
    choices = format_space.format_choices(SPMV, fmts, {"A": ucf.from_scipy(uniform)})["A"]
    assert all(len(f.levels) == 2 for f in choices)  # no blocked format


def test_tuning_a_block_diagonal_matrix_over_formats_matches_scipy():
    A = block_diagonal(16)
    B = np.random.default_rng(0).random((A.shape[1], 8))
    result = ucf.tune(
        SPMM, formats={"A": "csr"}, trials=6, seed=0, search_formats=True, progress=False, A=A, B=B
    )
    fmts = parsed_formats(SPMM, {"A": "csr"})
    choices = [
        str(f) for f in format_space.format_choices(SPMM, fmts, {"A": ucf.from_scipy(A)})["A"]
    ]
    assert any(f.startswith("UCUU") for f in choices) and result.formats["A"] in choices
    np.testing.assert_allclose(result.kernel(**result.operands(A=A, B=B)).to_numpy(), A @ B)
    assert result.conversion_time == 0 or result.formats["A"] != "UC"
    # after the default, the default schedule in each blocked or ELL format offered
    tried = [t.user_attrs["formats"]["A"] for t in result.study.trials[1:]]
    assert tried and all(format_space.structured(parse_format(f)) for f in tried)
    for t in result.study.trials:
        if t.value is not None:
            fmts = t.user_attrs["formats"]
            k = ucf.compile(SPMM, formats=fmts, schedule=t.user_attrs["schedule"])
            got = k(A=ucf.from_scipy(A).convert(fmts["A"]), B=B).to_numpy()
            np.testing.assert_allclose(got, A @ B)


def _objective(A, B, choices) -> Objective:
    fmts = parsed_formats(SPMM, {"A": "UC", "B": "UU"})
    choices = {n: tuple(parse_format(f, order=2) for f in c) for n, c in choices.items()}
    tensors = {"A": ucf.from_scipy(A, format="csr"), "B": ucf.from_numpy(B)}
    objective = study._objective(SPMM, fmts, "llvm", "float64", "int32", tensors, None, False)
    objective.choices = choices
    return objective


def test_a_trial_in_a_blocked_format_computes_and_its_plan_loads():
    """A fixed trial in bcsr(8,8) with a parallel split of the block rows: its result is
    scipy's, and the plan recorded under the shape class of the converted operand is what
    ``schedule="tuned"`` loads for it."""
    A = block_diagonal(8)
    B = np.random.default_rng(1).random((A.shape[1], 8))
    bcsr = str(ucf.from_scipy(A).convert("bcsr(8,8)").format)
    objective = _objective(A, B, {"A": ("UC", bcsr)})
    formats = objective.chosen({"A": bcsr})
    scope = objective.scope(formats)
    params = space.default_params(objective.variant(formats).problem, scope)
    params.update({"format_A": bcsr, f"parallel{scope}": "chunk", f"chunk_log2{scope}": 2})
    trial = optuna.trial.FixedTrial(params)
    assert objective(trial) > 0
    schedule = trial.user_attrs["schedule"]
    assert "i_blk" in schedule and trial.user_attrs["conversion"] > 0
    v = objective.variant(formats)
    shape = study._shape(SPMM, v.operands, None)
    tuned.record(tuned.make_key(SPMM, v.formats, "float64", "int32", "llvm", shape), schedule, 1)
    k = ucf.compile(SPMM, formats=v.formats, schedule="tuned")
    np.testing.assert_allclose(k(**v.operands).to_numpy(), A @ B)
    assert "tuned: the schedule ucf.tune stored" in k.cin, k.cin


def test_a_format_that_does_not_fit_is_pruned(monkeypatch):
    A = sp.random(60, 60, density=0.1, format="csr", random_state=2)
    B = np.random.default_rng(2).random((60, 4))
    objective = _objective(A, B, {"A": ("UC", "UF1")})  # ell(1): rows hold more
    with pytest.raises(optuna.TrialPruned, match="cannot be stored"):
        objective(optuna.trial.FixedTrial({"format_A": "UF1"}))
    ell = tuple(parse_format(f, order=2) for f in ("UC", "UF1"))
    monkeypatch.setattr(format_space, "format_choices", lambda *a: {"A": ell})
    result = ucf.tune(
        SPMM, formats={"A": "csr"}, trials=6, seed=0, search_formats=True, progress=False, A=A, B=B
    )
    assert "cannot be stored" in result.reasons["formats A=UF1, B=UU"]
    assert result.formats["A"] == "UC"
    np.testing.assert_allclose(result.kernel(A=A, B=B).to_numpy(), A @ B)


class _Slowed:
    """A kernel whose every call costs ``extra`` seconds more on the clock ``ticks``
    advances."""

    def __init__(self, kernel, extra: float, ticks: list[float]):
        self.kernel, self.extra, self.ticks = kernel, extra, ticks

    def __call__(self, *args, **kwargs):
        self.ticks[0] += self.extra
        return self.kernel(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def test_the_tuner_picks_a_blocked_format_where_it_is_faster(monkeypatch):
    """On a clock where every kernel over an unblocked A costs 5 ms more a call (this
    machine's timings of kernels this small are noise, and on a busy one a blocked kernel's
    margin is too), a seeded study picks a blocked format, reports its conversion apart,
    and its kernel computes scipy's product."""
    ticks = [0.0]
    compile_ = measure.Kernel

    def compile_slowing_unblocked(statement, formats=None, **kwargs):
        k = compile_(statement, formats=formats, **kwargs)
        blocked = parse_format(formats["A"], order=2).blocked
        return _Slowed(k, 0.0 if blocked else 5e-3, ticks)

    monkeypatch.setattr(measure, "Kernel", compile_slowing_unblocked)
    monkeypatch.setattr(measure, "clock", lambda: lambda: time.perf_counter() + ticks[0])
    A = block_diagonal(16, density=1.0)
    B = np.random.default_rng(3).random((A.shape[1], 8))
    result = ucf.tune(
        SPMM,
        formats={"A": "csr"},
        trials=7,
        seed=0,
        search_formats=True,
        progress=False,
        storage=optuna.storages.InMemoryStorage(),  # a study of its own, not resumed
        A=A,
        B=B,
    )
    assert parse_format(result.formats["A"]).blocked, result.formats
    assert result.time < result.default_time
    assert result.conversion_time > 0 and 1 <= result.break_even < np.inf
    offered = {str(o.format) for o in structure.offers(ucf.from_scipy(A))}
    tried = {t.user_attrs["formats"]["A"] for t in result.study.trials}
    assert offered <= tried  # the default schedule in every offered format, first
    got = result.kernel(**result.operands(A=A, B=B))
    np.testing.assert_allclose(got.to_numpy(), A @ B)


def test_sddmm_offers_its_dense_factor_in_the_order_its_loops_walk():
    """SDDMM's loops run k innermost, so D(k,j) is offered column-major (B(i,k) is walked in
    its own order already); a blocked A beside the csr output would be converted in every
    call, so none is offered there, while SpMM on the same matrix gets blocked formats."""
    A = block_diagonal(8, density=1.0)
    operands = {"A": ucf.from_scipy(A)}
    fmts = parsed_formats(SDDMM, {"A": "csr", "C": "csr"})
    choices = format_space.format_choices(SDDMM, fmts, operands)
    assert [str(f) for f in choices["D"]] == ["UU", "UU:1,0"] and "B" not in choices
    assert not [f for f in choices["A"] if f.blocked]
    spmm = format_space.format_choices(SPMM, parsed_formats(SPMM, {"A": "csr"}), operands)
    assert "B" not in spmm and [f for f in spmm["A"] if format_space.structured(f)]


def test_tuning_sddmm_over_formats_matches_scipy():
    rng = np.random.default_rng(4)
    A = sp.random(64, 48, density=0.1, format="csr", random_state=4)
    B, D = rng.random((64, 16)), rng.random((16, 48))
    result = ucf.tune(
        SDDMM,
        formats={"A": "csr", "C": "csr"},
        trials=3,
        seed=0,
        search_formats=True,
        progress=False,
        A=A,
        B=B,
        D=D,
    )
    expected = A.multiply(B @ D).toarray()
    second = result.study.trials[1]
    assert second.user_attrs["formats"]["D"] == "UU:1,0" and second.user_attrs["conversion"] > 0
    for t in result.study.trials:
        if t.value is not None:
            fmts = t.user_attrs["formats"]
            k = ucf.compile(SDDMM, formats=fmts, schedule=t.user_attrs["schedule"])
            ops = {"A": A, "B": B, "D": ucf.from_numpy(D).convert(fmts["D"])}
            np.testing.assert_allclose(k(**ops).to_scipy().toarray(), expected)
    got = result.kernel(**result.operands(A=A, B=B, D=D))
    np.testing.assert_allclose(got.to_scipy().toarray(), expected)
