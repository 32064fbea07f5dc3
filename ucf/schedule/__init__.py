"""Schedules: typed commands, checked against the loop nest and recorded for the lowerer.

- ``nest_state``, ``loops``, ``requests``: one class per command (typed arguments
  parsed once, ``check(nest) -> reason | None``, ``apply(nest) -> nest``);
  ``commands`` maps names to them;
- ``provenance``: which loop variable derives from which;
- ``records``: what a checked schedule hands on (splits, bounds, parallel loops...);
- ``apply``: the checker, from commands to an ``Applied``;
- ``text`` and ``fluent``: the two spellings, which build the same command objects;
- ``cpu_model``, ``gpu_model``, ``stats``: the default schedules and what they read;
  ``parallel_loops`` (the CPU's parallel loop, static or in chunks), ``innermost_bound``
  (its bound and register tiles) and ``block_rows`` (bcsr block rows that keep a static
  split) are parts of the CPU model;
  ``gathering`` (sums of products) and ``transposed_products`` (operands read the
  other way round) are the CPU model's plans for what the plain loop order does badly;
- ``candidates``: candidates tried in turn, refusals kept for ``k.cin``.

Every command of the schedule language is checked against the statement
before anything is compiled, so a typo or an illegal request is a
``ScheduleError`` that names the variable and suggests the closest name.
"""

from ucf.schedule.apply import QUERY_COMMANDS, Applied, apply_schedule, output_vars
from ucf.schedule.commands import (
    COMMANDS,
    STRATEGIES,
    UNITS,
    Command,
    NestState,
    closest,
    command,
)
from ucf.schedule.fluent import Schedule
from ucf.schedule.provenance import Provenance, Relation
from ucf.schedule.records import Assemble, Bound, Dismantle, Parallel, Precompute, Split
from ucf.schedule.text import parse_schedule

__all__ = [
    "COMMANDS",
    "QUERY_COMMANDS",
    "STRATEGIES",
    "UNITS",
    "Applied",
    "Assemble",
    "Bound",
    "Command",
    "Dismantle",
    "NestState",
    "Parallel",
    "Precompute",
    "Provenance",
    "Relation",
    "Schedule",
    "Split",
    "apply_schedule",
    "closest",
    "command",
    "output_vars",
    "parse_schedule",
]
