"""ucf.tune: the search space, trials that fail, resuming, the stored plans, Dask, the CLI."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import parsed_formats
from ucf.exec import tuned
from ucf.schedule import parse_schedule
from ucf.tuning import format_space, measure, search_problem, space
from ucf.tuning.measure import Objective, median_time
from ucf.tuning.study_storage import default_storage

optuna = pytest.importorskip("optuna")

SPMV = "y(i) = A(i,j) * x(j)"
SPGEMM = "C(i,k) = A(i,j) * B(j,k)"


@pytest.fixture(autouse=True)
def one_thread():
    """Trials on one thread: on a loaded machine, parallel kernels of these tiny inputs
    spend their time waiting for threads, which makes a test slow, not a tuner wrong."""
    ucf.set_num_threads(1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache directory of the test's own: its study database and tuned plans."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    return tmp_path


def spmv_operands(n=200, seed=0):
    A = sp.random(n, n, density=0.03, format="csr", random_state=seed)
    x = np.random.default_rng(seed).random(n)
    return A, x


def completed(result):
    return [t for t in result.study.trials if t.value is not None]


def test_tune_is_at_least_as_fast_as_the_default(cache):
    A, x = spmv_operands()
    result = ucf.tune(SPMV, formats={"A": "csr"}, trials=5, seed=0, progress=False, A=A, x=x)
    first = result.study.trials[0]
    problem = search_problem.problem(SPMV, parsed_formats(SPMV, {"A": "csr"}), {"i": 200, "j": 200})
    assert first.params == {
        k: v for k, v in space.default_params(problem).items() if k in first.params
    }
    assert len(result.study.trials) == 5
    # the default is in the space and the best is timed again beside it: never slower
    assert result.time <= result.default_time * 1.1
    np.testing.assert_allclose(result.kernel(A=A, x=x).to_numpy(), A @ x, rtol=1e-12)
    # the best is recorded for schedule="tuned" (nothing when the default stays)
    assert tuned.lookup(_key(A, x)) == (None if result.is_default else result.schedule)
    # the schedule is text, the default's too, and compiles to the chosen kernel
    assert isinstance(result.schedule, str)
    k = ucf.compile(SPMV, formats={"A": "csr"}, schedule=result.schedule)
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x, rtol=1e-12)
    assert k(A=A, x=x) is not None and k.cin.splitlines()[0] == result.kernel.cin.splitlines()[0]


def test_every_trial_computes_what_scipy_does(cache):
    A = sp.random(60, 50, density=0.08, format="csr", random_state=1)
    B = sp.random(50, 40, density=0.08, format="csr", random_state=2)
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    result = ucf.tune(SPGEMM, formats=fmts, trials=6, seed=3, progress=False, A=A, B=B)
    done = completed(result)
    assert len(done) >= 2
    expected = (A @ B).toarray()
    for t in done:
        k = ucf.compile(SPGEMM, formats=fmts, schedule=t.user_attrs["schedule"])
        np.testing.assert_allclose(k(A=A, B=B).to_numpy(), expected, rtol=1e-12)


def test_a_workspace_is_found_for_a_sparse_output(cache, tmp_path):
    """SpGEMM into CSR: co-iterating every (i, k) converts B and is quadratic; the space
    holds Gustavson's workspace (the default model's choice too), and whatever the short
    seeded search keeps is no slower than the default."""
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    A = sp.random(100, 100, density=0.05, format="csr", random_state=1)
    B = sp.random(100, 100, density=0.05, format="csr", random_state=2)
    result = ucf.tune(SPGEMM, formats=fmts, trials=6, seed=1, progress=False, A=A, B=B)
    assert "precompute(A(i, j)*B(j, k), k, k" in result.schedule or result.is_default
    assert "precompute" in result.schedule  # the default's Gustavson workspace too
    assert result.time <= result.default_time
    np.testing.assert_allclose(result.kernel(A=A, B=B).to_numpy(), (A @ B).toarray())
    # the plan schedule="tuned" finds: keyed by the formats as given and the shape class
    shape = tuned.shape_class({"i": 100, "j": 100, "k": 100}, {"A": A.nnz, "B": B.nnz})
    key = tuned.make_key(SPGEMM, fmts, "float64", "int32", "llvm", shape)
    assert tuned.lookup(key) == (None if result.is_default else result.schedule)
    path = result.plot(tmp_path / "tune.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    p = search_problem.problem(SPGEMM, parsed_formats(SPGEMM, fmts), {"i": 60, "j": 50, "k": 40})
    assert p.base[0] == ("i", "k", "j") and ("i", "j", "k") in p.orders
    assert "A(i, j)*B(j, k)@k" in p.placeable(("i", "j", "k"))
    # over i, the workspace would share k with the rest of the statement
    assert "A(i, j)*B(j, k)@i" not in p.placeable(("i", "j", "k"))


def test_resuming_a_study_adds_trials(cache, tmp_path, capsys):
    A, x = spmv_operands(80)
    storage = f"sqlite:///{tmp_path / 'own.db'}"
    first = ucf.tune(
        SPMV, formats={"A": "csr"}, trials=3, seed=1, storage=storage, progress=False, A=A, x=x
    )
    assert capsys.readouterr().err == ""
    again = ucf.tune(
        SPMV, formats={"A": "csr"}, trials=2, seed=1, storage=storage, progress=True, A=A, x=x
    )
    assert first.study.study_name == again.study.study_name
    assert len(again.study.trials) == 5
    bar = capsys.readouterr().err  # the resumed bar counts the new trials, with the best
    assert "2/2" in bar and "best" in bar and "us" in bar
    assert not (cache / "tune.db").exists()  # storage= replaced the cache's database
    # Optuna commits many times a trial: the file logs ahead and syncs at checkpoints only.
    with sqlite3.connect(tmp_path / "own.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_sampling_stops_at_the_first_losing_sample():
    """A call that turns slow after its warm-up gets one sample past ``enough``, not five."""
    waits = iter([0.005, 0.03, 0.03, 0.03, 0.03, 0.03])
    calls = []

    def call():  # busy: with one thread, trials are timed by the thread's CPU time
        calls.append(1)
        end = time.thread_time() + next(waits)
        while time.thread_time() < end:
            pass

    seconds = median_time(call, repeats=5, enough=0.01)
    assert len(calls) == 2 and seconds >= 0.03


def test_the_default_is_timed_again_in_turn_with_the_trials(cache, monkeypatch):
    """Every REBASE distinct trials the default kernel is timed again; the bar trials
    lose against is the median of its timings, so one busy moment does not set it."""
    timings = iter([4e-3, 1e-3, 1.2e-3, 1.1e-3])
    monkeypatch.setattr(measure, "median_time", lambda call, repeats, **_: next(timings))
    A, x = spmv_operands(50)
    fmts = parsed_formats(SPMV, {"A": "csr"})
    objective = Objective(SPMV, fmts, "llvm", "float64", "int32", {"A": A, "x": x}, None, {}, {})
    np.testing.assert_allclose(objective.rebase().to_numpy(), A @ x)
    assert objective.baseline == 4e-3  # a busy start
    objective.rebase()
    objective.rebase()
    assert objective.baseline == 1.2e-3 and objective.hopeless() == 3 * 1.2e-3
    assert measure.REBASE >= 4  # a timing of the default costs what a trial's does


def test_a_trial_twice_as_slow_as_the_best_has_lost():
    fmts = parsed_formats(SPMV, {"A": "csr"})
    objective = Objective(SPMV, fmts, "llvm", "float64", "int32", {}, None, {}, {})
    objective.baseline = 1.0
    assert objective.hopeless() == 3.0  # HOPELESS times the default
    objective._seen[("", "a")] = (0.2, "")
    objective._seen[("", "b")] = (None, "refused")
    assert objective.hopeless() == 0.4  # LOSING times the best so far


def test_a_trial_that_raises_is_pruned(cache, monkeypatch):
    A, x = spmv_operands(50)
    real = measure.Kernel

    def failing(expr, schedule=None, **kw):
        if schedule is not None:
            raise RuntimeError("the backend fell over")
        return real(expr, schedule=schedule, **kw)

    monkeypatch.setattr(measure, "Kernel", failing)
    result = ucf.tune(SPMV, formats={"A": "csr"}, trials=4, seed=0, progress=False, A=A, x=x)
    states = {t.state for t in result.study.trials}
    assert states == {optuna.trial.TrialState.PRUNED}
    assert result.is_default and result.time == result.default_time
    assert result.schedule == result.kernel.schedule_used  # the default's, never None
    assert all("the backend fell over" in why for why in result.reasons.values())
    assert tuned.lookup(_key(A, x)) is None  # nothing better was found, nothing recorded
    np.testing.assert_allclose(result.kernel(A=A, x=x).to_numpy(), A @ x, rtol=1e-12)


def test_a_wrong_result_is_pruned(cache, monkeypatch):
    """A kernel that computes something else never wins, however fast it is."""
    A, x = spmv_operands(50)
    real = measure.Kernel

    class Doubled:
        def __init__(self, k):
            self.k = k

        def __call__(self, **kw):
            return ucf.from_numpy(2 * self.k(**kw).to_numpy())

    def wrong(expr, schedule=None, **kw):
        k = real(expr, schedule=schedule, **kw)
        return k if schedule is None else Doubled(k)

    monkeypatch.setattr(measure, "Kernel", wrong)
    result = ucf.tune(SPMV, formats={"A": "csr"}, trials=3, seed=0, progress=False, A=A, x=x)
    assert result.is_default and not completed(result)
    assert "differs from the default" in result.reasons["parallelize(i, CPUThread, NoRaces)"]


def _key(A, x):
    shape = tuned.shape_class({"i": A.shape[0], "j": A.shape[1]}, {"A": A.nnz})
    return tuned.make_key(SPMV, {"A": "csr"}, "float64", "int32", "llvm", shape)


def test_tuned_store_round_trip_and_key_canonical(cache):
    shape = tuned.shape_class({"i": 1000, "j": 7}, {"A": 2500})
    assert shape == "i=1024,j=7;A~2048"
    key = tuned.make_key(SPMV, {"A": "csr"}, np.float64, "int32", "llvm", shape)
    assert tuned.lookup(key) is None
    tuned.record(key, "split(i, i0, i1, 16)", 1e-4)
    assert tuned.lookup(key) == "split(i, i0, i1, 16)"
    # the same kernel spelled otherwise: 'UC', a dense x given, extra whitespace
    same = dict(key, statement="y(i)=A(i,j)*x(j)", formats={"A": "UC", "x": "dense"})
    assert tuned.lookup(same) == "split(i, i0, i1, 16)"
    assert tuned.lookup(dict(key, shape_class=tuned.shape_class({"i": 8, "j": 7}, {}))) is None
    (cache / tuned.FILE).write_text("{ not json")
    assert tuned.lookup(key) is None  # a damaged store is empty, never an error


def test_on_a_dask_cluster(cache):
    distributed = pytest.importorskip("distributed")
    pytest.importorskip("optuna_integration")
    A, x = spmv_operands(80)
    with (
        distributed.LocalCluster(
            n_workers=2, processes=False, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        result = ucf.tune(
            SPMV, formats={"A": "csr"}, trials=4, client=client, seed=0, progress=False, A=A, x=x
        )
    # the trials run on the cluster come back into the study in the cache directory
    stored = optuna.load_study(study_name=result.study.study_name, storage=default_storage())
    assert len(result.study.trials) == len(stored.trials) == 4
    assert completed(result)
    np.testing.assert_allclose(result.kernel(A=A, x=x).to_numpy(), A @ x, rtol=1e-12)


@pytest.mark.slow
def test_in_worker_processes(cache):
    A, x = spmv_operands(80)
    result = ucf.tune(
        SPMV, formats={"A": "csr"}, trials=4, n_jobs=2, seed=0, progress=False, A=A, x=x
    )
    assert len(result.study.trials) == 4 and completed(result)


def test_without_optuna_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    A, x = spmv_operands(10)
    with pytest.raises(
        ucf.MissingDependencyError,
        match=r"pip install optuna \(or pip install "
        r"'\.\[tune\]' in a ucf checkout\)",
    ):
        ucf.tune(SPMV, formats={"A": "csr"}, trials=1, A=A, x=x)


def test_importing_ucf_leaves_optuna_alone():
    code = "import sys, ucf; ucf.Tuned; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bad_requests_are_ucf_errors():
    A, x = spmv_operands(10)
    with pytest.raises(ucf.OperandError, match="missing operand x"):
        ucf.tune(SPMV, A=A)
    with pytest.raises(ucf.UcfError, match="trials >= 1"):
        ucf.tune(SPMV, trials=0, A=A, x=x)
    with pytest.raises(ucf.UcfError, match="storage URL"):
        ucf.tune(SPMV, n_jobs=2, storage=optuna.storages.InMemoryStorage(), A=A, x=x)
    with pytest.raises(ucf.UnsupportedError, match="cuda"):
        ucf.tune(SPMV, target="cuda", A=A, x=x)


def test_the_command_line(cache, tmp_path, capsys):
    import scipy.io

    from ucf.cli import main

    A, x = spmv_operands(60)
    scipy.io.mmwrite(tmp_path / "a.mtx", A)
    np.save(tmp_path / "x.npy", x)
    argv = ["tune", SPMV, "-i", f"A:{tmp_path / 'a.mtx'}", "-i", f"x:{tmp_path / 'x.npy'}"]
    assert (
        main(
            [
                *argv,
                "--trials",
                "2",
                "--seed",
                "0",
                "--no-progress",
                "--plot",
                str(tmp_path / "p.png"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("default: ") and "trials in the study" in out
    assert (tmp_path / "p.png").exists()


def test_study_names_fit_the_database():
    from ucf.tuning.study_storage import MAX_NAME, study_name

    key = tuned.make_key(SPMV, {"A": "csr"}, "float64", "int32", "llvm", "i=8;A~8")
    assert len(study_name(key)) < MAX_NAME and key["statement"] in study_name(key)
    long = dict(key, shape_class=";".join(f"v{n}=1024" for n in range(100)))
    other = dict(long, shape_class=long["shape_class"] + ",w=2")
    assert len(study_name(long)) <= MAX_NAME
    assert study_name(long) != study_name(other)


def test_formats_are_searched_and_every_trial_checked(cache):
    A, x = spmv_operands(80, seed=5)
    result = ucf.tune(
        SPMV, formats={"A": "csr"}, trials=4, seed=1, search_formats=True, progress=False, A=A, x=x
    )
    done = completed(result)
    assert done and {t.user_attrs["formats"]["A"] for t in result.study.trials} > {"UC"}
    for t in done:
        fmts = t.user_attrs["formats"]
        k = ucf.compile(SPMV, formats=fmts, schedule=t.user_attrs["schedule"])
        np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x, rtol=1e-12)
        assert (t.user_attrs["conversion"] > 0) == (fmts["A"] != "UC")
    choices = format_space.format_choices(SPMV, parsed_formats(SPMV, {"A": "csr"}))["A"]
    assert result.formats["A"] in {str(f) for f in choices}


def test_schedule_tuned_loads_the_stored_plan(cache):
    """compile(schedule="tuned") looks up, per call, what tuning stored for the operands'
    shape class; a shape class with nothing stored gets the default model's kernel."""
    A, x = spmv_operands(90)
    stored = "split(i, i0, i1, 16); parallelize(i0, CPUThread, NoRaces)"
    shape = tuned.shape_class({"i": 90, "j": 90}, {"A": A.nnz})
    tuned.record(
        tuned.make_key(SPMV, {"A": "csr"}, "float64", "int32", "llvm", shape), stored, 1e-6
    )
    k = ucf.compile(SPMV, formats={"A": "csr"}, schedule="tuned")
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x)
    assert "tuned: the schedule ucf.tune stored" in k.cin and "split(i, 16)" in k.cin, k.cin
    B, y = spmv_operands(40)
    np.testing.assert_allclose(k(A=B, x=y).to_numpy(), B @ y)
    assert "tuned:" not in k.cin and "# default:" in k.cin, k.cin


CSC_SPMM = "C(i,k) = A(i,j) * B(j,k)"
#: A workspace over all of i, filled and drained under (j, k): J*K*I work where the
#: statement does nnz*K (over 20 minutes at 50k rows).
QUADRATIC = "reorder(j, k, i); precompute(A(i, j)*B(j, k), i, i, w)"


def test_no_workspace_repeats_under_a_summed_dense_loop():
    p = search_problem.problem(
        CSC_SPMM, parsed_formats(CSC_SPMM, {"A": "csc"}), {"i": 1000, "j": 1000, "k": 32}
    )
    assert p.placeable(("j", "k", "i")) == [] and p.placeable(("j", "i", "k")) == []
    # under k alone (an output variable) the workspace is drained once per column of C
    assert p.placeable(("k", "j", "i")) == ["A(i, j)*B(j, k)@i"]
    # MTTKRP: a row of B*D under (i, k), where k walks B's stored fibers, is TACO's
    mttkrp = "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)"
    q = search_problem.problem(
        mttkrp, parsed_formats(mttkrp, {"B": "csf"}), {"i": 50, "j": 8, "k": 50, "l": 50}
    )
    assert "B(i, k, l)*D(l, j)@j" in q.placeable(("i", "k", "l", "j"))


def test_a_trial_that_runs_too_long_is_stopped_and_pruned(cache, monkeypatch):
    """The quadratic plan takes about a minute here; its trial is stopped at the limit
    (20x the default's time + a margin), pruned with the reason, and the study goes on."""
    n, rng = 20_000, np.random.default_rng(0)
    rows, cols = rng.integers(0, n, 5 * n), rng.integers(0, n, 5 * n)
    A = sp.csc_matrix((rng.random(5 * n), (rows, cols)), shape=(n, n))
    B = rng.random((n, 32))
    monkeypatch.setattr(space, "suggest", lambda trial, p, scope="": parse_schedule(QUADRATIC))
    start = time.perf_counter()
    result = ucf.tune(CSC_SPMM, formats={"A": "csc"}, trials=2, seed=0, progress=False, A=A, B=B)
    assert time.perf_counter() - start < 20
    assert result.is_default and not completed(result)
    assert "ran longer than" in result.reasons[QUADRATIC]
    np.testing.assert_allclose(result.kernel(A=A, B=B).to_numpy(), A @ B, rtol=1e-12)


def test_seed_schedules_are_the_hand_schedules_that_win():
    """bench/parallel.py's winners over ucf's default (SpMM: N bound, rows in blocks of
    16 to 256; SpMV: blocks of up to 8192 rows) are in the seeds, each once."""
    spmm = search_problem.problem(
        CSC_SPMM, parsed_formats(CSC_SPMM, {"A": "csr"}), {"i": 50_000, "j": 50_000, "k": 32}
    )
    texts = [space.spell(spmm, d) for d in space.seed_params(spmm, 2)]
    assert len(set(texts)) == len(texts)
    for rows in (16, 64, 256):
        hand = f"bound(k, kb, 32, MaxExact); split(i, i0, i1, {rows}); "
        assert hand + "parallelize(i0, CPUThread, NoRaces)" in texts
    spmv = search_problem.problem(
        SPMV, parsed_formats(SPMV, {"A": "csr"}), {"i": 50_000, "j": 50_000}
    )
    texts = [space.spell(spmv, d) for d in space.seed_params(spmv, 2)]
    assert "split(i, i0, i1, 8192); parallelize(i0, CPUThread, NoRaces)" in texts
    # one thread: no parallel seed, and the bound one
    texts = [space.spell(spmm, d) for d in space.seed_params(spmm, 1)]
    tiled = "bound(k, kb, 32, MaxExact); split(kb, kt, kr, 16); reorder(i, kt, j, kr)"
    assert texts == [tiled, "bound(k, kb, 32, MaxExact)"]


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_register_tiles_compute_what_numpy_does(target):
    """Every register tile the space offers (with each way of running on threads) for
    SpMM with N = 32 and for MTTKRP with R = 32 gives numpy's result."""
    rng = np.random.default_rng(7)
    A = sp.random(300, 200, density=0.05, format="csr", random_state=7)
    B = rng.random((200, 32))
    spmm = search_problem.problem(
        CSC_SPMM, parsed_formats(CSC_SPMM, {"A": "csr"}), {"i": 300, "j": 200, "k": 32}
    )
    mttkrp = "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)"
    T = sp.random(40 * 30, 20, density=0.05, random_state=8).toarray().reshape(40, 30, 20)
    C, D = rng.random((30, 32)), rng.random((20, 32))
    m = search_problem.problem(
        mttkrp, parsed_formats(mttkrp, {"B": "csf"}), {"i": 40, "k": 30, "l": 20, "j": 32}
    )
    texts = set()
    for parallel in ("none", "chunk", "nnz"):
        for tile in space.TILE_LOG2[1:]:
            params = {"bound_k": True, "bound_j": True, "tile_log2": tile, "parallel": parallel}
            texts.add((CSC_SPMM, space.spell(spmm, {**params, "chunk_log2": 4})))
            texts.add((mttkrp, space.spell(m, {**params, "chunk_log2": 2})))
    assert sum("kt, j, kr" in t for _, t in texts) == 2 * 2  # tiles of 8 and 16, not 32
    for expr, text in sorted(texts):
        if expr == CSC_SPMM:
            k = ucf.compile(expr, formats={"A": "csr"}, schedule=text, target=target)
            np.testing.assert_allclose(k(A=A, B=B).to_numpy(), A @ B, rtol=1e-12, err_msg=text)
        else:
            k = ucf.compile(expr, formats={"B": "csf"}, schedule=text, target=target)
            got = k(B=ucf.from_numpy(T, format="csf"), C=C, D=D).to_numpy()
            want = np.einsum("ikl,kj,lj->ij", T, C, D)
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=text)


def test_a_study_tries_the_seeds_after_the_default(cache):
    A = sp.random(300, 200, density=0.05, format="csr", random_state=4)
    B = np.random.default_rng(4).random((200, 8))
    result = ucf.tune(CSC_SPMM, formats={"A": "csr"}, trials=4, seed=0, progress=False, A=A, B=B)
    schedules = [t.user_attrs["schedule"] for t in result.study.trials]
    assert schedules[1] == "bound(k, kb, 8, MaxExact)"
    for text in schedules:
        k = ucf.compile(CSC_SPMM, formats={"A": "csr"}, schedule=text)
        np.testing.assert_allclose(k(A=A, B=B).to_numpy(), A @ B, rtol=1e-12)
