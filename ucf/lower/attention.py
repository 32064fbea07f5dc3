"""Fused sparse attention kernels for the CPU targets: flash attention's fusion of the
three attention statements (``ucf.nn.attention_statements``) per block of query rows,
over the live tiles an STile index lists.

For each batch, head and block of ``gq`` query rows (an *item*; threads take one at a
time, since their live tiles vary), the forward kernel

1. computes the scores of each live tile of ``gq`` rows by ``gk`` keys into a
   workspace, the row's tiles side by side (``Q`` rows times a packed panel of the
   tile's keys: a register tile of 4 rows by 2 vectors), times the scale, with every
   element the mask leaves dead set to -inf (the statements' SDDMM into the mask's
   pattern), keeping each row's max;
2. turns the row's scores into ``exp(s - max)`` and sums them (the row softmax over the
   live entries; a row with no live key keeps max = -inf and sum 0);
3. adds the products of those weights with the rows of ``V`` the tiles name into the
   block's rows of ``O`` (register tiles again), and divides each row by
   ``max(sum, 1)``: a row with no live key is 0.

It stores each row's max and sum for the backward kernel, which takes a batch and head
at a time (its key rows gather from every query block): per block of query rows it
recomputes the weights of each live tile, adds their products into ``dV`` and the
gradient of the scores into ``dQ`` and ``dK`` (``dS = A (dO V^T - D)`` with ``A`` the
normalized weights and ``D`` the row sums of ``dO * O``), the products through the
same register tiles. Results agree with the statements to rounding: the sums run in
another order.
"""

from __future__ import annotations

from collections.abc import Callable

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var

#: Rows of a register tile, and vectors (of 32 bytes, AVX2's) per row: 8 accumulators,
#: 2 vectors of the right-hand panel and a broadcast fit 16 vector registers.
ROWS = 4
VECTORS = 2
_SIZES = {"f32": 4, "f64": 8}


def _c(v: int) -> Const:
    return Const(v, I64)


def lanes(elem: str) -> int:
    return 32 // _SIZES[elem]


Index = Callable[[ir.Expr], ir.Expr]


def gemm(
    tag: str,
    elem: str,
    m: ir.Expr,
    n: ir.Expr,
    depth: ir.Expr,
    a: tuple[ir.Array, Callable[[ir.Expr, ir.Expr], ir.Expr]],
    b: tuple[ir.Array, Index],
    c: tuple[ir.Array, Index],
    accumulate: bool,
    row_scale: Callable[[ir.Expr], ir.Expr] | None = None,
) -> list[ir.Stmt]:
    """``C[r, 0:n] (+)= sum over t < depth of A(r, t) * B[t, 0:n]`` for rows r < m, where
    ``a`` gives A's array and the index of element (r, t), ``b`` where row t of B
    starts and ``c`` where row r of C does (rows contiguous). Register tiles of ``ROWS``
    rows by ``VECTORS`` vectors hold C across the whole depth (a broadcast of A's
    element and a multiply-add per vector per t); rows past the last group of
    ``ROWS`` take one-row tiles, columns past the last whole tile a scalar loop.
    ``row_scale(r)``, if given, multiplies row r's sums before they are stored."""
    w = lanes(elem)
    width = VECTORS * w
    vec = ir.vector(elem, w)
    a_arr, a_at = a
    b_arr, b_at = b
    c_arr, c_at = c
    t, g, r1, pn, col = (Var(f"{tag}_{x}", I64) for x in ("t", "g", "r", "pn", "col"))
    panels, groups = Var(f"{tag}_panels", I64), Var(f"{tag}_groups", I64)

    def micro(rows: int, first: ir.Expr, prefix: str) -> list[ir.Stmt]:
        acc = {
            (r, x): Var(f"{tag}{prefix}_acc{r}_{x}", vec)
            for r in range(rows)
            for x in range(VECTORS)
        }
        at = {
            (r, x): ir.add(ir.add(c_at(ir.add(first, _c(r))), ir.mul(pn, _c(width))), _c(x * w))
            for r, x in acc
        }
        zero = ir.Splat(Const(0.0, elem), w)
        head = [
            ir.Decl(v, ir.VLoad(c_arr, at[k], w) if accumulate else zero) for k, v in acc.items()
        ]
        bv = [Var(f"{tag}{prefix}_b{x}", vec) for x in range(VECTORS)]
        row_b = ir.add(b_at(t), ir.mul(pn, _c(width)))
        body: list[ir.Stmt] = [
            ir.Decl(y, ir.VLoad(b_arr, ir.add(row_b, _c(x * w)), w)) for x, y in enumerate(bv)
        ]
        for r in range(rows):
            s = Var(f"{tag}{prefix}_a{r}", vec)
            body.append(ir.Decl(s, ir.Splat(ir.Load(a_arr, a_at(ir.add(first, _c(r)), t)), w)))
            for x in range(VECTORS):
                body.append(ir.Assign(acc[r, x], ir.add_product(acc[r, x], ir.Bin("*", s, bv[x]))))
        tail: list[ir.Stmt] = []
        for (r, _x), v in acc.items():
            value: ir.Expr = v
            if row_scale is not None:
                value = ir.Bin("*", v, ir.Splat(row_scale(ir.add(first, _c(r))), w))
            tail.append(ir.Store(c_arr, at[r, _x], value))
        return [ir.For(pn, _c(0), panels, [*head, ir.For(t, _c(0), depth, body), *tail])]

    total = Var(f"{tag}_sum", elem)
    c_here = ir.add(c_at(r1), col)
    start = ir.Load(c_arr, c_here) if accumulate else Const(0.0, elem)
    term = ir.Bin("*", ir.Load(a_arr, a_at(r1, t)), ir.Load(b_arr, ir.add(b_at(t), col)))
    result: ir.Expr = total if row_scale is None else ir.Bin("*", total, row_scale(r1))
    scalar = ir.For(
        r1,
        _c(0),
        m,
        [
            ir.For(
                col,
                ir.mul(panels, _c(width)),
                n,
                [
                    ir.Decl(total, start),
                    ir.For(t, _c(0), depth, [ir.Assign(total, ir.add_product(total, term))]),
                    ir.Store(c_arr, c_here, result),
                ],
            )
        ],
    )
    return [
        ir.Decl(panels, ir.Bin("/", n, _c(width))),
        ir.Decl(groups, ir.Bin("/", m, _c(ROWS))),
        ir.For(g, _c(0), groups, micro(ROWS, ir.mul(g, _c(ROWS)), "g")),
        ir.For(r1, ir.mul(groups, _c(ROWS)), m, micro(1, r1, "s")),
        scalar,
    ]


class _Shape:
    """The parameters both kernels take, and the names derived from them."""

    def __init__(self, elem: str, gq: int, gk: int):
        self.elem, self.gq, self.gk = elem, gq, gk
        self.q, self.k, self.v = (ir.Array(x, elem) for x in ("Q", "K", "V"))
        self.pos, self.crd = ir.Array("pos", "i32"), ir.Array("crd", "i32")
        self.e = ir.Array("E", "u8")
        names = ("B", "H", "SQ", "SK", "D", "DV", "MB", "MH", "HM", "HAS_E")
        for x in names:
            setattr(self, x.lower(), Var(x, I64))
        self.scale = Var("scale", elem)
        self.nqb = Var("NQB", I64)
        self.kt = ir.Array("kt", elem)
        self.neg = Const(float("-inf"), elem)
        self.zero = Const(0.0, elem)

    def params(self) -> list[ir.Param]:
        return [
            ir.Param("Q", self.elem, True, doc="queries (B, H, SQ, D)"),
            ir.Param("K", self.elem, True, doc="keys (B, H, SK, D)"),
            ir.Param("V", self.elem, True, doc="values (B, H, SK, DV)"),
            ir.Param("pos", "i32", True, doc="the tile index's segments, a row per query block"),
            ir.Param("crd", "i32", True, doc="the live key blocks of each row"),
            ir.Param("E", "u8", True, doc="the mask's elements (MB, HM, SQ, SK) if HAS_E"),
            *(
                ir.Param(x, I64, False)
                for x in ("B", "H", "SQ", "SK", "D", "DV", "MB", "MH", "HM", "HAS_E")
            ),
            ir.Param("scale", self.elem, False),
        ]

    def tile_row(self, b: ir.Expr, h: ir.Expr, qb: ir.Expr) -> ir.Expr:
        """The index row of query block ``qb`` of batch ``b``, head ``h``."""
        head = ir.add(ir.mul(ir.mul(b, self.mb), self.hm), ir.mul(h, self.mh))
        return ir.add(ir.mul(head, self.nqb), qb)

    def mask_base(self, b: ir.Expr, h: ir.Expr) -> ir.Expr:
        head = ir.add(ir.mul(ir.mul(b, self.mb), self.hm), ir.mul(h, self.mh))
        return ir.mul(ir.mul(head, self.sq), self.sk)

    def live(self, ebase: ir.Expr, row: ir.Expr, col: ir.Expr, kk: ir.Expr, nk: ir.Expr):
        """Whether key ``col`` (the ``kk``-th of a tile of ``nk``) is live for query ``row``."""
        inside = ir.Cmp("<", kk, nk)
        element = ir.Cmp(
            "!=",
            ir.Cast(ir.Load(self.e, ir.add(ebase, ir.add(ir.mul(row, self.sk), col))), "i32"),
            Const(0, "i32"),
        )
        no_elements = ir.Cmp("==", self.has_e, _c(0))
        return ir.land(inside, ir.lor(no_elements, element))

    def pack(self, panel: ir.Array, src: ir.Array, base: ir.Expr, width: ir.Expr, k0, nk, tag: str):
        """``panel[f * gk + kk]`` = row ``k0 + kk`` of ``src`` (rows of ``width`` from
        ``base``), feature f: a tile's keys transposed, zeros past the last key."""
        f, kk = Var(f"{tag}_f", I64), Var(f"{tag}_kk", I64)
        value = ir.Select(
            ir.Cmp("<", kk, nk),
            ir.Load(src, ir.add(base, ir.add(ir.mul(ir.add(k0, kk), width), f))),
            self.zero,
        )
        store = ir.Store(panel, ir.add(ir.mul(f, _c(self.gk)), kk), value)
        return [ir.For(f, _c(0), width, [ir.For(kk, _c(0), _c(self.gk), [store])])]


def _i(arr: ir.Array, at: ir.Expr) -> ir.Expr:
    return ir.cast(ir.Load(arr, at), I64)


def forward_function(elem: str, gq: int, gk: int, threshold: int) -> ir.Function:
    """``ucf_attention_fwd``: O, and each row's max and sum, over the tile index; see the
    module's docstring. Threads start when the items hold ``threshold`` multiply-adds."""
    s = _Shape(elem, gq, gk)
    o, mx, sm = (ir.Array(x, elem, output=True) for x in ("O", "M", "L"))
    sw, rm, rl = ir.Array("sw", elem), ir.Array("rm", elem), ir.Array("rl", elem)
    item, b, h, qb, bh = (Var(x, I64) for x in ("item", "b", "h", "qb", "bh"))
    r0, nr, p0, cnt, c = (Var(x, I64) for x in ("r0", "nr", "p0", "cnt", "c"))
    kb, k0, nk, wd = (Var(x, I64) for x in ("kb", "k0", "nk", "W"))
    qbase, kbase, vbase, obase, ebase = (Var(x, I64) for x in ("qb0", "kb0", "vb0", "ob0", "eb0"))
    rbase = Var("rb0", I64)
    r, kk, x, mr, tot, p = (
        Var(x, ty)
        for x, ty in (("r", I64), ("kk", I64), ("x", I64), ("mr", elem), ("tot", elem), ("p", elem))
    )
    at = ir.add(ir.add(ir.mul(r, wd), ir.mul(c, _c(gk))), kk)

    scores = [
        ir.Decl(kb, _i(s.crd, ir.add(p0, c))),
        ir.Decl(k0, ir.mul(kb, _c(gk))),
        ir.Decl(nk, ir.minimum(_c(gk), ir.sub(s.sk, k0))),
        *s.pack(s.kt, s.k, kbase, s.d, k0, nk, "pk"),
        *gemm(
            "qk",
            elem,
            nr,
            _c(gk),
            s.d,
            (s.q, lambda row, t: ir.add(qbase, ir.add(ir.mul(row, s.d), t))),
            (s.kt, lambda t: ir.mul(t, _c(gk))),
            (sw, lambda row: ir.add(ir.mul(row, wd), ir.mul(c, _c(gk)))),
            False,
            lambda row: s.scale,
        ),
        ir.For(
            r,
            _c(0),
            nr,
            [
                ir.For(
                    kk,
                    _c(0),
                    _c(gk),
                    [
                        ir.Decl(
                            p,
                            ir.Select(
                                s.live(ebase, ir.add(r0, r), ir.add(k0, kk), kk, nk),
                                ir.Load(sw, at),
                                s.neg,
                            ),
                        ),
                        ir.Store(sw, at, p),
                        ir.Store(rm, r, ir.Bin("max", p, ir.Load(rm, r))),
                    ],
                )
            ],
        ),
    ]
    row_at = ir.add(ir.mul(r, wd), x)
    softmax = ir.For(
        r,
        _c(0),
        nr,
        [
            ir.Decl(mr, ir.Load(rm, r)),
            ir.Decl(tot, s.zero),
            ir.If(
                ir.Cmp("!=", mr, s.neg),
                [
                    ir.For(
                        x,
                        _c(0),
                        ir.mul(cnt, _c(gk)),
                        [
                            ir.Decl(p, ir.Math("exp", ir.sub(ir.Load(sw, row_at), mr))),
                            ir.Store(sw, row_at, p),
                            ir.Assign(tot, ir.add(tot, p)),
                        ],
                    )
                ],
                # no live key: weights of 0 (the scores are all -inf)
                [ir.For(x, _c(0), ir.mul(cnt, _c(gk)), [ir.Store(sw, row_at, s.zero)])],
            ),
            ir.Store(rl, r, tot),
            ir.Store(mx, ir.add(rbase, r), mr),
            ir.Store(sm, ir.add(rbase, r), tot),
        ],
    )
    values = [
        ir.Decl(kb, _i(s.crd, ir.add(p0, c))),
        ir.Decl(k0, ir.mul(kb, _c(gk))),
        ir.Decl(nk, ir.minimum(_c(gk), ir.sub(s.sk, k0))),
        *gemm(
            "pv",
            elem,
            nr,
            s.dv,
            nk,
            (sw, lambda row, t: ir.add(ir.add(ir.mul(row, wd), ir.mul(c, _c(gk))), t)),
            (s.v, lambda t: ir.add(vbase, ir.mul(ir.add(k0, t), s.dv))),
            (o, lambda row: ir.add(obase, ir.mul(row, s.dv))),
            True,
        ),
    ]
    o_at = ir.add(obase, ir.add(ir.mul(r, s.dv), x))
    one = Const(1.0, elem)
    normalize = ir.For(
        r,
        _c(0),
        nr,
        [
            ir.Decl(tot, ir.Bin("/", one, ir.Bin("max", ir.Load(rl, r), one))),
            ir.For(x, _c(0), s.dv, [ir.Store(o, o_at, ir.Bin("*", ir.Load(o, o_at), tot))]),
        ],
    )
    body = [
        ir.Decl(bh, ir.Bin("/", item, s.nqb)),
        ir.Decl(qb, ir.Bin("%", item, s.nqb)),
        ir.Decl(h, ir.Bin("%", bh, s.h)),
        ir.Decl(b, ir.Bin("/", bh, s.h)),
        ir.Decl(r0, ir.mul(qb, _c(gq))),
        ir.Decl(nr, ir.minimum(_c(gq), ir.sub(s.sq, r0))),
        ir.Decl(p0, _i(s.pos, s.tile_row(b, h, qb))),
        ir.Decl(cnt, ir.sub(_i(s.pos, ir.add(s.tile_row(b, h, qb), _c(1))), p0)),
        ir.Decl(qbase, ir.mul(ir.add(ir.mul(bh, s.sq), r0), s.d)),
        ir.Decl(kbase, ir.mul(ir.mul(bh, s.sk), s.d)),
        ir.Decl(vbase, ir.mul(ir.mul(bh, s.sk), s.dv)),
        ir.Decl(rbase, ir.add(ir.mul(bh, s.sq), r0)),
        ir.Decl(obase, ir.mul(rbase, s.dv)),
        ir.Decl(ebase, s.mask_base(b, h)),
        ir.For(r, _c(0), _c(gq), [ir.Store(rm, r, s.neg)]),
        ir.For(c, _c(0), cnt, scores),
        softmax,
        ir.For(r, _c(0), nr, [ir.For(x, _c(0), s.dv, [ir.Store(o, o_at, s.zero)])]),
        ir.For(c, _c(0), cnt, values),
        normalize,
    ]
    items = ir.mul(ir.mul(s.b, s.h), s.nqb)
    work = ir.mul(ir.mul(s.b, s.h), ir.mul(s.sq, s.d))
    loop = ir.For(
        item,
        _c(0),
        items,
        body,
        parallel="CPUThread",
        strategy="NoRaces",
        schedule=("dynamic", 1),
        prologue=[
            ir.Alloc(s.kt, ir.mul(s.d, _c(gk))),
            ir.Alloc(sw, ir.mul(_c(gq), wd)),
            ir.Alloc(rm, _c(gq)),
            ir.Alloc(rl, _c(gq)),
        ],
        epilogue=[ir.Free(a) for a in (s.kt, sw, rm, rl)],
        parallel_if=ir.Cmp(">=", work, _c(threshold)),
    )
    params = [
        *s.params(),
        ir.Param("O", elem, True, output=True, doc="the output (B, H, SQ, DV)"),
        ir.Param("M", elem, True, output=True, doc="each row's largest live score"),
        ir.Param("L", elem, True, output=True, doc="each row's sum of exp(score - max)"),
    ]
    nkb = ir.Bin("/", ir.add(s.sk, _c(gk - 1)), _c(gk))
    head = [
        ir.Decl(s.nqb, ir.Bin("/", ir.add(s.sq, _c(gq - 1)), _c(gq))),
        ir.Decl(wd, ir.mul(nkb, _c(gk))),
    ]
    doc = f"fused sparse attention over {gq} x {gk} tiles"
    return ir.Function(f"ucf_attention_fwd_{elem}_{gq}x{gk}", params, [*head, loop], doc=doc)


def backward_function(elem: str, gq: int, gk: int, threshold: int) -> ir.Function:
    """``ucf_attention_bwd``: dQ, dK and dV from dO, the forward's O and each row's max
    and sum, over the tile index; a batch and head per item (see the module's
    docstring). Threads start when the items hold ``threshold`` multiply-adds."""
    s = _Shape(elem, gq, gk)
    o, do, mx, sm = (ir.Array(x, elem) for x in ("O", "dO", "M", "L"))
    dq, dk, dv = (ir.Array(x, elem, output=True) for x in ("dQ", "dK", "dV"))
    vt, pw, dsw = ir.Array("vt", elem), ir.Array("pw", elem), ir.Array("dsw", elem)
    drow, mrow, irow = (ir.Array(x, elem) for x in ("drow", "mrow", "irow"))
    item, b, h, qb = (Var(x, I64) for x in ("item", "b", "h", "qb"))
    r0, nr, p0, cnt, c, trow = (Var(x, I64) for x in ("r0", "nr", "p0", "cnt", "c", "trow"))
    kb, k0, nk = (Var(x, I64) for x in ("kb", "k0", "nk"))
    names = ("qb0", "kb0", "vb0", "ob0", "eb0", "rb0")
    qbase, kbase, vbase, obase, ebase, rbase = (Var(x, I64) for x in names)
    r, kk, x = (Var(x, I64) for x in ("r", "kk", "x"))
    tot = Var("tot", elem)
    one = Const(1.0, elem)
    tile_at = ir.add(ir.mul(r, _c(gk)), kk)

    def zero(arr: ir.Array, base: ir.Expr, size: ir.Expr) -> ir.Stmt:
        return ir.For(x, _c(0), size, [ir.Store(arr, ir.add(base, x), s.zero)])

    o_at = ir.add(obase, ir.add(ir.mul(r, s.dv), x))
    rows = ir.For(
        r,
        _c(0),
        nr,
        [
            ir.Decl(tot, s.zero),
            ir.For(
                x,
                _c(0),
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
        return ir.For(r, _c(0), nr, [ir.For(kk, _c(0), _c(gk), [value_stmt])])

    tile = [
        ir.Decl(kb, _i(s.crd, ir.add(p0, c))),
        ir.Decl(k0, ir.mul(kb, _c(gk))),
        ir.Decl(nk, ir.minimum(_c(gk), ir.sub(s.sk, k0))),
        *s.pack(s.kt, s.k, kbase, s.d, k0, nk, "pk"),
        *gemm(
            "qk",
            elem,
            nr,
            _c(gk),
            s.d,
            (s.q, lambda row, t: ir.add(qbase, ir.add(ir.mul(row, s.d), t))),
            (s.kt, lambda t: ir.mul(t, _c(gk))),
            (pw, lambda row: ir.mul(row, _c(gk))),
            False,
            lambda row: s.scale,
        ),
        each(ir.Store(pw, tile_at, weight)),
        *gemm(
            "dv",
            elem,
            nk,
            s.dv,
            nr,
            (pw, lambda key, row: ir.add(ir.mul(row, _c(gk)), key)),
            (do, lambda row: ir.add(obase, ir.mul(row, s.dv))),
            (dv, lambda key: ir.add(vbase, ir.mul(ir.add(k0, key), s.dv))),
            True,
        ),
        *s.pack(vt, s.v, vbase, s.dv, k0, nk, "pv"),
        *gemm(
            "dp",
            elem,
            nr,
            _c(gk),
            s.dv,
            (do, lambda row, t: ir.add(obase, ir.add(ir.mul(row, s.dv), t))),
            (vt, lambda t: ir.mul(t, _c(gk))),
            (dsw, lambda row: ir.mul(row, _c(gk))),
            False,
        ),
        each(ir.Store(dsw, tile_at, grad)),
        *gemm(
            "dq",
            elem,
            nr,
            s.d,
            nk,
            (dsw, lambda row, t: ir.add(ir.mul(row, _c(gk)), t)),
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
            (dsw, lambda key, row: ir.add(ir.mul(row, _c(gk)), key)),
            (s.q, lambda row: ir.add(qbase, ir.mul(row, s.d))),
            (dk, lambda key: ir.add(kbase, ir.mul(ir.add(k0, key), s.d))),
            True,
        ),
    ]
    block = [
        ir.Decl(r0, ir.mul(qb, _c(gq))),
        ir.Decl(nr, ir.minimum(_c(gq), ir.sub(s.sq, r0))),
        ir.Decl(trow, s.tile_row(b, h, qb)),
        ir.Decl(p0, _i(s.pos, trow)),
        ir.Decl(cnt, ir.sub(_i(s.pos, ir.add(trow, _c(1))), p0)),
        ir.Decl(rbase, ir.add(ir.mul(item, s.sq), r0)),
        ir.Decl(qbase, ir.mul(rbase, s.d)),
        ir.Decl(obase, ir.mul(rbase, s.dv)),
        rows,
        ir.For(c, _c(0), cnt, tile),
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
        ir.For(qb, _c(0), s.nqb, block),
    ]
    work = ir.mul(ir.mul(s.b, s.h), ir.mul(s.sq, s.d))
    spaces = [
        (s.kt, ir.mul(s.d, _c(gk))),
        (vt, ir.mul(s.dv, _c(gk))),
        (pw, _c(gq * gk)),
        (dsw, _c(gq * gk)),
        (drow, _c(gq)),
        (mrow, _c(gq)),
        (irow, _c(gq)),
    ]
    loop = ir.For(
        item,
        _c(0),
        ir.mul(s.b, s.h),
        body,
        parallel="CPUThread",
        strategy="NoRaces",
        schedule=("dynamic", 1),
        prologue=[ir.Alloc(a, n) for a, n in spaces],
        epilogue=[ir.Free(a) for a, _ in spaces],
        parallel_if=ir.Cmp(">=", work, _c(threshold)),
    )
    params = [
        *s.params(),
        ir.Param("O", elem, True, doc="the forward's output"),
        ir.Param("dO", elem, True, doc="the output's gradient"),
        ir.Param("M", elem, True, doc="each row's largest live score"),
        ir.Param("L", elem, True, doc="each row's sum of exp(score - max)"),
        ir.Param("dQ", elem, True, output=True),
        ir.Param("dK", elem, True, output=True),
        ir.Param("dV", elem, True, output=True),
    ]
    head = [ir.Decl(s.nqb, ir.Bin("/", ir.add(s.sq, _c(gq - 1)), _c(gq)))]
    doc = f"the gradients of fused sparse attention over {gq} x {gk} tiles"
    return ir.Function(f"ucf_attention_bwd_{elem}_{gq}x{gk}", params, [*head, loop], doc=doc)
