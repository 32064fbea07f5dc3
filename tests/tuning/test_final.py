"""The end of a study (ucf.tuning.final): finalists timed again in turns with the default,
against a fake clock whose noise is seeded, so which one wins is known."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ucf.tuning import final, measure


class FakeMachine:
    """A clock, and kernels that advance it: each call takes its kernel's own time, plus,
    with probability ``p``, a time slice lost to another process (``lost`` seconds)."""

    def __init__(self, seed: int, p: float, lost: float = 4e-3):
        self.now = 0.0
        self.rng = np.random.default_rng(seed)
        self.p, self.lost = p, lost
        self.calls: list[int] = []

    def kernel(self, k: int, seconds: float, jitter: float = 0.02, p: float | None = None):
        def call():
            self.calls.append(k)
            self.now += seconds * (1 + jitter * self.rng.random())
            if self.rng.random() < (self.p if p is None else p):
                self.now += self.lost

        return call

    def clock(self) -> float:
        return self.now


def test_a_serial_plan_that_won_by_noise_does_not_replace_the_default():
    """A parallel default of 1.7 ms that loses a 4 ms time slice in most calls has a median
    above a 3 ms serial plan's, which runs on the other core undisturbed; the default's
    fastest sample shows what it really takes."""
    m = FakeMachine(seed=0, p=0.6)
    default = m.kernel(0, 1.7e-3)
    serial = m.kernel(1, 3.0e-3, p=0.0)
    timings = final.race([default, serial], now=m.clock)
    assert timings[0].median > timings[1].median  # by the medians alone, the serial plan
    assert timings[0].fastest < 1.8e-3 < 3.0e-3 <= timings[1].fastest
    assert final.winner(timings) == 0


def test_the_truly_fastest_finalist_wins_through_noise():
    for seed in range(5):
        m = FakeMachine(seed=seed, p=0.3)
        seconds = [1.7e-3, 1.6e-3, 1.2e-3, 3.0e-3]  # default first
        timings = final.race([m.kernel(k, s) for k, s in enumerate(seconds)], now=m.clock)
        assert final.winner(timings) == 2, seed


def test_the_default_stays_unless_beaten_by_the_margin():
    m = FakeMachine(seed=1, p=0.0)
    seconds = [1.7e-3, 1.7e-3 * (1 - final.MARGIN / 2), 1.7e-3 * 1.5]
    timings = final.race([m.kernel(k, s, jitter=0.001) for k, s in enumerate(seconds)], m.clock)
    assert final.winner(timings) == 0


def test_every_kernel_is_sampled_every_round_in_rotating_order():
    m = FakeMachine(seed=2, p=0.0)
    final.race([m.kernel(k, 3e-3) for k in range(3)], now=m.clock)  # one call a sample
    warm, rest = m.calls[:3], m.calls[3:]
    assert warm == [0, 1, 2] and len(rest) == 3 * final.ROUNDS
    for r in range(final.ROUNDS):
        assert rest[3 * r : 3 * r + 3] == [(r + k) % 3 for k in range(3)]


def test_slow_kernels_get_fewer_rounds():
    m = FakeMachine(seed=3, p=0.0)
    final.race([m.kernel(0, 0.05), m.kernel(1, 0.001)], now=m.clock)
    assert m.calls.count(0) == 1 + final.SLOW_ROUNDS


@dataclass
class FakeTrial:
    value: float
    schedule: str
    user_attrs: dict = field(default_factory=dict)

    def __post_init__(self):
        self.user_attrs = {"schedule": self.schedule}


def test_finalists_are_distinct_and_include_the_best_of_each_kind():
    par = "split(i, i0, i1, 256); parallelize(i0, CPUThread, NoRaces)"
    trials = [FakeTrial(1.0 + k, f"split(j, jo, ji, {2**k})") for k in range(6)]
    trials += [FakeTrial(1.5, "split(j, jo, ji, 2)"), FakeTrial(9.0, par)]
    chosen = final.finalists(trials, key=lambda t: t.user_attrs["schedule"])
    names = [t.user_attrs["schedule"] for t in chosen]
    assert names[: final.FINALISTS] == [f"split(j, jo, ji, {2**k})" for k in range(4)]
    assert names[final.FINALISTS :] == [par] and len(set(names)) == len(names)


def test_a_win_in_one_busy_race_is_not_enough():
    """The parallel default loses a time slice in every call of the first race (8 calls:
    a warm-up and ``ROUNDS`` samples), so a 3 ms serial plan wins it outright; the
    second race, on a quiet machine, shows the default's 1.7 ms, and the default stays."""
    m = FakeMachine(seed=4, p=0.0)
    quiet = m.kernel(0, 1.7e-3)
    calls = []

    def default():
        calls.append(1)
        quiet()
        if len(calls) <= 1 + final.ROUNDS:
            m.now += 4e-3

    serial = m.kernel(1, 3.0e-3)
    assert final.winner(final.race([default, serial], now=m.clock)) == 1
    calls.clear()
    outcome = final.confirmed([default, serial], now=m.clock)
    assert outcome.index == 0 and outcome.time == outcome.default < 1.8e-3
    m2 = FakeMachine(seed=5, p=0.2)
    outcome = final.confirmed([m2.kernel(0, 1.7e-3), m2.kernel(1, 1.2e-3)], now=m2.clock)
    assert outcome.index == 1 and outcome.time < 1.3e-3 < 1.7e-3 < outcome.default


def test_with_threads_no_serial_plan_is_a_finalist():
    par = "split(i, i0, i1, 256); parallelize(i0, CPUThread, NoRaces)"
    trials = [FakeTrial(1.0, "split(j, jo, ji, 16)"), FakeTrial(2.0, par)]
    key = lambda t: t.user_attrs["schedule"]  # noqa: E731
    assert [t.schedule for t in final.finalists(trials, key, threads=2)] == [par]
    assert len(final.finalists(trials, key, threads=1)) == 2
    serial = trials[:1]  # no parallel schedule ran: the serial one stays
    assert final.finalists(serial, key, threads=2) == serial


def test_a_disturbed_timing_takes_more_samples():
    """Samples that spread over NOISY (a busy moment took time slices in some) are
    followed by more, up to MORE times as many, and the median comes from all of them;
    quiet samples stop at the number asked for."""
    quiet = FakeMachine(seed=6, p=0.0)
    spread = measure.sampled(quiet.kernel(0, 0.9e-3, jitter=0.01), repeats=5, now=quiet.clock)
    assert spread.samples == 5 and spread.calls == 2 and spread.slowest < 0.92e-3
    busy = FakeMachine(seed=9, p=0.15, lost=10e-3)
    spread = measure.sampled(busy.kernel(0, 0.9e-3, jitter=0.01), repeats=5, now=busy.clock)
    assert spread.samples == 5 * measure.MORE and spread.slowest > measure.NOISY * spread.fastest
    assert spread.median < 0.92e-3 and str(spread).startswith("median 0.9")


def test_a_timing_stops_at_a_losing_sample():
    m = FakeMachine(seed=8, p=0.0)
    spread = measure.sampled(m.kernel(0, 1e-3), repeats=5, enough=0.5e-3, now=m.clock)
    assert spread.samples == 1 and m.calls == [0]
