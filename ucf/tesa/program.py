"""A program: statements that define each tensor once, read as a data-flow graph.

SparTA propagates attributes along a model's data-flow graph; here the graph is
written as ucf statements, one per line or separated by ``;``. Each statement
defines one new tensor (SSA), so the producer of every tensor is known and an
attribute can travel both ways along the edges. Tensors that no statement
defines are the program's inputs; the shapes of the others follow from the
extents of their index variables.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ucf.errors import (
    ArgumentError,
    OperandError,
    ProgramError,
    ShapeError,
    UnsupportedError,
    boundary,
)
from ucf.lang.ast import Statement, accesses
from ucf.lang.parser import parse_statement
from ucf.tesa.attribute import TeSA

if TYPE_CHECKING:
    from ucf.tesa.plan import Plan, Policy


@dataclass(frozen=True)
class Node:
    """One statement of a program with what propagation needs to know about it."""

    statement: Statement
    output: str
    out_vars: tuple[str, ...]
    inputs: tuple[str, ...]  # distinct tensors read, in order of first access
    extents: dict[str, int]  # every index variable a plain index fixes


class Program:
    """Statements in SSA form with a shape and an attribute for every tensor."""

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

    @boundary
    def propagate(
        self,
        method: str = "exact",
        samples: int = 256,
        seed: int = 0,
        shuffle: int | None = None,
    ) -> dict[str, TeSA]:
        """Propagate the attributes through the program to their fixpoint.

        ``method="exact"`` applies the boolean-semiring rules to every statement;
        ``"scramble"`` infers each statement's rules from ``samples`` runs on random
        values instead (seeded by ``seed``), so the two can be checked against each
        other. ``shuffle`` pops the worklist in a random order seeded by it: the
        result does not depend on the order, and that is how it is tested. The
        result is also stored as ``self.attrs``, so propagating again starts from it.
        """
        from ucf.tesa.propagation import propagate

        if method not in ("exact", "scramble"):
            raise OperandError(f"propagate: method must be 'exact' or 'scramble', not {method!r}")
        if samples < 1:
            raise OperandError(f"propagate: samples must be positive, got {samples}")
        self.attrs = propagate(self, method, samples, seed, shuffle)
        return dict(self.attrs)

    @boundary
    def transform(self, policy: Policy) -> Plan:
        """An execution plan: each sparse input split into parts of one width and one
        block shape (see ``ucf.tesa.plan``), with the statements over the parts."""
        from ucf.tesa.plan import transform

        return transform(self, policy)


@boundary
def program(
    text: str,
    shapes: Mapping[str, Sequence[int]] | None = None,
    attrs: Mapping[str, TeSA] | None = None,
    outputs: Sequence[str] | None = None,
) -> Program:
    """Parse ``text`` (statements one per line or separated by ``;``) into a Program.

    ``shapes`` gives the shape of every input that ``attrs`` does not (and may
    give others, which are checked); ``attrs`` the initial attributes; tensors
    without one start dense at 32 bits. ``outputs`` defaults to the tensors that
    are defined and never read.
    """
    pieces = [s.strip() for line in text.splitlines() for s in line.split(";")]
    statements = [parse_statement(s) for s in pieces if s]
    if not statements:
        raise ProgramError("a program needs at least one statement")
    attrs = dict(attrs or {})
    for name, attr in attrs.items():
        if not isinstance(attr, TeSA):
            raise OperandError(f"attrs[{name!r}] must be a ucf.TeSA, not {type(attr).__name__}")
    known = {name: _shape(name, shape) for name, shape in (shapes or {}).items()}
    for name, attr in attrs.items():
        if name in known and known[name] != attr.shape:
            raise ShapeError(
                f"tensor {name}: shapes gives {known[name]} but its attribute has shape "
                f"{attr.shape}"
            )
        known.setdefault(name, attr.shape)
    nodes = _nodes(statements, known)
    tensors = {n.output for n in nodes} | {t for n in nodes for t in n.inputs}
    for name in sorted(set(known) - tensors):
        what = "an attribute" if name in attrs else "a shape"
        raise ProgramError(f"{what} is given for {name}, which the program does not use")
    read = {t for n in nodes for t in n.inputs}
    if outputs is None:
        outputs = [n.output for n in nodes if n.output not in read]
    for name in outputs:
        if name not in tensors:
            raise ProgramError(
                f"unknown output {name}: the program's tensors are {', '.join(sorted(tensors))}"
            )
    full = {name: attrs[name] if name in attrs else TeSA.dense(known[name]) for name in tensors}
    full = dict(sorted(full.items()))
    return Program(nodes, {t: known[t] for t in sorted(tensors)}, full, tuple(outputs))


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    """A shape ``shapes=`` gives, as a tuple of extents, or an ArgumentError naming it."""
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        raise ArgumentError(
            f"shapes= gives tensor {name} {shape!r}; a shape is a tuple of extents, as in "
            f"shapes={{{name!r}: (4, 8)}}"
        )
    if not all(isinstance(n, numbers.Integral) and n >= 0 for n in shape):
        raise ArgumentError(
            f"shapes= gives tensor {name} the shape {tuple(shape)!r}; extents are "
            "non-negative integers"
        )
    return tuple(int(n) for n in shape)


def _nodes(statements: list[Statement], shapes: dict[str, tuple[int, ...]]) -> list[Node]:
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
