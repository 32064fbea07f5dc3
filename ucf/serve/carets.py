"""Errors pointed at the text that caused them, as the library's parse errors are.

A ``ParseError`` already carries the line and a caret. A ``ScheduleError`` names
the command it refuses (``reorder(j, q): ...`` or ``unknown schedule command
'x'``); this finds that command in the schedule the user typed and puts the caret
under its first character, in the same layout.
"""

from __future__ import annotations

import re


def commands(text: str) -> list[tuple[int, str]]:
    """Each command of schedule text with its offset: commands are separated by ``;``
    or line breaks outside parentheses, as ``grammar/schedule.lark`` reads them."""
    found, depth, start = [], 0, 0
    for k, ch in enumerate(text + ";"):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch in ";\n":
            chunk = text[start:k]
            if chunk.strip():
                found.append((start + len(chunk) - len(chunk.lstrip()), chunk.strip()))
            start = k + 1
    return found


def caret(text: str, offset: int) -> str:
    """The line of ``text`` holding ``offset`` with a ``^`` under it, indented two
    spaces as ``ucf.ParseError`` shows it."""
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line = text[line_start : line_end if line_end >= 0 else len(text)]
    return f"  {line}\n  {' ' * (offset - line_start)}^"


def schedule_caret(message: str, schedule: str) -> str | None:
    """The caret block under the command a schedule error names, if it names one."""
    unknown = re.match(r"unknown schedule command '([^']*)'", message)
    squeezed = "".join(message.split())
    for offset, command in commands(schedule):
        name = command.split("(", 1)[0].strip()
        if unknown and name == unknown.group(1):
            return caret(schedule, offset)
        if not unknown and squeezed.startswith("".join(command.split()) + ":"):
            return caret(schedule, offset)
    return None
