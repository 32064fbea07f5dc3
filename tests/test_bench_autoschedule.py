"""bench/autoschedule.py runs on a tiny suite, checks every result against scipy and writes its
JSON; a wrong ucf result is reported as wrong, never timed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "autoschedule.py"
UCF_COLUMNS = ("default", "tuned", "hand")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The script as a module (its imports of the bench directory resolve through sys.path)."""
    saved = list(sys.path)
    sys.path[:0] = [str(ROOT), str(SCRIPT.parent)]
    spec = importlib.util.spec_from_file_location("ucf_bench_autoschedule", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path[:] = saved
        for name in (spec.name, "parallel", "spmv_spmm"):
            sys.modules.pop(name, None)


@pytest.mark.slow
def test_smoke_run_checks_and_writes_json(tmp_path):
    out = tmp_path / "auto.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        *("--rows", "2000", "--quick", "--threads", "1", "--trials", "2"),
        *("--matrices", "uniform-10,tensor-uniform", "--kernels", "spmv,spgemm,mttkrp"),
        *("--json", str(out)),
    ]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| input | kernel |" in run.stdout and "| measure | target |" in run.stdout
    res = json.loads(out.read_text())
    got = {(r["input"], r["kernel"]) for r in res["rows"]}
    assert got == {("uniform-10", "spmv"), ("uniform-10", "spgemm"), ("tensor-uniform", "mttkrp")}
    for row in res["rows"]:
        assert row["status"] == "ok", row
        assert row["scipy"]["seconds"] > 0
        for col in UCF_COLUMNS:
            # No ucf column may be wrong or crash; SpGEMM's default is allowed to be too slow.
            assert row[col]["status"] in ("ok", "too slow", "skipped", "not available"), row[col]
        assert row["hand"]["status"] == "ok", row["hand"]
        assert row["hand"]["variant"] in row["hand"]["pilot_s"]
    spmv = next(r for r in res["rows"] if r["kernel"] == "spmv")
    assert spmv["default"]["status"] == "ok" and spmv["default"]["max_rel_err"] < 1e-9
    assert spmv["ratios"]["t_default/t_hand"] > 0
    assert [g["measure"] for g in res["grades"]][0] == "ucf default vs best hand schedule"


def test_a_wrong_result_is_reported_as_wrong(bench):
    rng = np.random.default_rng(3)
    m = sp.random(300, 200, density=0.05, format="csr", random_state=4)
    spec = bench.kernel_specs(1e9)["spmv"]
    case = spec.build(m, rng, None)
    case.expect = case.expect * 1.001  # the reference no ucf kernel can match
    args = type(
        "Args",
        (),
        {
            "repeat": 1,
            "pilot": 1,
            "budget": 10.0,
            "trials": 0,
            "clock": "cpu",
            "search_formats": False,
        },
    )()
    cell = bench.measure(spec, case, 1, bench.Tools(), args)
    assert cell["default"]["status"] == "wrong"
    assert cell["hand"]["status"] == "wrong"
    assert "seconds" not in cell["default"] and "seconds" in cell["scipy"]


def test_agrees_compares_values_of_dense_and_sparse_results(bench):
    a = sp.random(50, 40, density=0.1, format="csr", random_state=1)
    assert bench.agrees(a.copy(), a)[0]
    b = a.copy()
    b.data[3] += 1e-3
    assert not bench.agrees(b, a)[0]
    x = np.arange(5.0)
    assert bench.agrees(x + 1e-14, x)[0]
    assert not bench.agrees(x[:4], x)[0]


def test_suite_is_seeded_and_varied(bench):
    suite = bench.matrix_suite(512)
    assert len(suite) + len(bench.tensor_suite(512)) >= 20
    first = {n: g(np.random.default_rng(1)) for n, (_, g) in suite.items()}
    again = suite["powerlaw-2.0"][1](np.random.default_rng(1))
    assert (first["powerlaw-2.0"] != again).nnz == 0
    for name, m in first.items():
        assert m.has_canonical_format and m.nnz > 0, name
    lengths = np.diff(first["powerlaw-2.0"].indptr)
    assert lengths.max() > 10 * np.median(lengths)
    assert first["tall-skinny"].shape[0] > first["tall-skinny"].shape[1]
