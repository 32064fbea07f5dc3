"""The fused attention backward kernel (see ``ucf.lower.attention_tiles`` for the plan).

A batch and head per item: its key rows gather gradients from every query block, so
one thread owns them. Per query block and live tile it recomputes the scores and
the normalized weights, then adds ``A^T dO`` into ``dV``, ``(A (dO V^T - D)) K * s``
into ``dQ`` and its transpose times ``Q`` into ``dK``.
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lower import vector_exp
from ucf.lower.attention_tiles import Shape, c, load_index
from ucf.lower.tile_gemm import gemm

#: float32 lanes of the vector passes (max, exp), AVX2's.
VEC = vector_exp.LANES
HV = ir.Array("hv", "f32")  # a vector's lanes, for reductions across them


def _vectorized(elem: str, gk: int) -> bool:
    """Whether a tile's row is whole vectors the passes take eight lanes at a time."""
    return elem == "f32" and gk % VEC == 0


def _lanes_into(tag: str, acc: ir.Expr, combine: str, into: ir.Expr, assign) -> list[ir.Stmt]:
    """``acc``'s lanes combined (``max`` or ``+``) into the scalar ``into`` by ``assign``."""
    lane = Var(f"{tag}_lane", I64)
    value = ir.Bin(combine, ir.Load(HV, lane), into)
    return [ir.Store(HV, c(0), acc), ir.For(lane, c(0), c(VEC), [assign(value)])]


def _vector_exp(
    tag: str, arr: ir.Array, start: ir.Expr, count: ir.Expr, shift: ir.Expr, times=None
):
    """``arr[start + x] = exp(arr[start + x] - shift) (* times)`` for x < ``count`` (whole
    vectors), and the declarations of their sum (``{tag}_sum``)."""
    x, total = Var(f"{tag}_x", I64), Var(f"{tag}_sum", "f32")
    acc, p = Var(f"{tag}_acc", vector_exp.F32), Var(f"{tag}_p", vector_exp.F32)
    at = ir.add(start, ir.mul(x, c(VEC)))
    stmts, e = vector_exp.vexp(
        ir.Bin("-", ir.VLoad(arr, at, VEC), ir.Splat(shift, VEC)), f"{tag}_e"
    )
    value = e if times is None else ir.Bin("*", e, ir.Splat(times, VEC))
    body = [*stmts, ir.Decl(p, value), ir.Store(arr, at, p), ir.Assign(acc, ir.Bin("+", acc, p))]
    return [
        ir.Decl(acc, ir.Splat(Const(0.0, "f32"), VEC)),
        ir.For(x, c(0), ir.Bin("/", count, c(VEC)), body),
        ir.Decl(total, Const(0.0, "f32")),
        *_lanes_into(tag, acc, "+", total, lambda v: ir.Assign(total, v)),
    ]


def backward_function(elem: str, gq: int, gk: int, threshold: int) -> ir.Function:
    """``ucf_attention_bwd``: dQ, dK and dV from dO, the forward's O and each row's max
    and sum, over the tile index; a batch and head per item (see the module's
    docstring). Threads start when the items hold ``threshold`` multiply-adds."""
    s = Shape(elem, gq, gk)
    o, do, mx, sm = (ir.Array(x, elem) for x in ("O", "dO", "M", "L"))
    dq, dk, dv = (ir.Array(x, elem, output=True) for x in ("dQ", "dK", "dV"))
    vt, pw, dsw = ir.Array("vt", elem), ir.Array("pw", elem), ir.Array("dsw", elem)
    drow, mrow, irow = (ir.Array(x, elem) for x in ("drow", "mrow", "irow"))
    item, b, h, qb = (Var(x, I64) for x in ("item", "b", "h", "qb"))
    r0, nr, p0, cnt, t, trow = (Var(x, I64) for x in ("r0", "nr", "p0", "cnt", "c", "trow"))
    kb, k0, nk = (Var(x, I64) for x in ("kb", "k0", "nk"))
    names = ("qb0", "kb0", "vb0", "ob0", "eb0", "rb0")
    qbase, kbase, vbase, obase, ebase, rbase = (Var(x, I64) for x in names)
    r, kk, x = (Var(x, I64) for x in ("r", "kk", "x"))
    tot = Var("tot", elem)
    one = Const(1.0, elem)
    tile_at = ir.add(ir.mul(r, c(gk)), kk)

    def zero(arr: ir.Array, base: ir.Expr, size: ir.Expr) -> ir.Stmt:
        return ir.For(x, c(0), size, [ir.Store(arr, ir.add(base, x), s.zero)])

    o_at = ir.add(obase, ir.add(ir.mul(r, s.dv), x))
    rows = ir.For(
        r,
        c(0),
        nr,
        [
            ir.Decl(tot, s.zero),
            ir.For(
                x,
                c(0),
                s.dv,
                [
                    ir.Assign(
                        tot, ir.add_product(tot, ir.Bin("*", ir.Load(do, o_at), ir.Load(o, o_at)))
                    )
                ],
            ),
            ir.Store(drow, r, tot),
            ir.Store(mrow, r, ir.Load(mx, ir.add(rbase, r))),
            ir.Store(irow, r, ir.Bin("/", one, ir.Bin("max", ir.Load(sm, ir.add(rbase, r)), one))),
        ],
    )
    weight = ir.Select(
        ir.land(
            s.live(ebase, ir.add(r0, r), ir.add(k0, kk), kk, nk),
            ir.Cmp("!=", ir.Load(mrow, r), s.neg),
        ),
        ir.Bin(
            "*",
            ir.Math("exp", ir.sub(ir.Load(pw, tile_at), ir.Load(mrow, r))),
            ir.Load(irow, r),
        ),
        s.zero,
    )
    grad = ir.Bin(
        "*",
        ir.Bin("*", ir.Load(pw, tile_at), ir.sub(ir.Load(dsw, tile_at), ir.Load(drow, r))),
        s.scale,
    )

    def each(value_stmt: ir.Stmt) -> ir.Stmt:
        return ir.For(r, c(0), nr, [ir.For(kk, c(0), c(gk), [value_stmt])])

    # The normalized weights of the tile: exp(score - max) / max(sum, 1), 0 where dead;
    # a whole tile without an element mask, eight lanes at a time.
    weights = each(ir.Store(pw, tile_at, weight))
    if _vectorized(elem, gk):
        fast = Var("bw_whole", "i1")
        start = ir.mul(r, c(gk))
        row = _vector_exp("wt", pw, start, c(gk), ir.Load(mrow, r), ir.Load(irow, r))
        dead = ir.For(kk, c(0), c(gk), [ir.Store(pw, tile_at, s.zero)])
        per_row = ir.If(ir.Cmp("!=", ir.Load(mrow, r), s.neg), row, [dead])
        weights = ir.If(fast, [ir.For(r, c(0), nr, [per_row])], [weights])

    tile = [
        *s.tile(b, p0, t, kb, k0, nk),
        *(s.whole(ebase, r0, nr, k0, nk, "bw") if _vectorized(elem, gk) else []),
        *s.pack(s.kt, s.k, kbase, s.d, k0, nk, "pk"),
        *gemm(
            "qk",
            elem,
            nr,
            c(gk),
            s.d,
            (s.q, lambda row, t: ir.add(qbase, ir.add(ir.mul(row, s.d), t))),
            (s.kt, lambda t: ir.mul(t, c(gk))),
            (pw, lambda row: ir.mul(row, c(gk))),
            False,
            lambda row: s.scale,
        ),
        weights,
        *gemm(
            "dv",
            elem,
            nk,
            s.dv,
            nr,
            (pw, lambda key, row: ir.add(ir.mul(row, c(gk)), key)),
            (do, lambda row: ir.add(obase, ir.mul(row, s.dv))),
            (dv, lambda key: ir.add(vbase, ir.mul(ir.add(k0, key), s.dv))),
            True,
        ),
        *s.pack(vt, s.v, vbase, s.dv, k0, nk, "pv"),
        *gemm(
            "dp",
            elem,
            nr,
            c(gk),
            s.dv,
            (do, lambda row, t: ir.add(obase, ir.add(ir.mul(row, s.dv), t))),
            (vt, lambda t: ir.mul(t, c(gk))),
            (dsw, lambda row: ir.mul(row, c(gk))),
            False,
        ),
        each(ir.Store(dsw, tile_at, grad)),
        *gemm(
            "dq",
            elem,
            nr,
            s.d,
            nk,
            (dsw, lambda row, t: ir.add(ir.mul(row, c(gk)), t)),
            (s.k, lambda t: ir.add(kbase, ir.mul(ir.add(k0, t), s.d))),
            (dq, lambda row: ir.add(qbase, ir.mul(row, s.d))),
            True,
        ),
        *gemm(
            "dk",
            elem,
            nk,
            s.d,
            nr,
            (dsw, lambda key, row: ir.add(ir.mul(row, c(gk)), key)),
            (s.q, lambda row: ir.add(qbase, ir.mul(row, s.d))),
            (dk, lambda key: ir.add(kbase, ir.mul(ir.add(k0, key), s.d))),
            True,
        ),
    ]
    block = [
        ir.Decl(r0, ir.mul(qb, c(gq))),
        ir.Decl(nr, s.rows(b, r0)),
        ir.Decl(trow, s.tile_row(b, h, qb)),
        ir.Decl(p0, load_index(s.pos, trow)),
        ir.Decl(cnt, s.live_tiles(load_index(s.pos, ir.add(trow, c(1))), p0, nr)),
        ir.Decl(rbase, ir.add(ir.mul(item, s.sq), r0)),
        ir.Decl(qbase, ir.mul(rbase, s.d)),
        ir.Decl(obase, ir.mul(rbase, s.dv)),
        rows,
        ir.For(t, c(0), cnt, tile),
    ]
    body = [
        ir.Decl(h, ir.Bin("%", item, s.h)),
        ir.Decl(b, ir.Bin("/", item, s.h)),
        ir.Decl(kbase, ir.mul(ir.mul(item, s.sk), s.d)),
        ir.Decl(vbase, ir.mul(ir.mul(item, s.sk), s.dv)),
        ir.Decl(ebase, s.mask_base(b, h)),
        zero(dq, ir.mul(ir.mul(item, s.sq), s.d), ir.mul(s.sq, s.d)),
        zero(dk, kbase, ir.mul(s.sk, s.d)),
        zero(dv, vbase, ir.mul(s.sk, s.dv)),
        ir.For(qb, c(0), s.nqb, block),
    ]
    work = ir.mul(ir.mul(s.b, s.h), ir.mul(s.sq, s.d))
    spaces = [
        (s.kt, ir.mul(s.d, c(gk))),
        (vt, ir.mul(s.dv, c(gk))),
        (pw, c(gq * gk)),
        (dsw, c(gq * gk)),
        (drow, c(gq)),
        (mrow, c(gq)),
        (irow, c(gq)),
        (HV, c(VEC)),
    ]
    params = [
        ir.Param("O", elem, True, doc="the forward's output"),
        ir.Param("dO", elem, True, doc="the output's gradient"),
        ir.Param("M", elem, True, doc="each row's largest live score"),
        ir.Param("L", elem, True, doc="each row's sum of exp(score - max)"),
        ir.Param("dQ", elem, True, output=True),
        ir.Param("dK", elem, True, output=True),
        ir.Param("dV", elem, True, output=True),
    ]
    doc = f"the gradients of fused sparse attention over {gq} x {gk} tiles"
    items = ir.mul(s.b, s.h)
    return s.function("bwd", doc, params, item, items, body, spaces, work, threshold)
