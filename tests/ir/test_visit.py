"""The IR dispatches on node classes (``ucf.ir.visit``): printers and code generators
reach one handler per class, a subclass overrides a handler by name, and a node
nobody handles is refused by name."""

from __future__ import annotations

import pytest

from ucf.codegen import c as cgen
from ucf.ir import nodes as ir
from ucf.ir.printer import expr
from ucf.ir.visit import Visitor, handles


class _Counter(Visitor):
    refusal = "nothing counts"

    @handles(ir.Var, ir.Const)
    def leaf(self, e) -> int:
        return 1

    @handles(ir.Bin)
    def binary(self, e: ir.Bin) -> int:
        return 1 + self.visit(e.left) + self.visit(e.right)


class _Doubled(_Counter):
    def leaf(self, e) -> int:  # overrides by name, keeps the class's table
        return 2


def test_one_handler_per_class_and_overrides_by_name():
    a, b = ir.Var("a", "i64"), ir.Var("b", "i64")
    e = ir.Bin("+", a, ir.Bin("*", b, ir.Const(3, "i64")))
    assert _Counter().visit(e) == 5
    assert _Doubled().visit(e) == 8
    with pytest.raises(TypeError, match="nothing counts Neg"):
        _Counter().visit(ir.Neg(a))


def test_the_printers_and_code_generators_dispatch():
    x = ir.Var("x", "f64")
    e = ir.Select(ir.Cmp("<", x, ir.Const(0.0, "f64")), ir.Neg(x), x)
    assert expr(e) == "select((x < 0.0:f64), -x, x)"
    assert cgen._Emitter().expr(e) == "((x < 0.0) ? (-x) : x)"
    with pytest.raises(TypeError, match="no C for Special"):
        from ucf.ir.gpu_nodes import Special

        cgen._Emitter().expr(Special("threadIdx.x"))
