"""Einsum text to AST with lark; every failure is a ParseError with a caret."""

from __future__ import annotations

from functools import cache, lru_cache

import lark
from lark import Lark, Transformer, v_args

from ucf.errors import ParseError
from ucf.lang.affine import Affine
from ucf.lang.ast import (
    Access,
    Binary,
    Call,
    Expr,
    Literal,
    Neg,
    Statement,
    Sum,
    accesses,
    children,
    index_variables,
    with_children,
)
from ucf.lang.functions import EXTREMA, FUNCTIONS, RESERVED, SUM
from ucf.lang.reductions import sums, with_reductions


@cache
def _parser(name: str) -> Lark:
    """The LALR parser of a grammar. Building its tables took 50-100 ms per grammar in
    every process; lark keeps them in the cache directory, under the grammar's digest, and
    rebuilds them when that file is missing, stale or unreadable."""
    from ucf.resources import cache_dir, grammar_file

    tables = cache_dir() / f"lark-{name}.tables"
    return Lark(
        grammar_file(name).read_text(), parser="lalr", propagate_positions=True, cache=str(tables)
    )


class _Located(Exception):
    """An error found while building the AST, with the position of the text it is about."""

    def __init__(self, message: str, meta, quoted: bool = False):
        super().__init__(message)
        self.meta = meta
        self.quoted = quoted  # the message has one %s for the source text at meta


@v_args(meta=True)
class _ToAst(Transformer):
    """Builds the AST and remembers where each right-hand-side node was written, so that
    errors found after parsing (an index that is not affine, a misused ``sum``) point at
    the text they are about."""

    def __init__(self):
        super().__init__()
        self.where: dict[int, object] = {}
        # ``max``/``min`` calls whose first argument is a bare name: a reduction when the
        # name is an index variable, which only the whole statement tells (``resolve``).
        self.extrema: set[int] = set()

    def _at(self, node, meta):
        self.where[id(node)] = meta
        return node

    def start(self, meta, children):
        lhs, op, rhs = children
        return Statement(lhs, str(op), rhs)

    def access(self, meta, children):
        name, *indices = children
        indices = [i for i in indices if i is not None]
        return Access(str(name), tuple(indices))

    def scalar_ref(self, meta, children):
        return self._at(Access(str(children[0]), ()), meta)

    def literal(self, meta, children):
        text = str(children[0])
        value = float(text) if any(c in text for c in ".eE") else int(text)
        return self._at(Literal(value), meta)

    def call(self, meta, children):
        name, *args = (str(children[0]), *(a for a in children[1:] if a is not None))
        if name == SUM:
            return self._at(self._sum(args, meta), meta)
        if name in EXTREMA and _bare(args[0]) and len(args) >= 2:
            node = self._at(Call(name, tuple(args)), meta)
            self.extrema.add(id(node))
            return node
        if name in FUNCTIONS:
            fn = FUNCTIONS[name]
            if len(args) != fn.arity:
                raise _Located(
                    f"{name} takes {fn.arity} argument{'s' * (fn.arity > 1)}, got {len(args)}",
                    meta,
                )
            return self._at(Call(name, tuple(args)), meta)
        for a in args:
            if isinstance(a, Access) and a.indices or isinstance(a, Call | Sum):
                known = ", ".join([*FUNCTIONS, SUM])
                raise _Located(
                    f"{name} is not a function ucf knows (the functions are {known}), and as "
                    f"a tensor {name} would be indexed by index variables, not by '%s'",
                    self.where.get(id(a), meta),
                    quoted=True,
                )
        return self._at(Access(name, tuple(self._index(a) for a in args)), meta)

    def _sum(self, args: list[Expr], meta, op: str = SUM) -> Sum:
        if len(args) < 2:
            raise _Located(
                f"{op} takes index variables and then an expression: {op}(j, expr)", meta
            )
        names = []
        for a in args[:-1]:
            if not _bare(a):
                raise _Located(
                    f"{op}: '{a}' is not an index variable; write {op}(j, expr) or "
                    f"{op}(j, k, expr)",
                    self.where.get(id(a), meta),
                )
            if a.tensor in names:
                raise _Located(f"{op}: index variable {a.tensor} is listed twice", meta)
            names.append(a.tensor)
        return Sum(tuple(names), args[-1], op)

    def resolve(self, stmt: Statement) -> Statement:
        """``max(j, e)``/``min(j, e)`` as reductions where ``j`` is an index variable of
        the statement (it indexes some access), else as the element-wise functions."""
        if not self.extrema:
            return stmt
        variables = {v for a in _all_accesses(stmt) for idx in a.indices for v in idx.variables}
        heads = {
            id(c.args[0])
            for c in _nodes(stmt.rhs)
            if id(c) in self.extrema and c.args[0].tensor in variables
        }
        scalars = {
            x.tensor
            for x in _nodes(stmt.rhs)
            if isinstance(x, Access) and not x.indices and id(x) not in heads
        }

        def go(e: Expr) -> Expr:
            kids = [go(c) for c in children(e)]
            meta = self.where.get(id(e))
            if id(e) in self.extrema:
                assert isinstance(e, Call)
                head = e.args[0]
                if head.tensor in variables:
                    if head.tensor in scalars:
                        raise _Located(
                            f"{e.fn}({head.tensor}, ...): {head.tensor} is both an index "
                            f"variable of the statement (a {e.fn} over it) and a scalar operand "
                            "read elsewhere; rename one of them",
                            meta,
                        )
                    return self._at(self._sum(kids, meta, e.fn), meta)
                if len(kids) != 2:
                    raise _Located(
                        f"{e.fn} takes 2 arguments, got {len(kids)} ({head.tensor} is not an "
                        f"index variable, so this is not {e.fn}({head.tensor}, expr))",
                        meta,
                    )
            if all(k is c for k, c in zip(kids, children(e), strict=True)):
                return e
            return self._at(with_children(e, kids), meta) if meta else with_children(e, kids)

        return Statement(stmt.lhs, stmt.op, go(stmt.rhs), stmt.text)

    def _index(self, e: Expr) -> Affine:
        """An access's argument as an affine index: names are index variables."""
        meta = self.where.get(id(e))
        if isinstance(e, Access) and not e.indices:
            if e.tensor in RESERVED:
                raise _Located(f"'{e.tensor}' is a function, not an index variable", meta)
            return Affine.var(e.tensor)
        if isinstance(e, Literal):
            if isinstance(e.value, float):
                raise _Located(f"index '{e.value}' is not an integer", meta)
            return Affine.constant(e.value)
        if isinstance(e, Neg):
            return -self._index(e.operand)
        if isinstance(e, Binary) and e.op in "+-":
            left, right = self._index(e.left), self._index(e.right)
            return left + right if e.op == "+" else left - right
        if isinstance(e, Binary) and e.op == "*":
            return _affine_product(self._index(e.left), self._index(e.right), meta)
        what = {
            Access: "a tensor access",
            Call: "a function call",
            Sum: "a sum",
            Binary: "a division",
        }
        raise _Located(f"index '%s' is not affine: {what[type(e)]}", meta, quoted=True)

    def add(self, meta, c):
        return self._at(Binary("+", c[0], c[1]), meta)

    def sub(self, meta, c):
        return self._at(Binary("-", c[0], c[1]), meta)

    def mul(self, meta, c):
        return self._at(Binary("*", c[0], c[1]), meta)

    def div(self, meta, c):
        return self._at(Binary("/", c[0], c[1]), meta)

    def neg(self, meta, c):
        return self._at(Neg(c[0]), meta)

    def ivar(self, meta, c):
        return Affine.var(str(c[0]))

    def iconst(self, meta, c):
        return Affine.constant(int(c[0]))

    def iadd(self, meta, c):
        return c[0] + c[1]

    def isub(self, meta, c):
        return c[0] - c[1]

    def ineg(self, meta, c):
        return -c[0]

    def imul(self, meta, c):
        return _affine_product(c[0], c[1], meta)


def _bare(e: Expr) -> bool:
    """A name alone: an index variable or a scalar operand."""
    return isinstance(e, Access) and not e.indices


def _nodes(e: Expr):
    yield e
    for c in children(e):
        yield from _nodes(c)


def _all_accesses(stmt: Statement) -> list[Access]:
    return [stmt.lhs, *(x for x in _nodes(stmt.rhs) if isinstance(x, Access))]


def _affine_product(a: Affine, b: Affine, meta) -> Affine:
    if a.is_constant:
        return b.scale(a.const)
    if b.is_constant:
        return a.scale(b.const)
    left, right = (f"({x})" if len(x.terms) + bool(x.const) > 1 else str(x) for x in (a, b))
    raise _Located(
        f"index expression '{left} * {right}' is not affine: a product of index variables",
        meta,
    )


@lru_cache(maxsize=512)
def parse_statement(text: str) -> Statement:
    """Parse one statement such as ``y(i) = A(i,j) * x(j)``.

    The right-hand side comes back in reduction notation: every variable it
    sums over is bound by a ``Sum`` node (see ``ucf.lang.reductions``). The AST
    is immutable, so a text is parsed once: ``ucf.einsum`` in a loop, the dtype
    check and the planner each ask for the same statement.
    """
    try:
        tree = _parser("einsum.lark").parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise ParseError(_describe(e), text, e.line, e.column) from None
    builder = _ToAst()
    try:
        stmt = builder.resolve(builder.transform(tree))
        _check_scalars(stmt, builder.where)
        rhs = with_reductions(stmt, lambda node: builder.where.get(id(node)), _Located)
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, _Located):
            _raise_at(e.orig_exc, text)
        raise
    except _Located as e:
        _raise_at(e, text)
    return Statement(stmt.lhs, stmt.op, rhs, text)


def _check_scalars(stmt: Statement, where: dict) -> None:
    """Refuse an index variable read as a value (``relu(i)``, ``i * x(i)``): it would
    otherwise be a scalar tensor named ``i``, which no call passes."""
    indices = set(index_variables(stmt.lhs)) | set(index_variables(stmt.rhs))
    indices |= {v for s in sums(stmt.rhs) for v in s.vars}
    for a in accesses(stmt.rhs):
        if not a.indices and a.tensor in indices:
            raise _Located(
                f"'{a.tensor}' is an index variable of this statement, so it cannot be a value "
                f"too: index variables index tensors, as in x({a.tensor}); to compute with "
                f"the numbers 0, 1, ..., pass them as a tensor",
                where.get(id(a)),
            )


def _raise_at(e: _Located, text: str):
    m = e.meta
    if m is None:
        raise ParseError(str(e), text) from None
    message = str(e) % text[m.start_pos : m.end_pos] if e.quoted else str(e)
    raise ParseError(message, text, m.line, m.column) from None


def _describe(e: lark.exceptions.UnexpectedInput) -> str:
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        return f"unexpected character {e.char!r}"
    if isinstance(e, lark.exceptions.UnexpectedEOF):
        return "unexpected end of input"
    if isinstance(e, lark.exceptions.UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            return "unexpected end of input"
        return f"unexpected {tok.type.lower().replace('_', ' ')} {str(tok)!r}"
    return "syntax error"
