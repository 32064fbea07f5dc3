"""An exhaustive sweep of a tuning space (``tune(exhaustive=True)``): every distinct
schedule the space's questions can spell, found by walking their answers depth first.
It is the measure of a sampled study, which must come within a few per cent of the
sweep's best where the space is small enough to sweep."""

from __future__ import annotations

from typing import Any

from ucf.schedule.text import spelled
from ucf.tuning.search_problem import Problem
from ucf.tuning.space import suggest


def every_schedule(p: Problem, limit: int | None = None) -> dict[str, dict[str, Any]] | None:
    """Every distinct schedule text of ``p``'s space with parameters that spell it, in
    the order a depth-first walk of its choices meets them: what an exhaustive search
    tries (``tune(exhaustive=True)``). None when there are more than ``limit``."""
    found: dict[str, dict[str, Any]] = {}
    path: list[int] = []
    while True:
        walk = _Walk(path)
        found.setdefault(spelled(suggest(walk, p)), walk.params)
        if limit is not None and len(found) > limit:
            return None
        sizes = walk.sizes
        path = [*path[: len(sizes)], *[0] * (len(sizes) - len(path))]
        k = len(sizes) - 1
        while k >= 0 and path[k] + 1 >= sizes[k]:
            k -= 1
        if k < 0:
            return found
        path = [*path[:k], path[k] + 1]


class _Walk:
    """A trial that answers each question by the next index of ``path`` (0 past its end)
    and records how many answers each question had."""

    def __init__(self, path: list[int]):
        self.path, self.sizes = path, []
        self.params: dict[str, Any] = {}

    def _next(self, n: int) -> int:
        k = len(self.sizes)
        self.sizes.append(n)
        return self.path[k] if k < len(self.path) else 0

    def suggest_categorical(self, name: str, choices: list) -> Any:
        self.params[name] = choices[self._next(len(choices))]
        return self.params[name]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        self.params[name] = low + self._next(high - low + 1)
        return self.params[name]
