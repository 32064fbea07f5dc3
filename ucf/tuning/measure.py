"""One trial: compile a schedule, check its result against the default kernel's, time it.

A schedule that ucf refuses, a kernel that raises or a result that differs
from the default's is a *pruned* trial with its reason kept on the trial
(``user_attrs["failure"]``), never an error of the tuning run. Times are the
median of a few samples after a warm-up, each sample long enough (about
2 ms of calls) that the clock's resolution does not matter; a schedule whose
first call is ten times slower than the default's is timed by that call alone
(a quadratic plan must not cost the study minutes).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ucf.format.tensor import Tensor
from ucf.tuning import space

#: Samples per timing, and the least time one sample spends calling the kernel.
REPEATS = 5
SAMPLE_SECONDS = 2e-3
#: A trial whose first call is this many times slower than the default is timed once.
HOPELESS = 10


def median_time(call: Callable[[], Any], repeats: int = REPEATS, enough: float = math.inf) -> float:
    """Seconds per call of ``call``: the median of ``repeats`` samples after a warm-up.
    A call slower than ``enough`` seconds is not repeated: it has lost already."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-9)
    if once > enough:
        return once
    number = max(1, min(10_000, int(SAMPLE_SECONDS / once)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            call()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


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
    return result.shape == reference.shape and np.allclose(result, reference, rtol=rtol)


@dataclass
class Objective:
    """The function a study minimizes: picklable, so process and Dask workers run it."""

    statement: str
    formats: dict[str, str]
    target: str
    dtype: str
    index_dtype: str
    problem: space.Problem | None  # set once the default kernel has checked the operands
    operands: dict[str, Tensor]
    shapes: dict[str, Any] | None
    reference: Any
    baseline: float  # seconds per call of the default schedule
    repeats: int = REPEATS
    _seen: dict[str, tuple[float | None, str]] = field(default_factory=dict, repr=False)

    def kernel(self, schedule: str | None) -> Any:
        import ucf  # through the package, so a test can replace ucf.compile

        return ucf.compile(
            self.statement,
            formats=self.formats,
            schedule=schedule,
            target=self.target,
            dtype=self.dtype,
            index_dtype=self.index_dtype,
        )

    def measure(self, schedule: str | None) -> float:
        """Seconds per call of ``schedule``'s kernel; a UcfError (or anything the kernel
        raises) if it cannot be built or computes something else than the default."""
        from ucf.errors import UcfError

        k = self.kernel(schedule)
        result = k(shapes=self.shapes, **self.operands)
        if not agrees(comparable(result), self.reference, np.dtype(self.dtype)):
            raise UcfError("its result differs from the default schedule's")
        call = lambda: k(shapes=self.shapes, **self.operands)  # noqa: E731
        return median_time(call, self.repeats, HOPELESS * self.baseline)

    def __call__(self, trial: Any) -> float:
        import optuna

        text = space.suggest(trial, self.problem)
        if text not in self._seen:
            try:
                self._seen[text] = (self.measure(text), "")
            except Exception as e:
                self._seen[text] = (None, _reason(e))
        seconds, reason = self._seen[text]
        trial.set_user_attr("schedule", text)
        if seconds is None:
            trial.set_user_attr("failure", reason)
            raise optuna.TrialPruned(reason)
        return seconds


def _reason(e: Exception) -> str:
    from ucf.errors import UcfError

    return str(e) if isinstance(e, UcfError) else f"{type(e).__name__}: {e}"
