"""Schedules that must be refused, each with a message that names what is wrong (the
variable, the operand, the command) in its own words, not only by echoing the text.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import ucf
from tests.schedule.cases import PAR_I, ROOT, SPMM, SPMV, names, without_echo

ILLEGAL = [
    # (statement, formats, schedule, names the message must contain)
    pytest.param(SPMV, {}, "pos(i, ipos, A)", ["i"], id="pos-dense-operand"),
    pytest.param(SPMV, {"A": "csr"}, "pos(i, ipos, A)", ["i"], id="pos-uncompressed-level"),
    pytest.param(SPMV, {"A": "csr"}, "pos(i, ipos, x)", ["x", "i"], id="pos-tensor-without-var"),
    pytest.param(SPMV, {"A": "csr"}, "unroll(i, 4)", ["i"], id="unroll-without-bound"),
    pytest.param(
        "C(i,j) = A(i,j) + B(i,j)",
        {"A": "dcsr", "B": "dcsr"},
        PAR_I,
        ["i"],
        id="parallelize-while-loop",
    ),
    pytest.param(SPMV, {"A": "csr"}, "reorder(j, i)", ["A"], id="reorder-against-storage"),
    pytest.param(
        SPMV, {"A": "csr"}, "parallelize(j, CPUThread, NoRaces)", ["j"], id="parallelize-reduction"
    ),
]


@pytest.mark.parametrize("expr,formats,schedule,must_name", ILLEGAL)
def test_illegal_schedule_names_the_culprit(expr, formats, schedule, must_name):
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile(expr, formats=formats, schedule=schedule)
    message = str(e.value)
    assert "not supported" not in message, message
    explanation = without_echo(message, schedule)
    for n in must_name:
        assert names(explanation, n), f"{n!r} not named in: {message}"


def test_cli_illegal_schedule_exits_1(tmp_path):
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile(SPMV, formats={"A": "csr"}, schedule="reorder(j,i)")
    env = dict(os.environ)
    env["UCF_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    code = "import sys; from ucf.cli import main; sys.exit(main())"
    argv = ["compile", SPMV, "-f", "A:csr", "-s", "reorder(j,i)"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("ucf: error: ")
    assert "Traceback" not in proc.stderr
    assert str(e.value) in proc.stderr
    assert names(proc.stderr, "A")


@pytest.mark.parametrize(
    "schedule",
    [
        "split(i,i0,i1,16); parallelize(i0, GPUBlock, NoRaces)",
        "split(i,i0,i1,16); parallelize(i0, GPUBlock, NoRaces); "
        "parallelize(i1, GPUThread, NoRaces)",
    ],
    ids=["block", "block-thread"],
)
def test_gpu_units_need_the_cuda_target(schedule, target):
    with pytest.raises(ucf.UcfError) as e:
        ucf.compile(SPMV, formats={"A": "csr"}, schedule=schedule, target=target)
    assert not isinstance(e.value, ucf.ParseError)
    message = str(e.value)
    assert "not supported" not in message, message
    explanation = without_echo(message, schedule)
    assert "GPU" in explanation and "cuda" in explanation, message


@pytest.mark.parametrize(
    "schedule,culprit,why",
    [
        ("split(k,k0,k1,8); bound(k1,kb,8,MaxExact)", "k1", "already known"),
        ("divide(k,k0,k1,4); bound(k0,kb,4,MaxExact)", "k0", "already known"),
        ("bound(k,kb,8,MaxExact); bound(kb,kc,8,MaxExact)", "kb", "already known"),
        ("divide(k,k0,k1,4); bound(k1,kb,4,MaxExact)", "k1", "shorter"),
        ("pos(j,jpos,A); bound(jpos,jb,4,MaxExact)", "jpos", "nonzeros"),
        (
            "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,nz,8); bound(b,bb,4,MaxExact)",
            "b",
            "nonzeros",
        ),
        ("reorder(i,k,j); fuse(i,k,f); bound(f,fb,8,MaxExact)", "f", "one extent"),
    ],
)
def test_bound_refuses_loops_without_one_trip_count(schedule, culprit, why):
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile(SPMM, formats={"A": "csr"}, schedule=schedule)
    message = str(e.value)
    assert why in message
    assert names(without_echo(message, schedule), culprit), message


@pytest.mark.parametrize(
    "schedule,message",
    [
        ("reoder(i, j)", "did you mean 'reorder'"),
        ("reorder(i, jj)", "did you mean 'j'"),
        ("reorder(j, i)", "stores i above j"),
        ("reorder(i, i)", "repeated"),
        ("split(i, i0, i1)", "takes 4 arguments"),
        ("pos(i, ipos, A)", r"dense \(U\) level"),
    ],
)
def test_bad_schedules(schedule, message):
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=schedule)


def test_sparse_output_refuses_reduction_outside():
    with pytest.raises(ucf.ScheduleError, match="reduction variable j"):
        ucf.compile(
            "C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr", "C": "csr"}, schedule="reorder(j, k)"
        )


@pytest.mark.parametrize(
    "expr,formats,schedule,message",
    [
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "parallelize(j, CPUThread, NoRaces)",
            "reduction variable",
        ),
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "parallelize(i, CPUThred, NoRaces)",
            "did you mean 'CPUThread'",
        ),
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "parallelize(q, CPUThread, NoRaces)",
            "unknown index variable 'q'",
        ),
        ("y(i) = A(i) + B(i)", {"A": "C", "B": "C"}, PAR_I, "co-iterated by a while loop"),
        ("y(i) = A(i) + d(i)", {"A": "C"}, PAR_I, "carries"),
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "dcsr"}, PAR_I, "sparse output"),
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "parallelize(i, GPUBlock, NoRaces)",
            "GPU units need target 'cuda'",
        ),
    ],
)
def test_illegal_parallelize(expr, formats, schedule, message):
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile(expr, formats=formats, schedule=schedule)


@pytest.mark.parametrize(
    "schedule,message",
    [
        ("split(i, i0, i1, 4); fuse(i1, i0, f)", "must be the loop directly inside"),
        ("split(i, i0, i1, 0)", "positive integer"),
        ("split(i, j, i1, 4)", "already a loop variable"),
        ("split(q, i0, i1, 4)", "unknown index variable 'q'"),
        ("split(i, i0, i1, 4); parallelize(i, CPUThread, NoRaces)", "unknown index variable 'i'"),
    ],
)
def test_bad_splits(schedule, message):
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=schedule)


def test_parallel_coiteration_is_refused():
    """A co-iteration is split in coordinate space (tests/lower/test_coordinate_split.py), but
    the while loop itself cannot run in parallel."""
    with pytest.raises(ucf.ScheduleError, match="while loop"):
        ucf.compile(
            "y(i) = A(i) + B(i)",
            formats={"A": "C", "B": "C"},
            schedule="parallelize(i, CPUThread, NoRaces)",
        )
