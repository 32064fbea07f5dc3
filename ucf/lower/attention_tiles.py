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

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var


def c(v: int) -> Const:
    """An int64 constant."""
    return Const(v, I64)


class Shape:
    """The parameters both kernels take, and the names derived from them."""

    def __init__(self, elem: str, gq: int, gk: int):
        self.elem, self.gq, self.gk = elem, gq, gk
        self.q, self.k, self.v = (ir.Array(x, elem) for x in ("Q", "K", "V"))
        self.pos, self.crd = ir.Array("pos", "i32"), ir.Array("crd", "i32")
        self.e = ir.Array("E", "u8")
        self.lq, self.lk = ir.Array("LQ", I64), ir.Array("LK", I64)
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
            ir.Param("LQ", I64, True, doc="each batch's valid queries (at most SQ)"),
            ir.Param("LK", I64, True, doc="each batch's valid keys (at most SK)"),
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

    def rows(self, b: ir.Expr, r0: ir.Expr) -> ir.Expr:
        """The valid rows of the query block at ``r0``: before its batch's length."""
        return ir.Bin("max", c(0), ir.minimum(c(self.gq), ir.sub(ir.Load(self.lq, b), r0)))

    def keys(self, b: ir.Expr, k0: ir.Expr) -> ir.Expr:
        """The valid keys of the tile at ``k0``."""
        return ir.Bin("max", c(0), ir.minimum(c(self.gk), ir.sub(ir.Load(self.lk, b), k0)))

    def tile(self, b: ir.Expr, p0: ir.Expr, t: ir.Expr, kb, k0, nk) -> list[ir.Stmt]:
        """Declarations of the ``t``-th live tile of a row of the index: its key block
        ``kb``, first key ``k0`` and valid keys ``nk``."""
        return [
            ir.Decl(kb, load_index(self.crd, ir.add(p0, t))),
            ir.Decl(k0, ir.mul(kb, c(self.gk))),
            ir.Decl(nk, self.keys(b, k0)),
        ]

    def live_tiles(self, end: ir.Expr, p0: ir.Expr, nr: ir.Expr) -> ir.Expr:
        """The index's tiles of a query block, none when it has no valid row."""
        return ir.Select(ir.Cmp(">", nr, c(0)), ir.sub(end, p0), c(0))

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
        no_elements = ir.Cmp("==", self.has_e, c(0))
        return ir.land(inside, ir.lor(no_elements, element))

    def whole(self, ebase: ir.Expr, r0: ir.Expr, nr: ir.Expr, k0: ir.Expr, nk: ir.Expr, tag: str):
        """Declarations of ``{tag}_whole`` (i1): the tile is ``gk`` keys wide and every
        element of its ``nr`` rows is live (no element mask, or one the tile fills, as a
        block-structured mask's live tiles all do), so the vector passes skip the mask.
        The mask's bytes are checked by a min-reduction the compilers vectorize."""
        r, kk = Var(f"{tag}_r", I64), Var(f"{tag}_kk", I64)
        least, ok = Var(f"{tag}_least", "i32"), Var(f"{tag}_whole", "i1")
        byte = ir.Load(
            self.e, ir.add(ebase, ir.add(ir.mul(ir.add(r0, r), self.sk), ir.add(k0, kk)))
        )
        step = ir.Bin(
            "min", least, ir.Cast(ir.Cmp("!=", ir.Cast(byte, "i32"), Const(0, "i32")), "i32")
        )
        check = [ir.For(r, c(0), nr, [ir.For(kk, c(0), c(self.gk), [ir.Assign(least, step)])])]
        return [
            ir.Decl(least, Const(1, "i32")),
            ir.If(ir.land(ir.Cmp("!=", self.has_e, c(0)), ir.Cmp("==", nk, c(self.gk))), check),
            ir.Decl(
                ok, ir.land(ir.Cmp("==", nk, c(self.gk)), ir.Cmp("!=", least, Const(0, "i32")))
            ),
        ]

    def pack(self, panel: ir.Array, src: ir.Array, base: ir.Expr, width: ir.Expr, k0, nk, tag: str):
        """``panel[f * gk + kk]`` = row ``k0 + kk`` of ``src`` (rows of ``width`` from
        ``base``), feature f: a tile's keys transposed, zeros past the last key."""
        f, kk = Var(f"{tag}_f", I64), Var(f"{tag}_kk", I64)
        value = ir.Select(
            ir.Cmp("<", kk, nk),
            ir.Load(src, ir.add(base, ir.add(ir.mul(ir.add(k0, kk), width), f))),
            self.zero,
        )
        store = ir.Store(panel, ir.add(ir.mul(f, c(self.gk)), kk), value)
        return [ir.For(f, c(0), width, [ir.For(kk, c(0), c(self.gk), [store])])]

    def function(
        self,
        name: str,
        doc: str,
        params: list[ir.Param],
        item: Var,
        items: ir.Expr,
        body: list[ir.Stmt],
        spaces: list[tuple[ir.Array, ir.Expr]],
        work: ir.Expr,
        threshold: int,
    ) -> ir.Function:
        """A kernel whose threads take ``items`` one at a time (their live tiles vary,
        so a static split would leave one thread the global rows), each thread with its
        own workspaces ``spaces``, in parallel when ``work`` reaches ``threshold``."""
        loop = ir.For(
            item,
            c(0),
            items,
            body,
            parallel="CPUThread",
            strategy="NoRaces",
            schedule=("dynamic", 1),
            prologue=[ir.Alloc(a, n) for a, n in spaces],
            epilogue=[ir.Free(a) for a, _ in spaces],
            parallel_if=ir.Cmp(">=", work, c(threshold)),
        )
        head = [ir.Decl(self.nqb, ir.Bin("/", ir.add(self.sq, c(self.gq - 1)), c(self.gq)))]
        return ir.Function(
            f"ucf_attention_{name}_{self.elem}_{self.gq}x{self.gk}",
            [*self.params(), *params],
            [*head, loop],
            doc=doc,
        )


def load_index(arr: ir.Array, at: ir.Expr) -> ir.Expr:
    """An entry of the tile index, as int64."""
    return ir.cast(ir.Load(arr, at), I64)
