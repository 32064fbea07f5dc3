"""An ascending sort of distinct int64 coordinates, as an LLIR helper function.

A precompute workspace collects the coordinates a row touches in arrival
order; a compressed output needs them sorted.  Writing the sort in LLIR gives
both backends the same code with no runtime library.  It is most of what
Gustavson SpGEMM spends beyond scipy's (unsorted) product, so it picks by length:

- up to 16 keys, an insertion sort;
- else one pass finds the keys' range and whether they arrived sorted (a banded
  or block matrix's rows often do), which ends the work;
- up to 32 keys, each key goes to the rank the count of smaller keys gives (no
  branch to mispredict; the counting loop vectorizes);
- up to 512 keys, into 2n to 4n buckets by their top bits within the range, so
  an insertion sort afterwards meets only the few pairs that share a bucket
  (n to 2n buckets took a tenth fewer instructions on SpGEMM's 100-key rows but
  mispredicted a third more branches; ``bench/README.md``, issue 38);
- longer lists, or keys too bunched for the buckets, get an LSD radix sort on
  the range: a few counting passes over digits sized to the list.
"""

from __future__ import annotations

from collections.abc import Callable

from ucf.ir import nodes as ir
from ucf.ir.nodes import Array, Const, Var

#: A key's digit (or bucket), as an expression of the key.
Digit = Callable[[ir.Expr], ir.Expr]

NAME = "ucf_sort_i64"
_BUCKET_BITS = 10
BUCKETS = 1 << _BUCKET_BITS  # counters: the buckets, and the radix sort's digits (8 bits)
_I64 = "i64"
_INSERT = 16  # lists up to this long get the insertion sort
_SMALL = 32  # ... and up to this long the ranks
#: The bucketed insertion sort runs while the pairs of keys that share a bucket number at
#: most this many per key; beyond, the radix sort's few passes cost less.
INSERTION_PAIRS = 8


def _c(v: int) -> Const:
    return Const(v, _I64)


def _log2_floor(x: ir.Expr, out: Var) -> list[ir.Stmt]:
    """``out`` = the number of bits of x (x >= 0) minus one, so floor(log2 x) for x >= 1."""
    return [
        ir.Decl(out, _c(-1)),
        ir.While(
            ir.Cmp(">", ir.Bin(">>", x, ir.add(out, _c(1))), _c(0)),
            [ir.Assign(out, ir.add(out, _c(1)))],
        ),
    ]


def _counts(
    src: Array, cnt: Array, n: Var, nb: Var, digit: Digit, tag: str, pairs: Var | None = None
) -> list[ir.Stmt]:
    """cnt[d] = where the keys of src[0:n) with digit d start, once sorted on the digit
    (``nb`` values); ``pairs`` (if given) counts the pairs of keys that share a digit.

    The pairs are counted as keys arrive (each key pairs with those of its digit before
    it), not over the counters afterwards: a multiply per counter cost more than the
    rest of the prefix loop on a 100-key row with its 256 buckets."""
    b, e, q, run, c = (Var(f"{v}{tag}", _I64) for v in ("b", "e", "q", "run", "c"))
    prefix = [ir.Decl(c, ir.Load(cnt, e)), ir.Store(cnt, e, run), ir.Assign(run, ir.add(run, c))]
    if pairs is None:
        count = [ir.Store(cnt, digit(ir.Load(src, q)), _c(1), accumulate=True)]
    else:
        d, before = Var(f"d{tag}", _I64), Var(f"o{tag}", _I64)
        count = [
            ir.Decl(d, digit(ir.Load(src, q))),
            ir.Decl(before, ir.Load(cnt, d)),
            ir.Assign(pairs, ir.add(pairs, before)),
            ir.Store(cnt, d, ir.add(before, _c(1))),
        ]
    return [
        ir.For(b, _c(0), nb, [ir.Store(cnt, b, _c(0))]),
        ir.For(q, _c(0), n, count),
        ir.Decl(run, _c(0)),
        ir.For(e, _c(0), nb, prefix),
    ]


def _scatter(src: Array, dst: Array, cnt: Array, n: Var, digit: Digit, tag: str) -> list[ir.Stmt]:
    """Each key of src[0:n) to dst where ``_counts`` says its digit goes: a stable pass."""
    r, x = Var(f"r{tag}", _I64), Var(f"x{tag}", _I64)
    return [
        ir.For(
            r,
            _c(0),
            n,
            [
                ir.Decl(x, ir.Load(src, r)),
                ir.Store(dst, ir.Load(cnt, digit(x)), x),
                ir.Store(cnt, digit(x), _c(1), accumulate=True),
            ],
        )
    ]


def _radix_pass(
    src: Array,
    dst: Array,
    cnt: Array,
    n: Var,
    lo: Var,
    nb: Var,
    mask: Var,
    shift: ir.Expr,
    tag: str,
) -> list[ir.Stmt]:
    """One stable counting pass from src to dst on the digit ``((x - lo) >> shift) & mask``,
    which takes ``nb`` values."""

    def digit(v: ir.Expr) -> ir.Expr:
        return ir.Bin("&", ir.Bin(">>", ir.sub(v, lo), shift), mask)

    return [*_counts(src, cnt, n, nb, digit, tag), *_scatter(src, dst, cnt, n, digit, tag)]


def _radix(a: Array, tmp: Array, cnt: Array, n: Var, lo: Var, span: Var) -> list[ir.Stmt]:
    """Sort keys in [lo, lo + span] on ``key - lo``, with digits of about log2(n) bits (4..8):
    few passes, and counters no longer than the list, so short and long rows both pay
    about 3n per pass."""
    top, lg = Var("top", _I64), Var("lg", _I64)
    bits, passes, d, p = (Var(v, _I64) for v in ("bits", "passes", "d", "p"))
    nb, mask = Var("nb", _I64), Var("mask", _I64)
    q = Var("qc", _I64)
    return [
        *_log2_floor(span, top),
        ir.Decl(bits, ir.add(top, _c(1))),
        *_log2_floor(n, lg),
        ir.Assign(lg, ir.Bin("min", ir.Bin("max", lg, _c(4)), _c(8))),
        ir.Decl(passes, ir.Bin("/", ir.add(bits, ir.sub(lg, _c(1))), lg)),
        ir.Decl(d, ir.Bin("/", ir.add(bits, ir.sub(passes, _c(1))), ir.Bin("max", passes, _c(1)))),
        ir.Decl(nb, ir.Bin("<<", _c(1), d)),
        ir.Decl(mask, ir.sub(nb, _c(1))),
        ir.Decl(p, _c(0)),
        ir.While(
            ir.Cmp("<", p, passes),
            [
                *_radix_pass(a, tmp, cnt, n, lo, nb, mask, ir.mul(p, d), "u"),
                ir.Assign(p, ir.add(p, _c(1))),
                ir.If(
                    ir.Cmp("<", p, passes),
                    [
                        *_radix_pass(tmp, a, cnt, n, lo, nb, mask, ir.mul(p, d), "v"),
                        ir.Assign(p, ir.add(p, _c(1))),
                    ],
                    [ir.For(q, _c(0), n, [ir.Store(a, q, ir.Load(tmp, q))])],
                ),
            ],
        ),
    ]


def _insertion(dst: Array, src: Array, n: ir.Expr, tag: str) -> list[ir.Stmt]:
    """Insert src[0:n) one by one into dst[0:n) (the same array for an in-place sort):
    about n steps plus one per pair out of order."""
    k, j, x = Var(f"k{tag}", _I64), Var(f"j{tag}", _I64), Var(f"x{tag}", _I64)
    return [
        ir.For(
            k,
            _c(0),
            n,
            [
                ir.Decl(x, ir.Load(src, k)),
                ir.Decl(j, k),
                ir.While(
                    ir.land(ir.Cmp(">", j, _c(0)), ir.Cmp(">", ir.Load(dst, ir.sub(j, _c(1))), x)),
                    [
                        ir.Store(dst, j, ir.Load(dst, ir.sub(j, _c(1)))),
                        ir.Assign(j, ir.sub(j, _c(1))),
                    ],
                ),
                ir.Store(dst, j, x),
            ],
        )
    ]


def _bucketed(
    a: Array, tmp: Array, cnt: Array, n: Var, lo: Var, span: Var, done: Var
) -> list[ir.Stmt]:
    """One counting pass on the keys' top bits over their range [lo, lo + span], into 2n
    to 4n buckets; then an insertion sort meets only the pairs within a bucket out of
    order, and sets ``done``. When the buckets are so uneven that the keys sharing one
    make more than ``INSERTION_PAIRS`` pairs per key, it leaves them to the radix sort."""
    lg, nb, shift = Var("lgb", _I64), Var("nbb", _I64), Var("shift", _I64)
    pairs, used = Var("pairs", _I64), Var("used", _I64)

    def bucket(v: ir.Expr) -> ir.Expr:
        return ir.Bin(">>", ir.sub(v, lo), shift)

    return [
        *_log2_floor(n, lg),
        ir.Decl(nb, ir.Bin("<<", _c(1), ir.Bin("min", ir.add(lg, _c(2)), _c(_BUCKET_BITS)))),
        ir.Decl(shift, _c(0)),
        ir.While(
            ir.Cmp(">=", ir.Bin(">>", span, shift), nb), [ir.Assign(shift, ir.add(shift, _c(1)))]
        ),
        # The keys fill buckets 0 to span >> shift, a half to all of them: the counters
        # above are never touched, and zeroing and summing only these took a tenth off
        # the sort of SpGEMM's 100-key rows (span 100k, 194 of 256 buckets).
        ir.Decl(used, ir.add(ir.Bin(">>", span, shift), _c(1))),
        ir.Decl(pairs, _c(0)),
        *_counts(a, cnt, n, used, bucket, "b", pairs),
        ir.If(
            ir.Cmp("<=", pairs, ir.mul(n, _c(INSERTION_PAIRS))),
            [
                *_scatter(a, tmp, cnt, n, bucket, "b"),
                *_insertion(a, tmp, n, "s"),
                ir.Assign(done, _c(1)),
            ],
        ),
    ]


def _ranked(a: Array, tmp: Array, n: Var) -> list[ir.Stmt]:
    """Each key goes where the count of smaller keys says (the keys are distinct): n * n
    comparisons, but no branch to mispredict and an inner loop that vectorizes, so it beats
    an insertion sort on short lists."""
    r, j, x, rank, q = (Var(v, _I64) for v in ("r", "jr", "xr", "rank", "qr"))
    smaller = ir.Select(ir.Cmp("<", ir.Load(a, j), x), _c(1), _c(0))
    return [
        ir.For(
            r,
            _c(0),
            n,
            [
                ir.Decl(x, ir.Load(a, r)),
                ir.Decl(rank, _c(0)),
                ir.For(j, _c(0), n, [ir.Assign(rank, ir.add(rank, smaller))]),
                ir.Store(tmp, rank, x),
            ],
        ),
        ir.For(q, _c(0), n, [ir.Store(a, q, ir.Load(tmp, q))]),
    ]


def sort_function() -> ir.Function:
    a = Array("a", _I64, True)
    tmp = Array("tmp", _I64, True)
    cnt = Array("cnt", _I64, True)
    n = Var("n", _I64)
    k, x, lo, hi, desc = (Var(v, _I64) for v in ("k", "x", "lo", "hi", "desc"))
    span, done = Var("span", _I64), Var("done", _I64)
    before = ir.Select(ir.Cmp(">", ir.Load(a, ir.sub(k, _c(1))), x), _c(1), _c(0))
    # One look at the keys: their range, and whether they arrived in order already (a
    # banded or block matrix's rows often do), which needs nothing more.
    survey = [
        ir.Decl(lo, ir.Load(a, _c(0))),
        ir.Decl(hi, lo),
        ir.Decl(desc, _c(0)),
        ir.For(
            k,
            _c(1),
            n,
            [
                ir.Decl(x, ir.Load(a, k)),
                ir.Assign(desc, ir.add(desc, before)),
                ir.Assign(lo, ir.Bin("min", lo, x)),
                ir.Assign(hi, ir.Bin("max", hi, x)),
            ],
        ),
        ir.Decl(span, ir.sub(hi, lo)),
        ir.If(
            ir.Cmp(">", desc, _c(0)),
            [
                ir.If(
                    ir.Cmp("<=", n, _c(_SMALL)),
                    _ranked(a, tmp, n),
                    [
                        ir.Decl(done, _c(0)),
                        ir.If(
                            ir.Cmp("<=", n, _c(BUCKETS // 2)),
                            _bucketed(a, tmp, cnt, n, lo, span, done),
                        ),
                        ir.If(ir.Cmp("==", done, _c(0)), _radix(a, tmp, cnt, n, lo, span)),
                    ],
                )
            ],
        ),
    ]
    params = [
        ir.Param("a", _I64, True, True, doc="distinct coordinates to sort in place"),
        ir.Param("n", _I64, False, doc="how many"),
        ir.Param("tmp", _I64, True, True, doc="scratch of n or more entries"),
        ir.Param("cnt", _I64, True, True, doc=f"scratch of {BUCKETS} entries"),
    ]
    body = [ir.If(ir.Cmp("<=", n, _c(_INSERT)), _insertion(a, a, n, "i"), survey)]
    return ir.Function(NAME, params, body, doc="Sort a[0:n) ascending.", internal=True)
