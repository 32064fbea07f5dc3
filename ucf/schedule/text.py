"""Schedule text (``grammar/schedule.lark``) parsed into commands."""

from __future__ import annotations

from collections.abc import Sequence

from ucf.errors import ArgumentError, ParseError
from ucf.schedule.commands import Command, command
from ucf.schedule.fluent import Schedule


def parse_schedule(text: str) -> list[Command]:
    """The commands of ``text``, each of its own class with its arguments checked.
    (lark is imported here: a kernel loaded from the cache parses nothing.)"""
    import lark

    from ucf.lang.parser import _describe, _parser

    try:
        tree = _parser("schedule.lark").parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise ParseError("schedule: " + _describe(e), text, e.line, e.column) from None
    return [
        command(str(node.children[0]), tuple(_text(text, a) for a in node.children[1:] if a))
        for node in tree.children
        if node is not None
    ]


def _text(source: str, node) -> str:
    import lark

    if isinstance(node, lark.Token):
        return str(node)
    meta = node.meta
    return source[meta.start_pos : meta.end_pos]


def as_commands(schedule: str | Schedule | Sequence[Command] | None) -> list[Command] | None:
    """A schedule as the API takes it (text, a fluent ``Schedule``, or commands) as its
    commands; None for none. Text is parsed here, once, where it enters."""
    if schedule is None:
        return None
    if isinstance(schedule, Schedule):
        return list(schedule.commands)
    if isinstance(schedule, str):
        return parse_schedule(schedule)
    if not isinstance(schedule, list | tuple) or not all(isinstance(c, Command) for c in schedule):
        raise ArgumentError(
            f"schedule={schedule!r}: a schedule is text, a ucf.Schedule or a list of commands"
        )
    return list(schedule)


def spelled(commands: Sequence[Command] | None) -> str | None:
    """Commands as the schedule language spells them (None for none)."""
    return None if commands is None else "; ".join(map(str, commands))
