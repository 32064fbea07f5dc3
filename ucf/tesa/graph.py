"""A program's data-flow graph: statements that define each tensor once.

SparTA propagates attributes along a model's data-flow graph; here the graph is
written as ucf statements, one per line or separated by ``;``. Each statement
defines one new tensor (SSA), so the producer of every tensor is known and an
attribute can travel both ways along the edges. Tensors that no statement
defines are the program's inputs; the shapes of the others follow from the
extents of their index variables.
"""

from __future__ import annotations

from dataclasses import dataclass

from ucf.errors import ProgramError, ShapeError, UnsupportedError
from ucf.lang.ast import Statement, accesses
from ucf.tesa.attribute import TeSA


@dataclass(frozen=True)
class Node:
    """One statement of a program with what propagation needs to know about it."""

    statement: Statement
    output: str
    out_vars: tuple[str, ...]
    inputs: tuple[str, ...]  # distinct tensors read, in order of first access
    extents: dict[str, int]  # every index variable a plain index fixes


class Graph:
    """Statements in SSA form with a shape and an attribute for every tensor: what
    propagation and plans read (``ucf.tesa.program.Program`` adds the user's verbs)."""

    def __init__(
        self,
        nodes: list[Node],
        shapes: dict[str, tuple[int, ...]],
        attrs: dict[str, TeSA],
        outputs: tuple[str, ...],
    ):
        self.nodes = nodes
        self.shapes = shapes
        self.attrs = attrs
        self.outputs = outputs
        defined = {n.output for n in nodes}
        self.inputs = tuple(dict.fromkeys(t for n in nodes for t in n.inputs if t not in defined))

    @property
    def statements(self) -> list[Statement]:
        return [n.statement for n in self.nodes]

    def __str__(self) -> str:
        return "\n".join(str(n.statement) for n in self.nodes)


def statement_nodes(statements: list[Statement], shapes: dict[str, tuple[int, ...]]) -> list[Node]:
    """Check SSA form and infer the shape of every tensor a statement defines.

    ``shapes`` is filled in with each output's shape as its statement is read."""
    defined: dict[str, int] = {}
    outputs = {s.lhs.tensor: k for k, s in reversed(list(enumerate(statements, 1)))}
    nodes = []
    for k, stmt in enumerate(statements, 1):
        out = stmt.lhs.tensor
        if stmt.op != "=":
            raise UnsupportedError(
                f"statement {k} ({stmt}): a program defines each tensor once with '='; "
                f"write {out}'s full value in one statement instead of '{stmt.op}'"
            )
        if out in defined:
            raise ProgramError(
                f"tensor {out} is defined twice (statements {defined[out]} and {k}); "
                "a program defines each tensor once: give the new value another name"
            )
        out_vars = tuple(i.single_variable for i in stmt.lhs.indices)
        if None in out_vars or len(set(out_vars)) != len(out_vars):
            raise UnsupportedError(
                f"statement {k} ({stmt}): the output of a program statement is indexed by "
                "distinct index variables"
            )
        extents: dict[str, tuple[int, str]] = {}
        for a in accesses(stmt.rhs):
            if a.tensor in outputs and a.tensor not in defined:
                raise ProgramError(
                    f"tensor {a.tensor} is read by statement {k} before statement "
                    f"{outputs[a.tensor]} defines it"
                )
            if a.tensor not in shapes:
                raise ProgramError(
                    f"tensor {a.tensor} (statement {k}) is not defined: no statement defines "
                    f"it and, as an input, it has neither a shape nor an attribute (give "
                    f"shapes={{'{a.tensor}': ...}} or attrs)"
                )
            shape = shapes[a.tensor]
            if len(shape) != len(a.indices):
                raise ShapeError(
                    f"tensor {a.tensor} has shape {shape} but statement {k} accesses it with "
                    f"{len(a.indices)} indices"
                )
            for idx, n in zip(a.indices, shape, strict=True):
                v = idx.single_variable
                if v is None:
                    continue
                if v in extents and extents[v][0] != n:
                    raise ShapeError(
                        f"statement {k} ({stmt}): index variable {v} has extent "
                        f"{extents[v][0]} from {extents[v][1]} but {n} from {a.tensor}"
                    )
                extents.setdefault(v, (n, a.tensor))
        sizes = {v: n for v, (n, _) in extents.items()}
        given = shapes.get(out)
        if given is not None and len(given) != len(out_vars):
            raise ShapeError(
                f"tensor {out} has shape {given} but statement {k} defines it with "
                f"{len(out_vars)} indices"
            )
        for pos, v in enumerate(out_vars):
            if v in sizes and given is not None and given[pos] != sizes[v]:
                raise ShapeError(
                    f"tensor {out} has shape {given} but statement {k} gives its index "
                    f"variable {v} extent {sizes[v]} from {extents[v][1]}"
                )
            if v not in sizes:
                if given is None:
                    raise ShapeError(
                        f"statement {k} ({stmt}): the extent of {v} does not follow from the "
                        f"operands; give {out}'s shape in shapes="
                    )
                sizes[v] = given[pos]
        shapes[out] = tuple(sizes[v] for v in out_vars)
        defined[out] = k
        inputs = tuple(dict.fromkeys(a.tensor for a in accesses(stmt.rhs)))
        nodes.append(Node(stmt, out, out_vars, inputs, sizes))
    return nodes
