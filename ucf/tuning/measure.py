"""One trial: compile a schedule, check its result against the default kernel's, time it.

A schedule that ucf refuses, a kernel that raises or a result that differs
from the default's is a *pruned* trial with its reason kept on the trial
(``user_attrs["failure"]``), never an error of the tuning run. Times are the
median of a few samples after a warm-up (the checked call), each sample long
enough (about 2 ms of calls) that the clock's resolution does not matter (the
process's CPU time with one thread, else wall time: ``clock``), and
three samples where one call takes over 20 ms. A schedule that has lost
already is timed no further: one whose first call is three times slower than
the default's, or twice as slow as the best trial so far, is timed by that
call alone (by a second call where the first lost by less than a first call's
own cost, ``FIRST_CALL``), and sampling stops at the first sample that slow (a quadratic
plan must not cost the study minutes, and a big input's losing trials should
cost one call, not four); one whose first call in the probe's child took over ``LOST``
times that long is not called here at all.

A busy moment of a shared machine must not decide a time (issue 34): a timing whose
samples spread widely (the slowest over ``NOISY`` times the fastest: another process
took time slices during some) takes more samples, up to ``MORE`` times as many, so its
median stands on a longer stretch of time (``sampled``, which ``ucf run --time`` uses
too); and the default kernel, whose time decides which trials have lost, is timed
again after every ``REBASE`` trials that were timed (a trial pruned before its call
takes no time in which the load could change: SpGEMM's sweep prunes 97 of 112), in
turn with them, its baseline the median of those timings (``Objective.rebase``).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ucf.exec.kernel import Kernel
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.schedule.commands import Command, Parallelize
from ucf.schedule.text import as_commands, spelled
from ucf.tuning import probe, search_problem, space
from ucf.tuning.probe import clock, reason

#: Samples per timing, and the least time one sample spends calling the kernel.
REPEATS = 5
SAMPLE_SECONDS = 2e-3
#: Entries of a dense result compared at a time.
CLOSE_BLOCK = 1 << 15
#: Calls slower than SLOW seconds get FEW samples.
SLOW, FEW = 0.02, 3
#: A trial whose first call is this many times slower than the default is timed once...
HOPELESS = 3
#: ... and so is one this many times slower than the best trial so far.
LOSING = 2
#: Seconds a kernel's first call may spend beyond the others (its operands' statistics, the
#: plan for their size): a first call that has lost by less is not the judge, a second is.
FIRST_CALL = 5e-3
#: A trial whose first call in the probe's child (``ucf.tuning.probe``) took over LOST times
#: what a trial that has lost takes (``Objective.hopeless``) is pruned without a call here: a
#: slow plan's call costs as much again, and a fresh process's first call may spend a little
#: more than a warm one, never twice as much.
LOST = 2
#: Samples whose slowest is over NOISY times the fastest were disturbed: up to MORE times as
#: many are taken.
NOISY, MORE = 1.5, 3
#: Trials between two timings of the default kernel (``Objective.rebase``).
REBASE = 8


def one_call(call: Callable[[], Any]) -> float:
    """Seconds one call of ``call`` takes (never 0, so it can divide)."""
    now = clock()
    start = now()
    call()
    return max(now() - start, 1e-9)


@dataclass(frozen=True)
class Spread:
    """Seconds per call over the samples of a timing: their median, fastest and slowest,
    how many samples and how many calls each."""

    median: float
    fastest: float
    slowest: float
    samples: int
    calls: int

    def __str__(self) -> str:
        ms = [f"{t * 1e3:.4g}" for t in (self.median, self.fastest, self.slowest)]
        return (
            f"median {ms[0]} ms per call (samples {ms[1]} .. {ms[2]} ms; {self.samples} "
            f"samples of {self.calls} call{'s' if self.calls > 1 else ''}; load average "
            f"{os.getloadavg()[0]:.2f})"
        )


def median_time(
    call: Callable[[], Any], repeats: int = REPEATS, enough: float = math.inf, once: float = 0.0
) -> float:
    """Seconds per call of ``call``: the median of ``sampled``."""
    return sampled(call, repeats, enough, once).median


def sampled(
    call: Callable[[], Any],
    repeats: int = REPEATS,
    enough: float = math.inf,
    once: float = 0.0,
    now: Callable[[], float] | None = None,
) -> Spread:
    """``repeats`` samples of ``call`` after a warm-up call (``once``: the seconds of a
    call just made, which was the warm-up), each of enough calls to last about
    ``SAMPLE_SECONDS``; up to ``MORE`` times as many while they spread over ``NOISY``.
    A call slower than ``enough`` seconds is not repeated: it has lost already. Slow
    calls (over ``SLOW`` seconds each) get ``FEW`` samples, so a big input's trial stays
    short. ``now`` is the clock (default: ``clock()``)."""
    now = now or clock()
    if not once:
        start = now()
        call()
        once = max(now() - start, 1e-9)
    if once > enough:
        return Spread(once, once, once, 1, 1)
    number = max(1, min(10_000, int(SAMPLE_SECONDS / once)))
    wanted = min(repeats, FEW) if once > SLOW else repeats
    samples: list[float] = []
    while True:
        start = now()
        for _ in range(number):
            call()
        samples.append((now() - start) / number)
        if samples[-1] > enough or len(samples) >= wanted * MORE:
            break
        if len(samples) >= wanted and max(samples) <= NOISY * min(samples):
            break
    return Spread(statistics.median(samples), min(samples), max(samples), len(samples), number)


def comparable(t: Tensor) -> Any:
    """A result in a form ``agrees`` compares: scipy for sparse matrices, else numpy."""
    if t.order == 2 and not t.format.is_dense:
        return t.to_scipy().tocsr()
    return t.to_numpy()


def agrees(result: Any, reference: Any, dtype: np.dtype) -> bool:
    """Whether two ``comparable`` results hold the same values (up to summation order)."""
    rtol = 1e-4 if np.dtype(dtype) == np.float32 else 1e-7
    if hasattr(reference, "tocsr"):
        if result.shape != reference.shape:
            return False
        diff = abs(result - reference)
        scale = abs(reference).max() if reference.nnz else 0.0
        return diff.nnz == 0 or diff.max() <= rtol * scale + 1e-12
    if result.shape != reference.shape:
        return False
    # In blocks that stay in cache: np.allclose makes a few full-size temporaries, which
    # cost a 200k x 32 result a quarter of a second per trial.
    a, b = np.ravel(result), np.ravel(reference)
    return all(
        np.allclose(a[s : s + CLOSE_BLOCK], b[s : s + CLOSE_BLOCK], rtol=rtol)
        for s in range(0, a.size, CLOSE_BLOCK)
    )


def spelled_formats(formats: dict[str, Format]) -> dict[str, str]:
    """Formats as text, for what keeps them as text: Optuna's trial attributes and the
    result a study returns."""
    return {n: str(f) for n, f in formats.items()}


@dataclass
class Variant:
    """The operands stored in one choice of input formats, and that choice's space."""

    formats: dict[str, Format]
    problem: search_problem.Problem
    operands: dict[str, Tensor]
    conversion: float  # seconds to convert the given operands into these formats


@dataclass
class Objective:
    """The function a study minimizes: picklable, so process and Dask workers run it.

    ``choices`` maps the input operands whose format is searched to their candidate
    formats (empty: the formats stay as given). Optuna hands a trial's choice over as
    text: the format's spelling, a key into the candidates (``chosen``), never parsed."""

    statement: str
    formats: dict[str, Format]
    target: str
    dtype: str
    index_dtype: str
    operands: dict[str, Tensor]
    shapes: dict[str, Any] | None
    extents: dict[str, int]
    choices: dict[str, tuple[Format, ...]]
    reference: Any = None
    baseline: float = 0.0  # seconds per call of the default schedule
    default_schedule: list[Command] | None = None  # the default's, for these operands
    repeats: int = REPEATS
    _variants: dict[str, Variant] = field(default_factory=dict, repr=False)
    _seen: dict[tuple[str, str], tuple[float | None, str]] = field(default_factory=dict, repr=False)
    _unfit: dict[str, str] = field(default_factory=dict, repr=False)  # scope -> why not
    _probe: probe.Probe = field(default_factory=probe.Probe, repr=False)
    _baselines: list[float] = field(default_factory=list, repr=False)
    _stopped: dict[tuple[str, tuple], str] = field(default_factory=dict, repr=False)
    _timed: int = field(default=0, repr=False)  # trials timed since the default last was

    def rebase(self) -> float:
        """Time the default kernel (again): the baseline that trials lose against is the
        median of its timings so far, taken in turn with the trials, so one busy moment
        at the start of a study does not set every trial's bar. The default's result."""
        k = self.kernel(None)
        call = lambda: k(shapes=self.shapes, **self.operands)  # noqa: E731
        now = clock()
        start = now()
        result = call()
        once = max(now() - start, 1e-9)  # the warm-up of the samples
        self.default_schedule = as_commands(k.schedule_used)
        self._baselines.append(median_time(call, self.repeats, once=once))
        self.baseline = statistics.median(self._baselines)
        return result

    def kernel(
        self, schedule: str | list[Command] | None, formats: dict[str, Format] | None = None
    ) -> Any:
        return Kernel(
            self.statement,
            formats=self.formats if formats is None else formats,
            schedule=schedule,
            target=self.target,
            dtype=self.dtype,
            index_dtype=self.index_dtype,
        )

    def scope(self, formats: dict[str, Format]) -> str:
        """What the names of a format choice's parameters end in ("" without a search):
        each choice has a space of its own."""
        if not self.choices:
            return ""
        return "[" + ",".join(f"{t}={formats[t]}" for t in sorted(self.choices)) + "]"

    def chosen(self, spelled: dict[str, str]) -> dict[str, Format]:
        """The formats whose spellings a trial's parameters or attributes hold: each
        searched operand's candidate of that spelling, the others as given."""
        formats = dict(self.formats)
        for name, options in self.choices.items():
            formats[name] = next(o for o in options if str(o) == spelled[name])
        return formats

    def variant(self, formats: dict[str, Format]) -> Variant:
        """The operands in ``formats`` (converted once, and the conversion timed); what
        the conversion raises if they do not fit."""
        scope = self.scope(formats)
        if scope not in self._variants:
            # Timed once, by the clock trials are timed by: a conversion is reported
            # beside the kernel's time, and repeating one of a 200k-row matrix into a
            # few formats would cost the study seconds.
            changed = [n for n in self.operands if formats[n] != self.formats[n]]
            operands = dict(self.operands)
            now = clock()
            start = now()
            operands.update({n: self.operands[n].convert(formats[n]) for n in changed})
            seconds = now() - start if changed else 0.0
            problem = search_problem.problem(self.statement, formats, self.extents)
            self._variants[scope] = Variant(dict(formats), problem, operands, seconds)
        return self._variants[scope]

    def measure(
        self, schedule: str | list[Command] | None, v: Variant, enough: float = math.inf
    ) -> float:
        """Seconds per call of ``schedule``'s kernel on ``v``; a UcfError (or anything the
        kernel raises) if it cannot be built or computes something else than the default.
        A stored schedule comes as text, parsed here; a trial's as commands."""
        from ucf.errors import UcfError
        from ucf.toolchain.jit import num_threads

        commands = as_commands(schedule)
        # The loop nest: what a schedule iterates over. Splits and bounds reshape its
        # loops (a split of a co-iterated loop can add work, never take most of it
        # away), so they do not bring a nest whose first call ran past the limit
        # (``probe.LIMIT`` times the default's) back into the race; each such schedule
        # would cost a stopped child and a new one. Threads can take most of the work
        # away where there are more of them than the limit's factor: there, whether a
        # schedule runs in parallel is part of its nest.
        threaded = num_threads() >= probe.LIMIT and any(
            isinstance(c, Parallelize) for c in commands
        )
        nest = (
            self.scope(v.formats),
            tuple(probe.normalized(commands, probe.RESHAPING)),
            threaded,
        )
        if nest in self._stopped:
            raise UcfError(
                f"its loop order and workspaces are those of {self._stopped[nest]!r}, "
                f"whose first call ran past the limit; splits, bounds and threads "
                f"do not make a nest that slow win"
            )
        k = self.kernel(commands, v.formats)
        seconds = probe.limit(self.baseline)
        default = self.default_schedule if v.formats == self.formats else None
        if self.baseline > 0 and probe.needed(commands, self.extents, seconds, default):
            request = probe.Call(
                self.statement,
                v.formats,
                spelled(commands),
                self.target,
                self.dtype,
                self.index_dtype,
                self.shapes,
                self.scope(v.formats),
                num_threads(),
            )
            try:
                first = self._probe.first_call(request, v.operands, seconds)
            except probe.TrialTimeout:
                self._stopped[nest] = spelled(commands)
                raise
            if first > LOST * enough + FIRST_CALL:  # its call here would only confirm it
                raise UcfError(
                    f"its first call took {first * 1e3:.4g} ms, over {LOST} times the "
                    f"{enough * 1e3:.4g} ms past which a trial has lost"
                )
        now = clock()
        start = now()
        result = k(shapes=self.shapes, **v.operands)
        once = now() - start
        if not agrees(comparable(result), self.reference, np.dtype(self.dtype)):
            raise UcfError("its result differs from the default schedule's")
        call = lambda: k(shapes=self.shapes, **v.operands)  # noqa: E731
        if enough < once < enough + FIRST_CALL:  # maybe only the first call's own cost
            once = one_call(call)
        return median_time(call, self.repeats, enough, once)

    def close(self) -> None:
        """Stop the child process that runs first calls (``ucf.tuning.probe``)."""
        self._probe.close()

    def hopeless(self) -> float:
        """Seconds per call past which a trial has lost: ``HOPELESS`` times the default's,
        or ``LOSING`` times the best this process has timed."""
        best = min((t for t, _ in self._seen.values() if t is not None), default=math.inf)
        return min(HOPELESS * self.baseline, LOSING * best)

    def __call__(self, trial: Any) -> float:
        import optuna

        formats = self.chosen(
            {
                name: trial.suggest_categorical(f"format_{name}", [str(o) for o in options])
                for name, options in self.choices.items()
            }
        )
        scope = self.scope(formats)
        if scope not in self._unfit:
            try:
                v = self.variant(formats)
            except Exception as e:  # the operands do not fit the formats (ell too narrow)
                self._unfit[scope] = f"the operands cannot be stored so: {reason(e)}"
        if scope in self._unfit:
            trial.set_user_attr("formats", spelled_formats(formats))
            trial.set_user_attr("failure", self._unfit[scope])
            raise optuna.TrialPruned(self._unfit[scope])
        commands = space.suggest(trial, v.problem, scope)
        text = spelled(commands)
        seen = (scope, text)
        if seen not in self._seen:
            if self._timed >= REBASE:
                self.rebase()
                self._timed = 0
            try:
                self._seen[seen] = (self.measure(commands, v, self.hopeless()), "")
                self._timed += 1
            except Exception as e:
                self._seen[seen] = (None, reason(e))
        seconds, why = self._seen[seen]
        trial.set_user_attr("schedule", text)
        if self.choices:
            trial.set_user_attr("formats", spelled_formats(v.formats))
            trial.set_user_attr("conversion", v.conversion)
        if seconds is None:
            trial.set_user_attr("failure", why)
            raise optuna.TrialPruned(why)
        return seconds
