"""The scheduling commands, by name: one small class each (in ``loops`` and
``requests``, on ``nest_state``), with typed arguments converted once from text
(``parse``), a check against the loop nest that says what is wrong (``check(nest)
-> reason | None``), and its effect on the nest (``apply(nest) -> nest``, which
checks first).

A command prints as the schedule language spells it (``str``), so ``k.cin``, tuned
schedules and exported kernels show the objects, not a copy of the text. The text
parser and the fluent ``Schedule`` both build commands through ``command(name,
args)``; the default models build them directly. The lowerer's loop transformations
(``ucf.lower.transforms``) dispatch on the command's class.
"""

from __future__ import annotations

from dataclasses import replace

from ucf.errors import ScheduleError
from ucf.schedule.loops import (
    Arrange,
    BoundCommand,
    Branchless,
    Fuse,
    Pos,
    Reorder,
    SplitCommand,
    Streams,
    Unroll,
)
from ucf.schedule.nest_state import (
    ASSEMBLE_STRATEGIES,
    BOUND_KINDS,
    STRATEGIES,
    UNITS,
    Command,
    NestState,
    closest,
)
from ucf.schedule.requests import (
    AssembleCommand,
    Condense,
    Convert,
    DismantleCommand,
    Parallelize,
    PrecomputeCommand,
)

__all__ = [
    "ASSEMBLE_STRATEGIES",
    "BOUND_KINDS",
    "COMMANDS",
    "STRATEGIES",
    "UNITS",
    "Arrange",
    "AssembleCommand",
    "BoundCommand",
    "Branchless",
    "Command",
    "Condense",
    "Convert",
    "DismantleCommand",
    "Fuse",
    "NestState",
    "Parallelize",
    "Pos",
    "PrecomputeCommand",
    "Reorder",
    "SplitCommand",
    "Streams",
    "Unroll",
    "closest",
    "command",
    "renamed",
]


def renamed(cmd: Command, var: str) -> Command:
    """``cmd`` applied to loop ``var`` instead (a query loop's command on the loop it
    stands for)."""
    if isinstance(cmd, DismantleCommand):
        return replace(cmd, request=replace(cmd.request, var=var))
    return replace(cmd, var=var)


#: Every command the schedule language has, by name.
COMMANDS: dict[str, type[Command]] = {
    "reorder": Reorder,
    "split": SplitCommand,
    "divide": SplitCommand,
    "fuse": Fuse,
    "pos": Pos,
    "bound": BoundCommand,
    "unroll": Unroll,
    "branchless": Branchless,
    "streams": Streams,
    "precompute": PrecomputeCommand,
    "parallelize": Parallelize,
    "assemble": AssembleCommand,
    "condense": Condense,
    "dismantle": DismantleCommand,
    "convert": Convert,
}


def command(name: str, args: tuple[str, ...]) -> Command:
    """The command ``name(args)`` of the schedule language, of its own class, its
    arguments converted (the text parser and the fluent ``Schedule`` call this)."""
    if name not in COMMANDS:
        raise ScheduleError(f"unknown schedule command '{name}'{closest(name, COMMANDS)}")
    return COMMANDS[name].parse(name, args)
