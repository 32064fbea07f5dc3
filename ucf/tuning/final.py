"""The end of a study: its best schedules and the default, timed again in turns.

A trial is timed once, at one moment of the study, and a trial whose first
call loses is timed by that call alone (``ucf.tuning.measure``). On a shared
machine a time slice lost to another process can then decide the study: with
two threads in wall time, a parallel kernel waits for whichever thread lost
one, while a serial kernel keeps running, so a serial plan could beat the
default during the study and then run six times slower than it. So the few best
distinct schedules (``FINALISTS``, and the best serial and the best parallel one
if they are not among them) and the default are timed again in ``ROUNDS`` rounds,
each giving every one of them one sample, their order rotating from round to round.
A schedule replaces the default only if its median sample beats the default's by
``MARGIN`` and its fastest sample is not slower than the default's fastest:
another process's time slices only ever add time, so the fastest sample is
what noise cannot fake, and a plan that won only while the default was being
interrupted stays out. A race lasts a fraction of a second, and the machine can
be busy for all of it; so the winner then races the default alone once more,
and replaces it only if it wins that race too: one noisy measurement never
decides.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ucf.tuning import measure
from ucf.tuning.measure import SAMPLE_SECONDS, SLOW

#: Distinct schedules of a study timed again beside the default.
FINALISTS = 4
#: Rounds of the final timing: each takes one sample of every finalist and the default.
ROUNDS = 7
#: Rounds when one call of the slowest finalist takes over ``SLOW`` seconds.
SLOW_ROUNDS = 3
#: How far below the default's median a schedule's median must be to replace it.
MARGIN = 0.03


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one kernel over the rounds: the median and the fastest sample."""

    median: float
    fastest: float


def finalists(trials: Sequence[Any], key: Callable[[Any], Any], threads: int = 1) -> list[Any]:
    """The ``FINALISTS`` fastest of ``trials`` (Optuna trials with a value) with distinct
    ``key`` (schedule and formats), then the fastest serial and the fastest parallel one
    where those are not among them: a parallel trial's time can be one call that lost a
    time slice, so the kind that lost by noise still gets its turn.

    With more than one ``threads``, serial schedules are left out while any parallel one
    ran. ucf's parallel loops already run serially below a work threshold, so a serial
    plan beats them only on inputs big enough to share; it did so in studies on the
    shared 2-CPU machine while other processes held the second CPU (twice in 21 SpMM
    studies, winning both races by up to 2x), and then ran slower than the parallel
    default once that CPU was free. Such a plan is fast for the load of the moment,
    not for the threads the user asked for."""
    ranked, seen = [], set()
    for t in sorted(trials, key=lambda t: t.value):
        if key(t) not in seen:
            seen.add(key(t))
            ranked.append(t)
    if threads > 1 and any(_parallel(t) for t in ranked):
        ranked = [t for t in ranked if _parallel(t)]
    chosen = ranked[:FINALISTS]
    for parallel in (False, True):
        kind = [t for t in ranked if _parallel(t) == parallel]
        if kind and not any(_parallel(t) == parallel for t in chosen):
            chosen.append(kind[0])
    return chosen


def _parallel(trial: Any) -> bool:
    return "parallelize(" in trial.user_attrs.get("schedule", "")


def race(
    calls: Sequence[Callable[[], Any]], now: Callable[[], float] | None = None
) -> list[Timing]:
    """Time ``calls`` in turns: one warm-up call each, then ``ROUNDS`` rounds (``SLOW_ROUNDS``
    where a call takes over ``SLOW`` seconds) in which each gets one sample of enough calls
    to last about ``SAMPLE_SECONDS``, starting with a different call each round. ``now``
    is the clock (default: what trials are timed by)."""
    now = now or measure.clock()  # looked up at each call, so a test can replace it
    once = []
    for call in calls:
        start = now()
        call()
        once.append(max(now() - start, 1e-9))
    counts = [max(1, min(10_000, int(SAMPLE_SECONDS / s))) for s in once]
    rounds = SLOW_ROUNDS if max(once, default=0.0) > SLOW else ROUNDS
    samples: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        for k in range(len(calls)):
            at = (r + k) % len(calls)
            start = now()
            for _ in range(counts[at]):
                calls[at]()
            samples[at].append((now() - start) / counts[at])
    return [Timing(statistics.median(s), min(s)) for s in samples]


@dataclass(frozen=True)
class Outcome:
    """The kernel that won (0: the default) and the seconds per call of it and of the
    default, medians of the race that decided."""

    index: int
    time: float
    default: float


def confirmed(
    calls: Sequence[Callable[[], Any]], now: Callable[[], float] | None = None
) -> Outcome:
    """The ``winner`` of a ``race`` of ``calls`` (the default first), if it also wins a
    second race against the default alone; else the default."""
    timings = race(calls, now)
    best = winner(timings)
    if best:
        again = race([calls[0], calls[best]], now)
        if winner(again):
            return Outcome(best, again[1].median, again[0].median)
        timings = again
    return Outcome(0, timings[0].median, timings[0].median)


def winner(timings: Sequence[Timing], margin: float = MARGIN) -> int:
    """The index of the timing with the lowest median among those that beat
    ``timings[0]`` (the default) by ``margin`` in the median and are not slower in the
    fastest sample; 0 when none does."""
    default = timings[0]
    better = [
        k
        for k, t in enumerate(timings)
        if k and t.median <= default.median * (1 - margin) and t.fastest <= default.fastest
    ]
    return min(better, key=lambda k: timings[k].median, default=0)
