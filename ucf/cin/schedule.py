"""Schedule text and the fluent ``ucf.Schedule()`` chain, parsed into commands.

Every command of DESIGN section 2 parses; a command is checked against the
statement before anything is compiled, so a typo or an illegal request is a
``ScheduleError`` that names the variable and suggests the closest name.
``reorder``, ``split``, ``divide`` and ``parallelize(i, CPUThread, NoRaces)``
are applied today;
the other commands are recognised and refused with a clear message until the
scheduling work lands.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import lark

from ucf.errors import ParseError, ScheduleError

COMMANDS = {
    "reorder": None,  # any number of variables
    "split": 4,
    "divide": 4,
    "fuse": 3,
    "pos": 3,
    "bound": 4,
    "unroll": 2,
    "precompute": 4,
    "parallelize": None,  # 3, or 4 for GPUGroup
}
UNITS = ("CPUThread", "CPUVector", "GPUBlock", "GPUWarp", "GPUThread", "GPUGroup")
STRATEGIES = ("NoRaces", "IgnoreRaces", "Atomics", "Temporary", "ParallelReduction", "Segment")


@dataclass(frozen=True)
class Command:
    name: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(self.args)})"


def closest(name: str, choices) -> str:
    match = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


def parse_schedule(text: str) -> list[Command]:
    from ucf.lang.parser import _describe, _parser

    try:
        tree = _parser("schedule.lark").parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise ParseError("schedule: " + _describe(e), text, e.line, e.column) from None
    commands = []
    for node in tree.children:
        if node is None:
            continue
        name = str(node.children[0])
        args = tuple(_text(text, a) for a in node.children[1:] if a is not None)
        if name not in COMMANDS:
            raise ScheduleError(f"unknown schedule command '{name}'{closest(name, COMMANDS)}")
        arity = COMMANDS[name]
        if arity is not None and len(args) != arity:
            raise ScheduleError(f"{name} takes {arity} arguments, got {len(args)}: {name}{args}")
        commands.append(Command(name, args))
    return commands


def _text(source: str, node) -> str:
    if isinstance(node, lark.Token):
        return str(node)
    meta = node.meta
    return source[meta.start_pos : meta.end_pos]


@dataclass(frozen=True)
class Split:
    """``split`` (fixed inner size) or ``divide`` (fixed number of outer parts) of a loop."""

    var: str
    outer: str
    inner: str
    amount: int
    mode: str  # "split" or "divide"


@dataclass
class Applied:
    order: list[str]  # original index variables, outer to inner
    parallel: dict[str, tuple[str, str]]  # loop variable (original or derived) -> unit, strategy
    splits: dict[str, Split]  # original variable -> how its loop is strip-mined


def apply_schedule(
    commands: list[Command], order: list[str], chains: dict[str, list[str]]
) -> Applied:
    """Apply ``reorder``, ``split``/``divide`` and ``parallelize`` to a loop order.

    ``chains`` maps each sparse operand (or the sparse output) to its index
    variables in level order; a reorder that walks one out of order is refused.
    A split loop is strip-mined in place, so its two halves must stay adjacent.
    The lowerer checks the rest of parallelize's preconditions, which depend
    on the loops it builds.
    """
    loops = list(order)  # schedule-level loop variables, derived ones included
    parallel: dict[str, tuple[str, str]] = {}
    splits: dict[str, Split] = {}
    for cmd in commands:
        if cmd.name == "parallelize":
            parallel.update(_parallelize(cmd, loops))
        elif cmd.name in ("split", "divide"):
            sp = _split(cmd, loops)
            if sp.var not in order:
                raise ScheduleError(f"{cmd}: splitting a derived variable is not supported yet")
            splits[sp.var] = sp
            k = loops.index(sp.var)
            loops[k : k + 1] = [sp.outer, sp.inner]
        elif cmd.name == "reorder":
            _reorder(cmd, loops)
        else:
            raise ScheduleError(
                f"schedule command '{cmd}' is not supported yet; this version applies "
                "reorder, split, divide and parallelize(i, CPUThread, NoRaces)"
            )
    for sp in splits.values():
        k = loops.index(sp.outer)
        if k + 1 >= len(loops) or loops[k + 1] != sp.inner:
            raise ScheduleError(
                f"{sp.mode}({sp.var}, {sp.outer}, {sp.inner}, {sp.amount}): {sp.outer} and "
                f"{sp.inner} must stay adjacent, outer first, in this version (the loop "
                f"order is {', '.join(loops)})"
            )
    order = [v for v in loops if v not in {sp.inner for sp in splits.values()}]
    order = [next((sp.var for sp in splits.values() if sp.outer == v), v) for v in order]
    pos = {v: k for k, v in enumerate(order)}
    for who, chain in chains.items():
        for a, b in zip(chain, chain[1:], strict=False):
            if pos[a] > pos[b]:
                raise ScheduleError(
                    f"reorder: loop order {', '.join(order)} visits {b} before {a}, but "
                    f"{who} stores {a} above {b}; reorder the loops or store {who} "
                    "in another mode order"
                )
    return Applied(order, parallel, splits)


def _reorder(cmd: Command, loops: list[str]) -> None:
    for v in cmd.args:
        if v not in loops:
            raise ScheduleError(
                f"reorder: unknown index variable '{v}'{closest(v, loops)}; "
                f"the loop variables are {', '.join(loops)}"
            )
    if len(set(cmd.args)) != len(cmd.args):
        raise ScheduleError(f"reorder: a variable is repeated in {cmd}")
    slots = sorted(loops.index(v) for v in cmd.args)
    for slot, v in zip(slots, cmd.args, strict=True):
        loops[slot] = v


def _split(cmd: Command, loops: list[str]) -> Split:
    var, outer, inner, amount = cmd.args
    if var not in loops:
        raise ScheduleError(
            f"{cmd}: unknown index variable '{var}'{closest(var, loops)}; "
            f"the loop variables are {', '.join(loops)}"
        )
    for new in (outer, inner):
        if new in loops:
            raise ScheduleError(f"{cmd}: the new variable '{new}' is already a loop variable")
    if outer == inner:
        raise ScheduleError(f"{cmd}: the two new variables must differ")
    if not amount.isdigit() or int(amount) < 1:
        raise ScheduleError(
            f"{cmd}: the {'factor' if cmd.name == 'split' else 'number of parts'} "
            f"must be a positive integer, got '{amount}'"
        )
    return Split(var, outer, inner, int(amount), cmd.name)


def _parallelize(cmd: Command, order: list[str]) -> dict[str, tuple[str, str]]:
    if len(cmd.args) not in (3, 4):
        raise ScheduleError(
            f"{cmd}: parallelize takes (i, unit, strategy) or (i, GPUGroup, size, strategy)"
        )
    v, unit, strategy = cmd.args[0], cmd.args[1], cmd.args[-1]
    if v not in order:
        raise ScheduleError(
            f"{cmd}: unknown index variable '{v}'{closest(v, order)}; "
            f"the loop variables are {', '.join(order)}"
        )
    if unit not in UNITS:
        raise ScheduleError(f"{cmd}: unknown unit '{unit}'{closest(unit, UNITS)}")
    if strategy not in STRATEGIES:
        raise ScheduleError(f"{cmd}: unknown strategy '{strategy}'{closest(strategy, STRATEGIES)}")
    if (unit, strategy) != ("CPUThread", "NoRaces"):
        raise ScheduleError(
            f"{cmd}: only parallelize(i, CPUThread, NoRaces) is supported in this version"
        )
    return {v: (unit, strategy)}


class Schedule:
    """A fluent schedule: ``ucf.Schedule().reorder("j", "i")``; ``str()`` gives the text."""

    def __init__(self, commands: tuple[Command, ...] = ()):
        self.commands = commands

    def _add(self, name: str, *args) -> Schedule:
        return Schedule((*self.commands, Command(name, tuple(str(a) for a in args))))

    def reorder(self, *variables: str) -> Schedule:
        return self._add("reorder", *variables)

    def split(self, i: str, outer: str, inner: str, factor: int) -> Schedule:
        return self._add("split", i, outer, inner, factor)

    def divide(self, i: str, outer: str, inner: str, parts: int) -> Schedule:
        return self._add("divide", i, outer, inner, parts)

    def fuse(self, i: str, j: str, fused: str) -> Schedule:
        return self._add("fuse", i, j, fused)

    def pos(self, i: str, ipos: str, tensor: str) -> Schedule:
        return self._add("pos", i, ipos, tensor)

    def bound(self, i: str, ib: str, n: int, kind: str = "MaxExact") -> Schedule:
        return self._add("bound", i, ib, n, kind)

    def unroll(self, i: str, factor: int) -> Schedule:
        return self._add("unroll", i, factor)

    def precompute(self, expr: str, i: str, iw: str, name: str) -> Schedule:
        return self._add("precompute", expr, i, iw, name)

    def parallelize(self, i: str, unit: str, *rest) -> Schedule:
        return self._add("parallelize", i, unit, *rest)

    def __str__(self) -> str:
        return "; ".join(map(str, self.commands))

    def __repr__(self) -> str:
        return f"Schedule('{self}')"
