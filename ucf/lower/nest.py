"""The loop nest the schedule transformations work on, and what they share."""

from __future__ import annotations

from dataclasses import dataclass, field

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import Var
from ucf.ir.walk import loops, nodes, substitute
from ucf.schedule import Provenance

I64 = "i64"


@dataclass
class Nest:
    """A function body plus what the transformations need to know about it."""

    body: list[ir.Stmt]
    prov: Provenance
    out_vars: set[str]
    out_vals: str  # name of the output's values array
    sparse_out: bool
    parallel_out: set[str]  # output variables a sparse output can be built in parallel over
    entries: dict[str, tuple[Var, int]] = field(default_factory=dict)  # label -> (first, count)
    clipped: dict[str, tuple[ir.Expr, Var, ir.Expr]] = field(default_factory=dict)  # strip_mine
    workspaces: list[ir.Array] = field(default_factory=list)
    # A dense workspace's values array -> its variables: a producer's loop over one of
    # them writes entries of its own (``ucf.lower.parallel``).
    filled: dict[str, frozenset[str]] = field(default_factory=dict)
    # The assemble pass of a sparse output stops once every appended coordinate is
    # placed, so loops further in (over dense trailing levels, or reductions) are absent.
    partial: bool = False
    # Output variables of dense levels below a sparse output's last compressed level:
    # loops over them write values at placed positions and append nothing.
    trailing_out: set[str] = field(default_factory=set)
    # The counter a one-pass output's rows append at: a parallel loop over its rows may
    # carry it, as the lowerer then runs them in chunks of their own (``row_chunks``).
    chunked: frozenset[str] = frozenset()

    def has(self, label: str) -> bool:
        """Whether some loop of the nest is labelled ``label``."""
        return any(loop.label == label for _, loop in loops(self.body))

    def find_all(self, label: str, cmd: str) -> list[tuple[list[ir.Stmt], int, ir.For]]:
        """Every loop labelled ``label``: one, or a precompute's producer and consumer."""
        found = []
        for container, loop in loops(self.body):
            if loop.label == label:
                if isinstance(loop, ir.While):
                    raise ScheduleError(
                        f"{cmd}: {label} is co-iterated by a while loop over several sparse "
                        "operands; only a for loop (a dense dimension or one driving sparse "
                        f"operand; see pos) can be split, fused or run in parallel"
                    )
                found.append((container, index_of(container, loop), loop))
        if not found:
            raise ScheduleError(f"{cmd}: no loop over {label} in this kernel")
        return found

    def find(self, label: str, cmd: str) -> tuple[list[ir.Stmt], int, ir.For]:
        found = self.find_all(label, cmd)
        if len(found) > 1:
            names = {ws.name for ws in self.workspaces}
            if names and all(arrays_named(loop) & names for _, _, loop in found):
                raise ScheduleError(
                    f"{cmd}: {label} is looped over by both the producer and the consumer of "
                    f"the precompute; split the variable before the precompute instead"
                )
            raise ScheduleError(
                f"{cmd}: {label} is walked by {len(found)} loops, one per case of a sum of "
                "sparse operands (where they meet, and where only some have entries); only a "
                "single loop can be split, fused or bounded"
            )
        return found[0]


def index_of(container: list, item) -> int:
    return next(k for k, s in enumerate(container) if s is item)


def take_entry(nest: Nest, label: str, container: list, k: int, start: ir.Expr):
    """Remove the statements that set up the loop at ``container[k]`` for a range starting
    at its ``first`` variable; return them rewritten to start at ``start``, and the loop's
    new index."""
    if label not in nest.entries:
        return [], k
    first, count = nest.entries.pop(label)
    entry = container[k - count + 1 : k]  # the first statement declares ``first``
    del container[k - count : k]
    return substitute(entry, {first.name: start}), k - count


def arrays_named(node) -> set[str]:
    return {n.name for n in nodes(node) if isinstance(n, ir.Array)}


def has_load(*exprs) -> bool:
    return any(isinstance(n, ir.Load) for e in exprs for n in nodes(e))
