"""Schedule text and the fluent ``ucf.Schedule``: every command parses, both spellings
build the same commands, and mistakes get a caret or a suggestion.
"""

from __future__ import annotations

import re

import pytest

import ucf
from tests.schedule.cases import SPMV
from ucf.schedule import parse_schedule


@pytest.mark.parametrize(
    "schedule,suggestion",
    [
        ("splitt(i,i0,i1,4)", "did you mean 'split'"),
        ("parallelize(ii,CPUThread,NoRaces)", "did you mean 'i'"),
    ],
)
def test_misspellings_get_suggestions(schedule, suggestion):
    with pytest.raises(ucf.ScheduleError, match=re.escape(suggestion)):
        ucf.compile(SPMV, formats={"A": "csr"}, schedule=schedule)


def test_gpu_group_command_parses():
    text = "pos(j,jpos,A); split(jpos,jpos0,jpos1,8); parallelize(jpos1, GPUGroup, 8, Segment)"
    cmds = parse_schedule(text)
    assert [c.name for c in cmds] == ["pos", "split", "parallelize"]
    assert cmds[-1].args == ("jpos1", "GPUGroup", "8", "Segment")
    fluent = ucf.Schedule().parallelize("jpos1", "GPUGroup", 8, "Segment")
    assert [c.args for c in parse_schedule(str(fluent))] == [cmds[-1].args]


def test_every_command_parses():
    text = """reorder(i, j, k); split(i, i0, i1, 16)
    divide(j, j0, j1, 4); fuse(i, j, f); pos(f, fpos, A); bound(i, ib, 17, MaxExact)
    unroll(i1, 4); precompute(B(i,k,l) * C(k,j), j, jw, w)
    parallelize(i0, CPUThread, NoRaces); parallelize(jpos1, GPUGroup, 8, Segment)"""
    cmds = parse_schedule(text)
    assert [c.name for c in cmds] == [
        "reorder",
        "split",
        "divide",
        "fuse",
        "pos",
        "bound",
        "unroll",
        "precompute",
        "parallelize",
        "parallelize",
    ]
    assert cmds[7].args[0] == "B(i,k,l) * C(k,j)"
    assert cmds[-1].args == ("jpos1", "GPUGroup", "8", "Segment")


def test_fluent_chain_prints_the_same_commands():
    s = ucf.Schedule().split("i", "i0", "i1", 16).reorder("i0", "i1", "j")
    s = s.parallelize("i0", "CPUThread", "NoRaces")
    assert str(s) == "split(i, i0, i1, 16); reorder(i0, i1, j); parallelize(i0, CPUThread, NoRaces)"
    assert [str(c) for c in parse_schedule(str(s))] == [str(c) for c in s.commands]


def test_schedule_syntax_error_has_caret():
    with pytest.raises(ucf.ParseError) as e:
        ucf.compile("y(i) = A(i,j) * x(j)", schedule="reorder(i,, j)")
    assert "^" in str(e.value) and e.value.column == 11


@pytest.mark.parametrize("count", ["²", "٣", "-1", "1.5"])
def test_the_fluent_schedule_refuses_counts_that_are_not_ascii_digits(count):
    """str.isdigit takes '²' (int() then raised, an InternalError) and other scripts'
    digits ('٣' was read as 3): a count is ASCII digits only."""
    with pytest.raises(ucf.ScheduleError, match="positive integer"):
        ucf.compile(
            "C(i,n) = A(i,k) * B(k,n)",
            dynamic={"A": (32, 1)},
            schedule=ucf.Schedule().condense("k", "A", count),
        )
    with pytest.raises((ucf.ScheduleError, ucf.ParseError)):
        ucf.compile("y(i) = A(i,j) * x(j)", schedule=ucf.Schedule().split("i", "i0", "i1", count))
