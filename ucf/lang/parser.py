"""Einsum text to AST with lark; every failure is a ParseError with a caret."""

from __future__ import annotations

from functools import cache

import lark
from lark import Lark, Transformer, v_args

from ucf.errors import ParseError
from ucf.lang.affine import Affine
from ucf.lang.ast import Access, Binary, Literal, Neg, Statement


@cache
def _parser(name: str) -> Lark:
    from ucf.resources import grammar_file

    return Lark(grammar_file(name).read_text(), parser="lalr", propagate_positions=True)


class _NotAffine(Exception):
    def __init__(self, message: str, meta):
        super().__init__(message)
        self.meta = meta


@v_args(meta=True)
class _ToAst(Transformer):
    def start(self, meta, children):
        lhs, op, rhs = children
        return Statement(lhs, str(op), rhs)

    def access(self, meta, children):
        name, *indices = children
        indices = [i for i in indices if i is not None]
        return Access(str(name), tuple(indices))

    def scalar_ref(self, meta, children):
        return Access(str(children[0]), ())

    def literal(self, meta, children):
        text = str(children[0])
        return Literal(float(text) if any(c in text for c in ".eE") else int(text))

    def add(self, meta, c):
        return Binary("+", c[0], c[1])

    def sub(self, meta, c):
        return Binary("-", c[0], c[1])

    def mul(self, meta, c):
        return Binary("*", c[0], c[1])

    def div(self, meta, c):
        return Binary("/", c[0], c[1])

    def neg(self, meta, c):
        return Neg(c[0])

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
        a, b = c
        if a.is_constant:
            return b.scale(a.const)
        if b.is_constant:
            return a.scale(b.const)
        left, right = (f"({x})" if len(x.terms) + bool(x.const) > 1 else str(x) for x in c)
        raise _NotAffine(
            f"index expression '{left} * {right}' is not affine: a product of index variables",
            meta,
        )


def parse_statement(text: str) -> Statement:
    """Parse one statement such as ``y(i) = A(i,j) * x(j)``."""
    try:
        tree = _parser("einsum.lark").parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise ParseError(_describe(e), text, e.line, e.column) from None
    try:
        stmt = _ToAst().transform(tree)
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, _NotAffine):
            m = e.orig_exc.meta
            raise ParseError(str(e.orig_exc), text, m.line, m.column) from None
        raise
    return Statement(stmt.lhs, stmt.op, stmt.rhs, text)


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
