"""The fused attention forward kernel (see ``ucf.lower.attention_tiles`` for the plan).

The scores of a block of ``gq`` query rows are kept transposed, a row per key and the
block's queries along it: ``S^T = K_tile Q_block^T`` puts the keys' rows of K (read in
place) against the block's queries packed once per item, and each query's running max
and sum are then a vector per eight queries (no reduction across lanes), the max and
exp passes run along whole vectors, and the product with V reads the weights of query
r at stride ``gq``.
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lower import vector_exp
from ucf.lower.attention_tiles import Shape, c, load_index
from ucf.lower.tile_gemm import gemm

VEC = vector_exp.LANES
#: Below any score: the shift of a row with no live key, so exp(-inf - shift) is 0.
_LOWEST = -3.0e38


def _vectorized(elem: str, gq: int) -> bool:
    """Whether the passes take a tile's queries eight lanes at a time."""
    return elem == "f32" and gq % VEC == 0


def forward_function(elem: str, gq: int, gk: int, threshold: int) -> ir.Function:
    """``ucf_attention_fwd``: O, and each row's max and sum, over the tile index. Threads
    start when the items hold ``threshold`` multiply-adds."""
    s = Shape(elem, gq, gk)
    o, mx, sm = (ir.Array(x, elem, output=True) for x in ("O", "M", "L"))
    sw, rm, rl, qt = (ir.Array(x, elem) for x in ("sw", "rm", "rl", "qt"))
    item, b, h, qb, bh = (Var(x, I64) for x in ("item", "b", "h", "qb", "bh"))
    r0, nr, p0, cnt, t = (Var(x, I64) for x in ("r0", "nr", "p0", "cnt", "c"))
    kb, k0, nk = (Var(x, I64) for x in ("kb", "k0", "nk"))
    names = ("qb0", "kb0", "vb0", "ob0", "eb0", "rb0")
    qbase, kbase, vbase, obase, ebase, rbase = (Var(x, I64) for x in names)
    r, kk, x, f = (Var(x, I64) for x in ("r", "kk", "x", "f"))
    p, tot = Var("p", elem), Var("tot", elem)
    vec = _vectorized(elem, gq)
    key_row = ir.add(ir.mul(t, c(gk)), kk)  # the key's row in the item's workspace
    at = ir.add(ir.mul(key_row, c(gq)), r)

    # Q's block transposed, once per item: qt[f * gq + r], zeros past the valid rows.
    pack = ir.For(
        f,
        c(0),
        s.d,
        [
            ir.For(
                r,
                c(0),
                c(gq),
                [
                    ir.Store(
                        qt,
                        ir.add(ir.mul(f, c(gq)), r),
                        ir.Select(
                            ir.Cmp("<", r, nr),
                            ir.Load(s.q, ir.add(qbase, ir.add(ir.mul(r, s.d), f))),
                            s.zero,
                        ),
                    )
                ],
            )
        ],
    )
    # Dead elements to -inf and the queries' maxima. Without dead elements (a whole
    # tile) the maxima take eight queries at a time.
    # (Queries past the valid rows become -inf too, so every lane of the exp pass
    # gets a score of at most its shift.)
    live = ir.land(ir.Cmp("<", r, nr), s.live(ebase, ir.add(r0, r), ir.add(k0, kk), kk, nk))
    masked = ir.Select(live, ir.Load(sw, at), s.neg)
    mask_pass: ir.Stmt = ir.For(
        kk,
        c(0),
        c(gk),
        [
            ir.For(
                r,
                c(0),
                c(gq),
                [
                    ir.Decl(p, masked),
                    ir.Store(sw, at, p),
                    ir.Store(rm, r, ir.Bin("max", p, ir.Load(rm, r))),
                ],
            )
        ],
    )
    if vec:
        acc = Var("mx_acc", vector_exp.F32)
        lanes = ir.mul(x, c(VEC))
        row = ir.add(ir.mul(key_row, c(gq)), lanes)
        vector_max = ir.For(
            x,
            c(0),
            c(gq // VEC),
            [
                ir.Decl(acc, ir.VLoad(rm, lanes, VEC)),
                ir.For(
                    kk, c(0), c(gk), [ir.Assign(acc, ir.Bin("max", acc, ir.VLoad(sw, row, VEC)))]
                ),
                ir.Store(rm, lanes, acc),
            ],
        )
        mask_pass = ir.If(Var("fw_whole", "i1"), [vector_max], [mask_pass])
    scores = [
        *s.tile(b, p0, t, kb, k0, nk),
        *(s.whole(ebase, r0, nr, k0, nk, "fw") if vec else []),
        *gemm(
            "qk",
            elem,
            nk,
            c(gq),
            s.d,
            (s.k, lambda key, d: ir.add(kbase, ir.add(ir.mul(ir.add(k0, key), s.d), d))),
            (qt, lambda d: ir.mul(d, c(gq))),
            (sw, lambda key: ir.mul(ir.add(ir.mul(t, c(gk)), key), c(gq))),
            False,
            lambda key: s.scale,
        ),
        # the tile's keys past the last valid one: no scores were computed there
        ir.For(kk, nk, c(gk), [ir.For(r, c(0), c(gq), [ir.Store(sw, at, s.neg)])]),
        mask_pass,
    ]
    # exp(score - max) and each query's sum, key row by key row.
    all_keys = ir.mul(cnt, c(gk))
    x_at = ir.add(ir.mul(x, c(gq)), r)
    exps: list[ir.Stmt] = [
        ir.For(
            r,
            c(0),
            nr,
            [
                ir.Decl(tot, ir.Bin("max", ir.Load(rm, r), Const(_LOWEST, elem))),
                ir.For(
                    x,
                    c(0),
                    all_keys,
                    [
                        ir.Decl(p, ir.Math("exp", ir.sub(ir.Load(sw, x_at), tot))),
                        ir.Store(sw, x_at, p),
                        ir.Store(rl, r, ir.add(ir.Load(rl, r), p)),
                    ],
                ),
            ],
        )
    ]
    if vec:
        lane = Var("ex_l", I64)
        start = ir.mul(lane, c(VEC))
        shift, total, pv = (Var(f"ex_{n}", vector_exp.F32) for n in ("shift", "total", "p"))
        where = ir.add(ir.mul(x, c(gq)), start)
        body, e = vector_exp.vexp(ir.Bin("-", ir.VLoad(sw, where, VEC), shift), "ex_e")
        exps = [
            ir.For(
                lane,
                c(0),
                c(gq // VEC),
                [
                    ir.Decl(
                        shift,
                        ir.Bin(
                            "max", ir.VLoad(rm, start, VEC), ir.Splat(Const(_LOWEST, elem), VEC)
                        ),
                    ),
                    ir.Decl(total, ir.Splat(s.zero, VEC)),
                    ir.For(
                        x,
                        c(0),
                        all_keys,
                        [
                            *body,
                            ir.Decl(pv, e),
                            ir.Store(sw, where, pv),
                            ir.Assign(total, ir.Bin("+", total, pv)),
                        ],
                    ),
                    ir.Store(rl, start, total),
                ],
            )
        ]
    values = [
        *s.tile(b, p0, t, kb, k0, nk),
        *gemm(
            "pv",
            elem,
            nr,
            s.dv,
            nk,
            (sw, lambda row, key: ir.add(ir.mul(ir.add(ir.mul(t, c(gk)), key), c(gq)), row)),
            (s.v, lambda key: ir.add(vbase, ir.mul(ir.add(k0, key), s.dv))),
            (o, lambda row: ir.add(obase, ir.mul(row, s.dv))),
            True,
        ),
    ]
    o_at = ir.add(obase, ir.add(ir.mul(r, s.dv), x))
    one = Const(1.0, elem)
    finish = ir.For(
        r,
        c(0),
        nr,
        [
            ir.Store(mx, ir.add(rbase, r), ir.Load(rm, r)),
            ir.Store(sm, ir.add(rbase, r), ir.Load(rl, r)),
            ir.Decl(tot, ir.Bin("/", one, ir.Bin("max", ir.Load(rl, r), one))),
            ir.For(x, c(0), s.dv, [ir.Store(o, o_at, ir.Bin("*", ir.Load(o, o_at), tot))]),
        ],
    )
    # The block's rows past its batch's length: 0, with no live key.
    padding = ir.For(
        r,
        nr,
        ir.minimum(c(gq), ir.sub(s.sq, r0)),
        [
            ir.For(x, c(0), s.dv, [ir.Store(o, o_at, s.zero)]),
            ir.Store(mx, ir.add(rbase, r), s.neg),
            ir.Store(sm, ir.add(rbase, r), s.zero),
        ],
    )
    body = [
        ir.Decl(bh, ir.Bin("/", item, s.nqb)),
        ir.Decl(qb, ir.Bin("%", item, s.nqb)),
        ir.Decl(h, ir.Bin("%", bh, s.h)),
        ir.Decl(b, ir.Bin("/", bh, s.h)),
        ir.Decl(r0, ir.mul(qb, c(gq))),
        ir.Decl(nr, s.rows(b, r0)),
        ir.Decl(p0, load_index(s.pos, s.tile_row(b, h, qb))),
        ir.Decl(cnt, s.live_tiles(load_index(s.pos, ir.add(s.tile_row(b, h, qb), c(1))), p0, nr)),
        ir.Decl(rbase, ir.add(ir.mul(bh, s.sq), r0)),
        ir.Decl(qbase, ir.mul(rbase, s.d)),
        ir.Decl(kbase, ir.mul(ir.mul(bh, s.sk), s.d)),
        ir.Decl(vbase, ir.mul(ir.mul(bh, s.sk), s.dv)),
        ir.Decl(obase, ir.mul(rbase, s.dv)),
        ir.Decl(ebase, s.mask_base(b, h)),
        ir.For(r, c(0), c(gq), [ir.Store(rm, r, s.neg), ir.Store(rl, r, s.zero)]),
        pack,
        ir.For(t, c(0), cnt, scores),
        *exps,
        ir.For(r, c(0), nr, [ir.For(x, c(0), s.dv, [ir.Store(o, o_at, s.zero)])]),
        ir.For(t, c(0), cnt, values),
        finish,
        padding,
    ]
    nkb = ir.Bin("/", ir.add(s.sk, c(gk - 1)), c(gk))
    spaces = [
        (qt, ir.mul(s.d, c(gq))),
        (sw, ir.mul(ir.mul(nkb, c(gk)), c(gq))),
        (rm, c(gq)),
        (rl, c(gq)),
    ]
    params = [
        ir.Param("O", elem, True, output=True, doc="the output (B, H, SQ, DV)"),
        ir.Param("M", elem, True, output=True, doc="each row's largest live score"),
        ir.Param("L", elem, True, output=True, doc="each row's sum of exp(score - max)"),
    ]
    doc = f"fused sparse attention over {gq} x {gk} tiles"
    items = ir.mul(ir.mul(s.b, s.h), s.nqb)
    work = ir.mul(ir.mul(s.b, s.h), ir.mul(s.sq, s.d))
    return s.function("fwd", doc, params, item, items, body, spaces, work, threshold)
