"""``ucf.Schedule()``: the schedule language as a chain of method calls."""

from __future__ import annotations

from ucf.schedule.commands import Command, command


class Schedule:
    """A fluent schedule: ``ucf.Schedule().reorder("j", "i")``; ``str()`` gives the text.

    Each method builds the same command object the text parser does, so a
    mistake in its arguments is a ``ScheduleError`` at once."""

    def __init__(self, commands: tuple[Command, ...] = ()):
        self.commands = commands

    def _add(self, name: str, *args) -> Schedule:
        return Schedule((*self.commands, command(name, tuple(str(a) for a in args))))

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

    def branchless(self, i: str, width: int) -> Schedule:
        return self._add("branchless", i, width)

    def streams(self, i: str, level: int) -> Schedule:
        return self._add("streams", i, level)

    def precompute(
        self,
        expr: str,
        i: str | tuple[str, ...],
        iw: str | tuple[str, ...],
        name: str | None = None,
    ) -> Schedule:
        """``name`` None: ucf names the workspace (``w``, or ``w1``... if taken); a tuple
        of variables (``("j", "l")``) for a workspace over several, as ``{j,l}`` spells
        them in the text."""
        i, iw = (f"{{{','.join(v)}}}" if isinstance(v, tuple) else v for v in (i, iw))
        return self._add("precompute", expr, i, iw, *([name] if name else []))

    def parallelize(self, i: str, unit: str, *rest) -> Schedule:
        return self._add("parallelize", i, unit, *rest)

    def assemble(self, tensor: str, strategy: str, separately: bool = False) -> Schedule:
        return self._add("assemble", tensor, strategy, "true" if separately else "false")

    def condense(self, i: str, tensor: str, depth: int) -> Schedule:
        return self._add("condense", i, tensor, depth)

    def convert(self, tensor: str) -> Schedule:
        return self._add("convert", tensor)

    def dismantle(self, i: str, values: bool = False) -> Schedule:
        """Unroll ``i`` and the loops around it over the static operands' patterns;
        ``values`` embeds their values as constants too."""
        return self._add("dismantle", i, *(["values"] if values else []))

    def __str__(self) -> str:
        return "; ".join(map(str, self.commands))

    def __repr__(self) -> str:
        return f"Schedule('{self}')"
