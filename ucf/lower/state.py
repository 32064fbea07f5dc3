"""The lowerer's environment: operands, their parameters, and where each walk has got to."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Array, Const, Var
from ucf.lang.affine import Affine
from ucf.lower import sort
from ucf.lower.lattice import (
    Term,
)


@dataclass
class SlotParams:
    """The parameters through which one operand storage reaches the kernel."""

    dims: list[Var]
    levels: list[dict[str, Array]]
    vals: Array
    scale: Array | None = None  # quantized values: one scale per group (float32)
    zero: Array | None = None  # and one zero point (int32)


@dataclass
class Operand:
    n: int
    name: str  # readable prefix for this occurrence's iterator variables
    fmt: Format
    level_vars: list[str]  # the loop each level is resolved at (an affine index's base)
    params: SlotParams
    level_idx: list[Affine]  # each level's index

    def affine(self, lvl: int) -> bool:
        return self.level_idx[lvl].single_variable is None

    def dim(self, lvl: int) -> Var:
        return self.params.dims[self.fmt.mode_order[lvl]]

    @property
    def dense(self) -> bool:
        return self.fmt.is_dense


@dataclass
class State:
    """Where each operand's and the output's walk down its levels has got to."""

    depth: int = 0
    levels: dict = field(default_factory=dict)  # operand -> levels resolved
    pos: dict = field(default_factory=dict)  # operand -> position expr of last resolved level
    seg_end: dict = field(default_factory=dict)  # operand -> end of a non-unique run
    out_level: int = 0
    out_pos: ir.Expr = Const(0, I64)
    acc: Var | None = None
    pending: tuple | None = (
        None  # (level, coordinate) of an output append deferred past a reduction
    )
    hit: Var | None = None  # set when the deferred reduction met a nonzero term
    order: tuple[str, ...] = ()  # the loop order of this nest (a where's sides differ)
    ws: Workspace | None = None  # set in a precompute's producer: the leaf writes here
    # The sides of precomputes' wheres this walk is inside, outermost first: (where, side)
    scope: tuple = ()
    counter: Var | None = None  # a segment-local counter for the compressed output level
    cursors: dict = field(default_factory=dict)  # (operand, level) -> its sliding window's ends
    temp: bool = False  # in the producer of a nested sum's temporary (``acc`` is the temporary)
    # operand -> flag: whether it matched at every flat co-iteration above (absent reads 0)
    alive: dict = field(default_factory=dict)
    # operands a branch around this walk found absent: a where's sides, lowered from
    # terms of their own, leave them out as that branch's term did
    absent: frozenset = frozenset()
    at: dict = field(default_factory=dict)  # (operand, level) -> position there
    # Set in a sum of integer products (``acc`` an int32): the leaf adds q - zero_point
    # products, and the scales are applied once, where ``acc`` is stored.
    integer: bool = False
    # What a coordinate the loops skip stands for (``ucf.lower.lattice``): the identity
    # of the reduction that ``acc`` computes, or the output's value where it stores
    # nothing; and how the leaf combines a value into ``acc`` (sum, max, min).
    target: float = 0.0
    acc_op: str = "sum"
    # Counts the coordinates the leaf combines into ``acc`` when a max or min skips
    # coordinates that all hold ``target`` (``TemporariesMixin._skipping``).
    visits: Var | None = None

    def copy(self) -> State:
        return replace(
            self,
            levels=dict(self.levels),
            pos=dict(self.pos),
            at=dict(self.at),
            seg_end=dict(self.seg_end),
            cursors=dict(self.cursors),
            alive=dict(self.alive),
        )


#: Entries a listed workspace's list holds beyond its extent: reading a bitmap word writes
#: this many candidates from where its first coordinate goes, whether the word holds them
#: or not (``ucf.lower.workspaces``), so up to this many past the last when the list is full.
BITS_SLACK = 4


@dataclass
class Workspace:
    """A precompute's dense workspace, plus the list of touched coordinates when the
    consumer appends to a sparse output (so it walks only those, in order)."""

    name: str
    var: str  # the original index variable it is indexed by
    # the position it is indexed with: the variable (the original or a split's inner
    # one), or, over several variables, their row-major position
    index: ir.Expr
    size: ir.Expr
    vals: Array
    flags: Array | None = None
    list: Array | None = None
    count: Var | None = None
    epoch: Var | None = None  # which use of the workspace flags[k] == epoch marks
    sort_tmp: Array | None = None  # the sort's scratch, as long as the list (None: no sort)
    sort_buckets: Array | None = None  # the sort's counters, sort.BUCKETS long
    # A bitmap of the coordinates touched, which a row as dense as its words reads in
    # order instead of sorting its list (``ucf.lower.workspaces``); compute pass only.
    bits: Array | None = None
    summary: Array | None = None  # a bit per word of ``bits``: set where the word is not 0
    use_bits: Var | None = None  # whether this use of the workspace sets ``bits``
    # The consumer merges this list with another workspace's (``w(j) + v(j)``): counting
    # their union needs both in order, so the assemble pass sorts it too.
    merged: bool = False
    # Its further variables (``W(j,l)``: ``("l",)``), each a dense dimension after ``var``.
    more: tuple[str, ...] = ()

    def allocations(self, assembling: bool) -> list[tuple[Array, ir.Expr]]:
        """The arrays a pass allocates, with their lengths.  The assemble pass only
        counts, so it needs neither the values nor (unless the list is merged) the sort's
        scratch, nor the bitmap; the flags have two extra entries, which hold the epoch
        and whether the next use sets the bitmap."""
        if self.list is None:
            return [] if assembling else [(self.vals, self.size)]
        flags = (self.flags, ir.add(self.size, Const(2, I64)))
        listing = [flags, (self.list, self.size)]
        scratch = []
        if self.sort_tmp is not None:  # an unordered output level takes the list as it comes
            scratch = [(self.sort_tmp, self.size), (self.sort_buckets, Const(sort.BUCKETS, I64))]
        if assembling:
            return listing + (scratch if self.merged else [])
        if self.bits is None:
            return [(self.vals, self.size), *listing, *scratch]
        # the bitmap's reading writes up to BITS_SLACK entries past the row's last
        words = ir.add(ir.Bin(">>", self.size, Const(6, I64)), Const(1, I64))
        summary = ir.add(ir.Bin(">>", self.size, Const(12, I64)), Const(1, I64))
        slack = (self.list, ir.add(self.size, Const(BITS_SLACK, I64)))
        bitmaps = [(self.bits, words), (self.summary, summary)]
        return [(self.vals, self.size), flags, slack, *scratch, *bitmaps]

    @property
    def sorted_when_assembling(self) -> bool:
        return self.sort_tmp is not None and self.merged


@dataclass
class Lowered:
    """The kernel functions plus what the executor needs to call them."""

    compute: ir.Function
    assemble: ir.Function | None  # set for sparse outputs: counts entries per level
    helpers: list[ir.Function]  # internal functions the kernels call
    local_level: int | None  # compressed output level whose pos the assemble pass fills
    # Sums of quantized products in int32 (``ucf.lower.held``): for each, the slots of
    # its factors and the extents (names, or fixed sizes) of the loops it runs over.
    integer_sums: list = field(default_factory=list)
    # The sparse output is appended in one pass into arrays sized by the assemble pass's
    # bound, every value stored once (``AssemblyMixin._bound_operands``,
    # ``ucf.lower.product_bound``): its values need no zeroing before the call. The
    # text says what bounds it ("": two passes, the first counting).
    one_pass: str = ""
    # The slot of the operand whose structure the output has, position for position
    # (``AssemblyMixin._same_structure``; "" for none): the compute pass stores every
    # value, and a call copies that operand's positions instead of counting them.
    same_structure: str = ""


@dataclass
class Where:
    """Where a precompute splits the nest into producers and a consumer.

    A workspace gathers a product, or a sum of products one producer per term:
    each term's loops add into it in turn (Gustavson's way, one product after the
    other), so no loop co-iterates the terms."""

    depth: int
    parts: list[tuple[Term, tuple[str, ...]]]  # each producer's term and loop order
    cons_term: Term
    cons_order: tuple[str, ...]
    ws: Workspace
    split: tuple | None  # (outer, inner, factor, extent) when iw is a split's inner loop
    n: int  # the workspace's operand number
    parent: tuple | None  # the side of an earlier where it splits: (where, "prod<m>"|"cons")
    label: str  # the loops over the workspace's variable below the where are labelled so


@dataclass
class Scope:
    """A part of the nest a precompute may split: the whole statement, or one side of an
    earlier where."""

    term: Term  # what this part computes
    order: tuple[str, ...]  # its loop order (a where's sides keep only their variables)
    start: int  # the depth at which its nest begins
    out_vars: list[str]  # the variables of what it writes
    output: bool  # whether it writes the statement's output (else a workspace)
    summed: tuple[str, ...] = ()  # the statement's outer reduction, summing the whole term


@dataclass
class Iterator:
    n: int
    pos: Var
    end: Var
    coord: Var
    kind: object
    arrays: dict
    unique: bool
    seg: Var | None = None
    init: list = field(default_factory=list)
    begin: ir.Expr | None = None
    end_expr: ir.Expr | None = None
    setup: list = field(default_factory=list)  # finds an affine window before the loop
    skip: list = field(default_factory=list)  # steps past coordinates off a stride
    stride: int = 1
    offset: ir.Expr | None = None  # set for an affine index: coordinate = stride*v + offset
