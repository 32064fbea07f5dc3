"""What a tuning run returns, and its picture."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ucf.errors import boundary


@dataclass
class Tuned:
    """The best schedule a study found, and how it compares with the default.

    ``schedule`` is schedule text (``""`` is a serial kernel), or None when the
    default stays: no trial beat it when both were timed again at the end, or
    every trial failed. ``reasons`` maps each schedule that failed to why (a
    run with successful trials lists its failures too). ``time`` and
    ``default_time`` are seconds per call (medians of the final rounds, the finalists
    and the default timed in turns, ``ucf.tuning.final``; CPU seconds with one thread),
    so their ratio is the speed-up on this machine. ``formats`` are the input
    formats the schedule is for: the given ones unless ``tune(search_formats=True)``
    chose others (a blocked ``bcsr`` or an ``ell``, say), whose conversion
    (seconds, once) is ``conversion_time``, never part of ``time``. ``operands``
    stores inputs in ``formats`` once, so that calls of ``kernel`` convert nothing;
    ``break_even`` is how many calls the conversion takes to pay for itself.
    """

    schedule: str | None
    time: float
    default_time: float
    study: Any  # optuna.Study
    kernel: Any  # ucf.Kernel compiled with ``schedule``
    reasons: dict[str, str] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)  # the inputs' formats it is for
    conversion_time: float = 0.0  # seconds to convert the given inputs into ``formats``

    @property
    def speedup(self) -> float:
        return self.default_time / self.time if self.time > 0 else 1.0

    @property
    def break_even(self) -> float:
        """Calls after which converting into ``formats`` has paid for itself: 0 when
        nothing is converted, infinite when the tuned kernel saves nothing."""
        if self.conversion_time <= 0:
            return 0.0
        saved = self.default_time - self.time
        return math.ceil(self.conversion_time / saved) if saved > 0 else math.inf

    @boundary
    def operands(self, **operands: Any) -> dict[str, Any]:
        """``operands`` with each input that ``formats`` names stored in its format (and in
        the kernel's dtypes), the others as given: convert once, then call ``kernel`` on
        them as often as needed."""
        from ucf.format.interop import as_tensor

        k = self.kernel
        return {
            n: as_tensor(v, self.formats[n], n, k.dtype, k.index_dtype) if n in self.formats else v
            for n, v in operands.items()
        }

    def __repr__(self) -> str:
        shown = "default" if self.schedule is None else repr(self.schedule)
        return (
            f"Tuned({shown}, {self.time * 1e6:.1f} us vs default {self.default_time * 1e6:.1f} us"
            f" ({self.speedup:.2f}x), {len(self.study.trials)} trials)"
        )

    @boundary
    def plot(self, path: str | Path) -> Path:
        """Write a PNG of the trial history (each trial's time, the best so far and
        the default's) and of the parameters' importance; the path written."""
        from ucf.tuning.deps import need

        need("matplotlib", "Tuned.plot")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 4), layout="constrained")
        FigureCanvasAgg(fig)
        history, importance = fig.subplots(1, 2)
        self._history(history)
        self._importance(importance)
        path = Path(path)
        fig.savefig(path, format="png")
        return path

    def _history(self, ax: Any) -> None:
        done = [(t.number, t.value) for t in self.study.trials if t.value is not None]
        if done:
            numbers, values = zip(*done, strict=True)
            best, low = [], float("inf")
            for v in values:
                low = min(low, v)
                best.append(low * 1e6)
            ax.scatter(numbers, [v * 1e6 for v in values], s=12, label="trial")
            ax.step(numbers, best, where="post", color="C1", label="best so far")
        ax.axhline(self.default_time * 1e6, color="C2", linestyle="--", label="default")
        ax.set_xlabel("trial")
        ax.set_yscale("log")
        ax.set_ylabel("time per call (us)")
        ax.set_title("trial history")
        ax.legend()

    def _importance(self, ax: Any) -> None:
        import optuna

        ax.set_title("parameter importance")
        try:
            with warnings.catch_warnings():  # "few trials in some regime": the plot says so
                warnings.simplefilter("ignore", UserWarning)
                scores = optuna.importance.get_param_importances(self.study)
        except (RuntimeError, ValueError) as e:  # too few finished trials to judge
            scores, why = {}, str(e)
        else:
            why = "every finished trial chose the same"
        if not scores:
            ax.text(0.5, 0.5, f"no importance: {why}", ha="center", va="center", wrap=True)
            ax.set_axis_off()
            return
        names = list(scores)[::-1]
        ax.barh(names, [scores[n] for n in names])
        ax.set_xlabel("importance (Optuna's default evaluator)")
