"""Nothing but a ``UcfError`` leaves the public API: a bug inside ucf surfaces as
``ucf.InternalError`` carrying what a bug report needs, with the cause chained."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from ucf import pipeline
from ucf.exec.kernel import Kernel, forget_loaded
from ucf.format import construction

A = sp.random(12, 9, density=0.3, format="csr", random_state=0)
X = np.arange(9.0)


def boom(*args, **kwargs):
    raise KeyError("w")


def test_a_bug_while_compiling_names_the_call(monkeypatch):
    monkeypatch.setattr(pipeline, "plan", boom)
    with pytest.raises(ucf.InternalError) as e:
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule="split(i,i0,i1,4)")
    text = str(e.value)
    for part in [
        f"ucf {ucf.__version__}",
        "KeyError",
        "expr='y(i) = A(i,j) * x(j)'",
        "formats={'A': 'csr'}",
        "schedule='split(i,i0,i1,4)'",
        "target='llvm'",
        "please file it",
    ]:
        assert part in text
    assert isinstance(e.value.__cause__, KeyError)


def test_a_bug_while_calling_names_the_statement(monkeypatch):
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    monkeypatch.setattr(Kernel, "_invoke", boom)
    with pytest.raises(ucf.InternalError, match=r"Kernel.__call__.*formats=\{'A': 'csr'\}"):
        k(A=A, x=X)


def test_a_bug_in_packing_is_internal(monkeypatch):
    monkeypatch.setattr(construction, "pack", boom)
    with pytest.raises(ucf.InternalError, match="from_numpy.*format='csr'"):
        ucf.from_numpy(np.eye(3), format="csr")


@pytest.mark.parametrize("error", [MemoryError(), UserWarning("as error"), ucf.ShapeError("x")])
def test_resources_warnings_and_ucf_errors_pass_unchanged(monkeypatch, tmp_path, error):
    def raise_it(*args, **kwargs):
        raise error

    # an empty cache: a kernel another test of this worker compiled would not plan again
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    forget_loaded()
    monkeypatch.setattr(pipeline, "plan", raise_it)
    with pytest.raises(type(error)) as e:
        ucf.compile("y(i) = B(i,j) * x(j)")
    assert e.value is error


VARS = ["i", "j", "k", "i0", "i1", "j0", "f", "fp", "q", "qi", "x", "A"]
NUMS = ["0", "1", "4", "-2", "32", "a"]
UNITS = ["CPUThread", "CPUVector", "GPUThread", "Bogus"]
RACES = ["NoRaces", "Atomics", "IgnoreRaces", "Temporary", "Segment", "x"]


@st.composite
def schedules(draw):
    commands = []
    for _ in range(draw(st.integers(0, 4))):
        v, w, u = (draw(st.sampled_from(VARS)) for _ in range(3))
        n = draw(st.sampled_from(NUMS))
        commands.append(
            draw(
                st.sampled_from(
                    [
                        f"split({v},{w},{u},{n})",
                        f"divide({v},{w},{u},{n})",
                        f"reorder({v},{w})",
                        f"reorder({v},{w},{u})",
                        f"fuse({v},{w},{u})",
                        f"pos({v},{w},{draw(st.sampled_from(['A', 'B', 'x', 'Z']))})",
                        f"bound({v},{w},{n},MaxExact)",
                        f"unroll({v},{n})",
                        f"parallelize({v},{draw(st.sampled_from(UNITS))},"
                        f"{draw(st.sampled_from(RACES))})",
                        f"precompute(A(i,j)*x(j),{v},{w},ws)",
                        f"assemble(S,{draw(st.sampled_from(['Insert', 'Append']))})",
                        f"split({v},{w}",
                        f"nonsense({v})",
                    ]
                )
            )
        )
    return "; ".join(commands)


KERNELS = [
    ("y(i) = A(i,j) * x(j)", {"A": "csr"}, lambda: {"A": A, "x": X}, lambda: A @ X),
    (
        "S(i,j) = A(i,j) + B(i,j)",
        {"A": "csr", "B": "csr", "S": "csr"},
        lambda: {"A": A, "B": A.T.T * 2},
        lambda: (A * 3).toarray(),
    ),
]


@settings(max_examples=150)
@given(which=st.sampled_from(range(len(KERNELS))), schedule=schedules())
def test_random_schedules_raise_only_ucf_errors(which, schedule):
    expr, formats, operands, want = KERNELS[which]
    try:
        k = ucf.compile(expr, formats=formats, schedule=schedule or None)
    except ucf.UcfError as e:
        assert not isinstance(e, ucf.InternalError), str(e)
        return
    got = k(**operands()).to_numpy()
    if "IgnoreRaces" not in schedule:  # racing threads may lose updates, as asked
        np.testing.assert_allclose(got, want(), rtol=1e-12, err_msg=schedule)
    COMPILED.append(schedule)


COMPILED: list[str] = []


def test_the_random_schedules_reach_the_compiler():
    """Runs after the fuzz test (file order): some drawn schedules were accepted, so
    the fuzz test exercised kernels and not only the schedule parser."""
    if not COMPILED:
        pytest.skip("the fuzz test did not run in this session")
    assert len(COMPILED) >= 10, COMPILED


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: ucf.compile("y(i) = A(i,j) * x(j)", shapez={"y": (3,)}),
            r"ucf.compile: .*'shapez'",
        ),
        (lambda: ucf.from_numpy(), r"ucf.from_numpy: missing"),
        (lambda: ucf.einsum(), r"ucf.einsum: missing"),
    ],
)
def test_a_call_its_signature_does_not_take_is_an_argument_error(call, match):
    """Not an InternalError (no bug in ucf): a UcfError that is also Python's TypeError."""
    with pytest.raises(ucf.ArgumentError, match=match) as e:
        call()
    assert isinstance(e.value, TypeError)


def test_a_type_error_from_inside_ucf_is_still_internal(monkeypatch):
    def wrong(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(pipeline, "plan", wrong)
    with pytest.raises(ucf.InternalError, match="TypeError: a bug"):
        ucf.compile("y(i) = A(i,j) * x(j) * 3", formats={"A": "csr"})
