"""Candidates tried in turn: the default models propose schedules best first, and the
first one the checks accept is taken.

One helper does this for every default (CPU, GPU, dynamic operands, TeSA plans, the
kernels' per-call choice): a candidate the checks refuse is passed over with its
reason kept, and the reasons go to ``k.cin``, so a reader sees why the kernel did
not get what its model preferred.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from ucf.errors import ScheduleError, UnsupportedError

C = TypeVar("C")
R = TypeVar("R")

#: What refuses a candidate: its schedule breaks a rule, or asks for what is not built.
REFUSALS = (ScheduleError, UnsupportedError)


class Refused(list):
    """The reasons candidates were refused, in the order they were tried, each as
    ``default: <candidate> was refused: <reason>`` (``k.cin``'s note); ``errors`` holds
    the errors themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[Exception] = []

    def add(self, candidate: object, error: Exception) -> None:
        shown = str(candidate) or "the plain loop nest"
        self.append(f"default: {shown} was refused: {error}")
        self.errors.append(error)


def _refusal(candidate: object, error: Exception) -> bool:
    return isinstance(error, REFUSALS)


def first_passing(
    candidates: Iterable[C],
    attempt: Callable[[C], R],
    refused: Refused | None = None,
    last_raises: bool = False,
    shown: Callable[[C], object] = str,
    refuses: Callable[[C, Exception], bool] = _refusal,
) -> R | None:
    """``attempt`` of the first candidate it accepts, or None when it refuses every one
    (``last_raises``: the last one's error then propagates, for a last candidate that
    must work). An error ``refuses`` says is a refusal (by default a ScheduleError or
    an UnsupportedError) passes the candidate over, its reason going to ``refused``;
    any other propagates."""
    items = list(candidates)
    for k, candidate in enumerate(items):
        try:
            return attempt(candidate)
        except Exception as e:
            if not refuses(candidate, e) or (last_raises and k == len(items) - 1):
                raise
            if refused is not None:
                refused.add(shown(candidate), e)
    return None


def passing(
    candidates: Iterable[C],
    check: Callable[[C], object],
    refused: Refused | None = None,
    shown: Callable[[C], object] = str,
    refuses: Callable[[C, Exception], bool] = _refusal,
) -> list[C]:
    """The candidates ``check`` accepts, in order; an error ``refuses`` says is a
    refusal (as for ``first_passing``) passes the candidate over, its reason going to
    ``refused``; any other propagates."""
    kept = []
    for candidate in candidates:
        try:
            check(candidate)
        except Exception as e:
            if not refuses(candidate, e):
                raise
            if refused is not None:
                refused.add(shown(candidate), e)
            continue
        kept.append(candidate)
    return kept
