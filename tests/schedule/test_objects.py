"""Schedules as objects (issue 33): typed commands that print as they parse, check
without changing the nest, apply by returning it; the default models build them;
one helper tries candidates and keeps every refusal for ``k.cin``."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS
from ucf.errors import ScheduleError, UnsupportedError
from ucf.format.format import parse_format
from ucf.schedule import NestState, parse_schedule
from ucf.schedule.candidates import Refused, first_passing, passing
from ucf.schedule.commands import (
    BoundCommand,
    Command,
    Parallelize,
    Reorder,
    SplitCommand,
    Unroll,
    command,
)
from ucf.schedule.cpu_model import propose
from ucf.schedule.gpu_model import propose_gpu
from ucf.schedule.records import Parallel

TEXTS = [
    "reorder(j, i)",
    "split(i, i0, i1, 32)",
    "divide(i, i0, i1, 4)",
    "fuse(i, j, f)",
    "pos(j, jpos, A)",
    "bound(j, jb, 8, MaxExact)",
    "unroll(jb, 4)",
    "precompute(A(i,j)*B(j,k), k, k, w)",
    "precompute(A(i,j)*B(j,k), k, kw)",
    "parallelize(i, CPUThread, NoRaces)",
    "parallelize(jpos1, GPUGroup, 8, Segment)",
    "assemble(C, Insert)",
    "assemble(C, Append, true)",
    "condense(k, A, 16)",
    "dismantle(k)",
    "dismantle(k, values)",
]


@pytest.mark.parametrize("text", TEXTS)
def test_a_command_prints_as_it_parses(text):
    (cmd,) = parse_schedule(text)
    assert str(cmd) == text
    assert parse_schedule(str(cmd)) == [cmd]
    assert isinstance(cmd, Command) and cmd.name == text.split("(")[0]


def test_arguments_are_typed_once():
    split, bound, unroll, par = parse_schedule(
        "split(i, i0, i1, 32); bound(i1, ib, 32, MaxExact); unroll(ib, 4); "
        "parallelize(i0, CPUThread, Atomics)"
    )
    assert split == SplitCommand("i", "i0", "i1", 32) and split.amount == 32
    assert bound == BoundCommand("i1", "ib", 32) and unroll == Unroll("ib", 4)
    assert par == Parallelize("i0", Parallel("CPUThread", "Atomics"))
    with pytest.raises(ScheduleError, match=r"split\(i, i0, i1, x\): the factor must be"):
        command("split", ("i", "i0", "i1", "x"))


def _nest() -> NestState:
    return NestState(["i", "j"], {}, "y")


def test_check_says_why_and_leaves_the_nest_alone_apply_returns_it():
    nest = _nest()
    bad = SplitCommand("k", "k0", "k1", 4)
    assert "unknown index variable 'k'" in bad.check(nest)
    assert nest.loops == ["i", "j"] and nest.steps == []
    with pytest.raises(ScheduleError, match="unknown index variable 'k'"):
        bad.apply(nest)
    good = SplitCommand("j", "j0", "j1", 4)
    assert good.check(nest) is None and nest.loops == ["i", "j"]
    nest = good.apply(nest)
    assert nest.loops == ["i", "j0", "j1"] and nest.steps == [good]
    assert Reorder(("j0", "i")).apply(nest).loops == ["j0", "i", "j1"]
    assert "already a loop variable" in SplitCommand("i", "j0", "x", 2).check(nest)


def test_the_default_models_build_commands():
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    assert k.commands is None and k.schedule is None  # the model chooses per call
    from ucf.pipeline import _Front

    base = _Front("y(i) = A(i,j) * x(j)", {"A": parse_format("csr")}).concretized()
    choices = propose(base, list(base.order), None, threads=2)
    assert all(isinstance(c, Command) for choice in choices for c in choice.commands)
    assert choices[0].text == "parallelize(i, CPUThread, NoRaces)"
    gpu = propose_gpu(base)
    assert gpu and all(isinstance(c, Command) for cmds, _, _ in gpu for c in cmds)


def test_first_passing_keeps_every_refusal_and_propagates_other_errors():
    def attempt(n: int) -> int:
        if n < 3:
            raise ScheduleError(f"too small: {n}") if n % 2 else UnsupportedError(f"odd: {n}")
        return n * 10

    refused = Refused()
    assert first_passing([0, 1, 2, 3, 4], attempt, refused) == 30
    assert refused == [
        f"default: {n} was refused: {why}"
        for n, why in [(0, "odd: 0"), (1, "too small: 1"), (2, "odd: 2")]
    ]
    assert first_passing([1, 2], attempt) is None
    with pytest.raises(ScheduleError, match="too small: 1"):
        first_passing([2, 1], attempt, last_raises=True)
    with pytest.raises(ZeroDivisionError):
        first_passing([1, 0], lambda n: 1 // n if n == 0 else attempt(n))
    assert passing([0, 3, 4, 1], attempt) == [3, 4]


@pytest.mark.parametrize("target", TARGETS)
def test_a_refused_default_says_why_in_cin(target):
    """CSC SpMV: the model's parallel loop over rows is refused (rows are not A's outer
    level); the kernel says so and still computes scipy's product."""
    rng = np.random.default_rng(3)
    m = sp.random(40, 30, density=0.2, format="csc", random_state=3)
    x = rng.random(30)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csc"}, target=target)
    np.testing.assert_allclose(k(A=m, x=x).to_numpy(), m @ x, rtol=1e-13)
    assert "# default: reorder(i, j); parallelize(i, CPUThread, NoRaces) was refused:" in k.cin
    assert "stores j above i" in k.cin
