"""Random schedules over the classic sparse kernels, each case in a worker subprocess.

The generator, the numpy reference and the worker pool live in
``fuzz_cases.py`` (shared with ``bench/fuzz.py``, the long run).  Every
case must give the right answer or be refused with a ``ucf.UcfError``; a
wrong answer, any other exception, a crash or a hang fails the test with a
standalone repro script in the message.  Hypothesis runs derandomized and
without a database (the suite's profile, tests/helpers.py), so CI sees the same
cases every time; the slow test explores at random.
"""

from __future__ import annotations

import ctypes.util
import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import EXPLORE, needs_cc, rand_dense, rand_sparse
from tests.schedule import fuzz_cases
from tests.schedule.cases import SPMM, SPMV
from tests.schedule.cases import check as check_kernel
from tests.schedule.fuzz_cases import (
    KERNELS,
    Case,
    RandomDraw,
    WorkerPool,
    cases,
    draw_case,
    repro,
    run_case,
)

#: A case draws many choices (hypothesis' buffer can run out on one).
SKIPS = [HealthCheck.too_slow, HealthCheck.data_too_large]


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(size=1, timeout=120) as p:
        yield p


def check(pool: WorkerPool, case: Case) -> None:
    outcome = pool.run(case)
    assert not outcome.failed, f"{outcome.status}; repro:\n{repro(case, outcome)}"


# The default suite's share of the fuzzing (the same cases every run: tests/helpers.py);
# the slow test below and bench/fuzz.py explore at random.
@settings(max_examples=100, suppress_health_check=SKIPS)
@given(case=cases(("llvm",)))
def test_random_schedules_llvm(pool, case):
    check(pool, case)


@needs_cc
@settings(max_examples=100, suppress_health_check=SKIPS)
@given(case=cases(("c",)))
def test_random_schedules_c(pool, case):
    check(pool, case)


@pytest.mark.slow
@needs_cc
@settings(EXPLORE, max_examples=3000, suppress_health_check=SKIPS)
@given(case=cases(("llvm", "c")))
def test_random_schedules_long(pool, case):
    check(pool, case)


# --------------------------------------------------------------------------- the machinery


SPMV_CASE = Case(
    "SpMV", {"A": "csr"}, "split(i, i0, i1, 2)", "llvm", {"i": 5, "j": 4}, {"A": 0.6}, 7
)


def test_a_crashing_worker_is_a_failure_and_is_replaced(pool):
    outcome = pool.probe({"crash": True}, timeout=60)
    assert outcome.status == "crash" and outcome.failed
    assert "SIGSEGV" in outcome.detail
    assert pool.run(SPMV_CASE).status == "ok"


def test_a_write_past_a_block_fails_the_case_that_wrote(pool):
    """glibc's malloc debugger in the workers: a stray write aborts the case that made it,
    not a later innocent one."""
    if not ctypes.util.find_library("c_malloc_debug"):
        pytest.skip("this libc has no malloc debugger")
    outcome = pool.probe({"overrun": True}, timeout=60)
    assert outcome.status == "crash" and "SIGABRT" in outcome.detail
    assert pool.run(SPMV_CASE).status == "ok"


def test_a_silent_worker_is_a_hang():
    # Only the probe has the short timeout: the worker that replaces the hung one may take
    # longer than that to start on a loaded machine.
    with WorkerPool(size=1) as p:
        outcome = p.probe({"sleep": 60}, timeout=2)
        assert outcome.status == "hang" and outcome.failed
        assert p.run(SPMV_CASE).status == "ok"


def test_a_wrong_answer_is_a_failure(monkeypatch):
    assert run_case(SPMV_CASE).status == "ok"
    wrong = fuzz_cases.reference
    monkeypatch.setattr(fuzz_cases, "reference", lambda k, a: wrong(k, a) + 1)
    outcome = run_case(SPMV_CASE)
    assert outcome.status == "wrong" and outcome.failed


def test_a_refusal_is_allowed():
    case = Case("SpMV", {"A": "csr"}, "reorder(j, i)", "llvm", {"i": 3, "j": 3}, {"A": 0.5}, 1)
    outcome = run_case(case)
    assert outcome.status == "refused" and not outcome.failed
    assert outcome.detail.startswith("ScheduleError")


def test_the_repro_script_runs_the_case(tmp_path):
    script = tmp_path / "repro.py"
    script.write_text(repro(SPMV_CASE))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    broken = repro(SPMV_CASE).replace("want = ", "want = 1 + ")
    script.write_text(broken)
    assert subprocess.run([sys.executable, str(script)], capture_output=True).returncode != 0


def test_the_reference_is_numpy():
    rng = np.random.default_rng(0)
    B = rng.integers(1, 5, (2, 3, 4)).astype(float)
    C = rng.integers(1, 5, (3, 5)).astype(float)
    D = rng.integers(1, 5, (4, 5)).astype(float)
    got = fuzz_cases.reference(KERNELS["MTTKRP"], {"B": B, "C": C, "D": D})
    want = np.zeros((2, 5))
    for i, k, l, j in np.ndindex(2, 3, 4, 5):
        want[i, j] += B[i, k, l] * C[k, j] * D[l, j]
    np.testing.assert_array_equal(got, want)
    A = rng.integers(1, 5, (2, 3)).astype(float)
    got = fuzz_cases.reference(KERNELS["SpAdd"], {"A": A, "B": 2 * A})
    np.testing.assert_array_equal(got, 3 * A)


def test_the_random_draw_is_reproducible():
    first = [draw_case(RandomDraw(f"0:{n}"), ("llvm", "c")) for n in range(20)]
    again = [draw_case(RandomDraw(f"0:{n}"), ("llvm", "c")) for n in range(20)]
    assert first == again
    assert {c.kernel for c in first} > {"SpMV"}
    scheduled = [c for c in first if not (c.dynamic or c.tesa)]  # plan cases take none
    assert sum(1 for c in scheduled if c.schedule) >= len(scheduled) // 2


def test_the_draw_reaches_every_new_shape():
    """Tensors read twice and diagonals, unequal blocks, nm(n,m), dynamic tiles over 1
    and TeSA plans are drawn (issue 32), and schedules name the split loops."""
    drawn = [draw_case(RandomDraw(f"reach:{n}"), ("llvm", "c")) for n in range(600)]
    kernels = {c.kernel for c in drawn}
    assert {"SpMVx", "xAx", "DDt", "AA", "Diag", "Diag3"} <= kernels
    unequal = [
        f for c in drawn for f in c.formats.values() if f[:2] == "bc" and f[5:8] not in "(1,1)"
    ]
    assert any(f.split("(")[1].split(",")[0] != f.split(",")[1][:-1] for f in unequal)
    assert sum(1 for c in drawn for f in c.formats.values() if f.startswith("nm(")) >= 5
    assert sum(1 for c in drawn if c.dynamic and max(c.dynamic["tile"]) > 1) >= 5
    assert sum(1 for c in drawn if c.tesa) >= 5
    assert any("_blk" in c.schedule or "_in" in c.schedule for c in drawn)


def test_fused_pos_over_upper_levels_of_3d_tensor():
    """Issue 19 item 1, once skipped as a known bug: fuse + pos over the upper
    two levels of a UCC tensor must still visit its third level."""
    for schedule in ("fuse(i, j, f); pos(f, fp, B)", "fuse(j, k, f); pos(f, fp, B)"):
        case = Case("TTV", {"B": "UCC"}, schedule, "llvm", {"i": 3, "j": 3, "k": 3}, {"B": 0.3}, 0)
        outcome = run_case(case)
        assert outcome.status == "ok", repro(case, outcome)


#: name -> (statement, default loop order, operand -> its index variables, output variables)
RANDOM_STATEMENTS = {
    "elementwise": ("C(i,j) = A(i,j) * B(i,j)", "ij", {"A": "ij", "B": "ij"}, "ij"),
    "spmv": (SPMV, "ij", {"A": "ij", "x": "j"}, "i"),
    "spmm": (SPMM, "ijk", {"A": "ij", "B": "jk"}, "ik"),
    "add": ("C(i,j) = A(i,j) + B(i,j)", "ij", {"A": "ij", "B": "ij"}, "ij"),
}


def _numpy_reference(name: str, ops: dict[str, np.ndarray]) -> np.ndarray:
    if name == "elementwise":
        return ops["A"] * ops["B"]
    if name == "spmv":
        return ops["A"] @ ops["x"]
    if name == "spmm":
        return ops["A"] @ ops["B"]
    return ops["A"] + ops["B"]


@st.composite
def random_case(draw):
    """A statement, A's format, extents, operand seed and a legal schedule.

    Legal by construction: splits (factor 1..5, fresh names) of any current
    loop, reorders only when every operand is dense, and at most one
    ``parallelize(.., CPUThread, NoRaces)`` of the first loop that derives
    from an output variable (its iterations write disjoint output entries,
    and the output is dense).
    """
    name = draw(st.sampled_from(sorted(RANDOM_STATEMENTS)))
    expr, order, operands, outvars = RANDOM_STATEMENTS[name]
    fa = draw(st.sampled_from(["dense", "csr"]))
    extents = {v: draw(st.integers(1, 9)) for v in order}
    seed = draw(st.integers(0, 2**32 - 1))
    loops = list(order)
    origin = {v: v for v in order}
    commands: list[str] = []
    fresh = itertools.count()
    for _ in range(draw(st.integers(0, 4))):
        kinds = ["split", "reorder"] if fa == "dense" else ["split"]
        if draw(st.sampled_from(kinds)) == "split":
            v = draw(st.sampled_from(loops))
            factor = draw(st.integers(1, 5))
            outer, inner = f"{origin[v]}{next(fresh)}", f"{origin[v]}{next(fresh)}"
            at = loops.index(v)
            loops[at : at + 1] = [outer, inner]
            origin[outer] = origin[inner] = origin[v]
            commands.append(f"split({v}, {outer}, {inner}, {factor})")
        else:
            loops = list(draw(st.permutations(loops)))
            commands.append(f"reorder({', '.join(loops)})")
    if draw(st.booleans()):
        par = next(v for v in loops if origin[v] in outvars)
        commands.append(f"parallelize({par}, CPUThread, NoRaces)")
    return name, expr, operands, fa, extents, seed, "; ".join(commands)


@settings(
    max_examples=15,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=random_case())
def test_random_legal_schedules(target, case):
    name, expr, operands, fa, extents, seed, schedule = case
    rng = np.random.default_rng(seed)
    arrays = {}
    for t, vs in operands.items():
        shape = tuple(extents[v] for v in vs)
        arrays[t] = rand_sparse(rng, shape, 0.4) if t == "A" else rand_dense(rng, shape)
    formats = {} if fa == "dense" else {"A": fa}
    check_kernel(expr, formats, schedule or None, target, arrays, _numpy_reference(name, arrays))
