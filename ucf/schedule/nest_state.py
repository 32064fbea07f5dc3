"""What every scheduling command shares: the loop nest the commands check and change
(``NestState``), the ``Command`` base class (typed arguments converted once from
text, ``check(nest) -> reason | None``, ``apply(nest) -> nest``), and its checks.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ucf.errors import ScheduleError
from ucf.lang.ast import Statement
from ucf.schedule.provenance import Provenance
from ucf.schedule.records import Bound, Dismantle, Parallel, Precompute

if TYPE_CHECKING:
    from ucf.format.format import Format

UNITS = ("CPUThread", "CPUVector", "GPUBlock", "GPUWarp", "GPUThread", "GPUGroup")

STRATEGIES = ("NoRaces", "IgnoreRaces", "Atomics", "Temporary", "ParallelReduction", "Segment")

BOUND_KINDS = ("MaxExact",)

ASSEMBLE_STRATEGIES = ("Insert", "Append")


def closest(name: str, choices) -> str:
    match = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


@dataclass
class NestState:
    """The loop nest as the commands so far have left it, and what they recorded."""

    order: list[str]  # the original variables, in the unscheduled order
    tensors: dict[str, tuple[list[str], Format]]  # operand -> variables by level, format
    output: str
    loops: list[str] = field(default_factory=list)
    prov: Provenance | None = None
    steps: list[Command] = field(default_factory=list)
    parallel: dict[str, Parallel] = field(default_factory=dict)
    pos: dict[str, tuple[str, str]] = field(default_factory=dict)
    fused: list[tuple[tuple[str, ...], str, str]] = field(default_factory=list)
    precompute: list[Precompute] = field(default_factory=list)
    bounds: dict[str, Bound] = field(default_factory=dict)
    static: frozenset[str] = frozenset()  # operands whose pattern is known when compiling
    dismantle: Dismantle | None = None

    def __post_init__(self) -> None:
        self.loops = list(self.order)
        self.prov = Provenance(self.order)


def spelled(name: str, args: tuple[str, ...]) -> str:
    return f"{name}({', '.join(args)})"


def positive(text: str, what: str, shown: str) -> int:
    # ASCII digits only: str.isdigit also takes '²' (which int() refuses) and other
    # scripts' digits, which the fluent Schedule API would let through.
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ScheduleError(f"{shown}: {what} must be a positive integer, got '{text}'")
    return int(text)


@dataclass(frozen=True)
class Command:
    """One scheduling command; subclasses hold its arguments, typed."""

    #: The command's name in the schedule language.
    name: ClassVar[str] = ""
    #: The accepted argument counts of the text form (None: any number), and how to
    #: spell them.
    arity: ClassVar[tuple[int, ...] | None] = None
    forms: ClassVar[str] = ""

    @classmethod
    def parse(cls, name: str, args: tuple[str, ...]) -> Command:
        """The command ``name(args)`` from its text arguments, converted once (a
        ScheduleError names what is wrong with them)."""
        if cls.arity is not None and len(args) not in cls.arity:
            forms = cls.forms or f"{' or '.join(map(str, cls.arity))} arguments"
            raise ScheduleError(f"{name} takes {forms}, got {len(args)}: {spelled(name, args)}")
        return cls.converted(name, args)

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        return cls(*args)

    @property
    def args(self) -> tuple[str, ...]:
        """The arguments as the schedule language spells them."""
        raise NotImplementedError

    @property
    def variables(self) -> tuple[str, ...]:
        """The index variables the command names, old and new."""
        return ()

    def __str__(self) -> str:
        return spelled(self.name, self.args)

    def check(self, nest: NestState) -> str | None:
        """Why the command cannot apply to ``nest`` as it stands, or None if it can."""
        return None

    def check_statement(self, stmt: Statement) -> str | None:
        """Why the command cannot apply to the statement as the user wrote it, or None
        (checked before any loop exists)."""
        return None

    def apply(self, nest: NestState) -> NestState:
        """``nest`` with the command applied (checked first: a ScheduleError says why
        not)."""
        reason = self.check(nest)
        if reason is not None:
            raise ScheduleError(reason)
        self.record(nest)
        return nest

    def record(self, nest: NestState) -> None:
        """The command's effect on a nest it was checked against."""

    # ------------------------------------------------------------ checks
    def unknown(self, v: str, loops: list[str]) -> str | None:
        if v not in loops:
            return (
                f"{self}: unknown index variable '{v}'{closest(v, loops)}; "
                f"the loop variables are {', '.join(loops)}"
            )
        return None

    def taken(self, v: str, loops: list[str]) -> str | None:
        if v in loops:
            return f"{self}: the new variable '{v}' is already a loop variable"
        if not v.isidentifier():
            return f"{self}: '{v}' is not a valid index variable name"
        return None


def first_reason(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r is not None), None)
