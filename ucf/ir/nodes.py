"""LLIR nodes.

Scalars are typed by short names (``i1 i32 i64 f32 f64``); arrays are
function parameters with an element type.  Constructors fold the trivial
cases (``x + 0``, ``x * 1``) so the lowerer can build expressions naively.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

INT_TYPES = ("i32", "i64")
#: The type of positions, coordinates, extents and loop variables.
I64 = "i64"
FLOAT_TYPES = ("f32", "f64")

#: Types only arrays hold (a tensor's stored values): a load of one is cast to a
#: compute type at once, so no arithmetic, constant or variable has them.
STORAGE_TYPES = ("f16", "bf16", "i8", "u8")
NUMPY_TO_IR = {
    "float64": "f64",
    "float32": "f32",
    "int64": "i64",
    "int32": "i32",
    "float16": "f16",
    "int8": "i8",
    "uint8": "u8",
}
IR_TO_C = {
    "i1": "bool",
    "i32": "int32_t",
    "i64": "int64_t",
    "f32": "float",
    "f64": "double",
    "f16": "_Float16",
    "bf16": "uint16_t",  # the bits: a cast to a float is ucf_bf16_f32 (ucf_runtime.h)
    "i8": "int8_t",
    "u8": "uint8_t",
}


#: Bytes of one element of each type an array may hold.
ELEMENT_BYTES = {
    "i1": 1,
    "i32": 4,
    "i64": 8,
    "f32": 4,
    "f64": 8,
    "f16": 2,
    "bf16": 2,
    "i8": 1,
    "u8": 1,
}


#: Vector types are an element type and a lane count, ``f32x8``: only the register
#: blocking of ``ucf.passes.registers`` makes them, for the CPU targets.
VECTOR_ELEMENTS = ("f32", "f64", "i32", "i64", "i8", "u8")


def vector(ty: str, lanes: int) -> str:
    """The type of ``lanes`` values of scalar type ``ty``."""
    return f"{ty}x{lanes}"


def element(ty: str) -> str:
    """The scalar type of a vector type's lanes (a scalar type is its own)."""
    return ty.split("x")[0]


def lanes(ty: str) -> int:
    """How many values a type holds: 1 for a scalar."""
    return int(ty.split("x")[1]) if "x" in ty else 1


class Expr:
    type: str


@dataclass(frozen=True)
class Var(Expr):
    name: str
    type: str


@dataclass(frozen=True)
class Const(Expr):
    value: float | int | bool
    type: str


@dataclass(frozen=True)
class Array:
    """An array parameter: element type, and whether the kernel writes it."""

    name: str
    elem: str
    output: bool = False
    doc: str = ""


@dataclass(frozen=True)
class Load(Expr):
    """``array[index]``; ``acquire``: an atomic load that sees every write made before
    the ``release`` store it reads (a panel's tag, ``ucf.passes.panels``)."""

    array: Array
    index: Expr
    acquire: bool = False

    @property
    def type(self) -> str:
        return self.array.elem


@dataclass(frozen=True)
class VLoad(Expr):
    """``lanes`` consecutive elements from ``array[index]`` on, as one vector (no
    alignment assumed)."""

    array: Array
    index: Expr
    lanes: int

    @property
    def type(self) -> str:
        return vector(self.array.elem, self.lanes)


@dataclass(frozen=True)
class Splat(Expr):
    """A scalar copied into every lane of a vector."""

    operand: Expr
    lanes: int

    @property
    def type(self) -> str:
        return vector(self.operand.type, self.lanes)


@dataclass(frozen=True)
class Lane(Expr):
    """Lane ``index`` (a constant) of a vector: how the partial sums of
    ``ucf.passes.partial_sums``, held in a vector's lanes, are folded into one."""

    operand: Expr
    index: int

    @property
    def type(self) -> str:
        return element(self.operand.type)


@dataclass(frozen=True)
class PairDot(Expr):
    """Two vectors of ``i32`` whose 32-bit lanes each hold two int16, the low half
    first: per lane ``low(left) * low(right) + high(left) * high(right)``, the products
    and their sum in int32. It is x86's ``pmaddwd``, 16 products in one AVX2
    instruction: ``ucf.passes.pairs`` makes it for products of 8-bit integers, two steps
    of a reduction per lane (exact: no sum of two such products leaves int32)."""

    left: Expr
    right: Expr

    @property
    def type(self) -> str:
        return self.left.type


@dataclass(frozen=True)
class QuadDot(Expr):
    """Three vectors of ``i32`` whose 32-bit lanes each hold four bytes, the lowest
    first: per lane ``addend`` plus the sum over the four bytes of the ``unsigned``
    operand's byte, zero-extended, times the ``signed`` operand's byte, sign-extended,
    all in int32 (wrapping, never saturating). It is x86's ``vpdpbusd`` (AVX-512 VNNI,
    or AVX-VNNI's VEX form), 32 products and their sum into the accumulator in one
    instruction: ``ucf.passes.pairs`` makes it for int8 times uint8, four steps of a
    reduction per lane."""

    unsigned: Expr
    signed: Expr
    addend: Expr

    @property
    def type(self) -> str:
        return self.addend.type


@dataclass(frozen=True)
class FMA(Expr):
    """``left * right + addend`` rounded once, as IEEE 754's fusedMultiplyAdd, on floats
    or vectors of them: one instruction (``vfmadd``) on x86 with FMA3, and the same value
    on every target, where a multiply and an add would round twice. ``add_product``
    makes it for every accumulation of a product (``ucf.passes.fma``)."""

    left: Expr
    right: Expr
    addend: Expr

    @property
    def type(self) -> str:
        return self.addend.type


@dataclass(frozen=True)
class Bin(Expr):
    op: str  # + - * / % min max, and on integers << >> (arithmetic) &
    left: Expr
    right: Expr

    @property
    def type(self) -> str:
        return self.left.type


@dataclass(frozen=True)
class Neg(Expr):
    operand: Expr

    @property
    def type(self) -> str:
        return self.operand.type


@dataclass(frozen=True)
class Cmp(Expr):
    op: str  # < <= == != > >=
    left: Expr
    right: Expr
    type: str = "i1"


@dataclass(frozen=True)
class Logic(Expr):
    op: str  # and or
    left: Expr
    right: Expr
    type: str = "i1"


@dataclass(frozen=True)
class Cast(Expr):
    operand: Expr
    type: str


@dataclass(frozen=True)
class Select(Expr):
    """``cond ? if_true : if_false``, evaluating only the chosen side (as C does), so a
    side may load from a position that is valid only when it is chosen.

    ``branchless``: both sides are already evaluated (they load nothing), and the
    targets must not branch on ``cond`` (``ucf.passes.short_sums``, whose condition is
    unpredictable): LLVM's ``select``, and for floats on the C target a blend of the
    bits (``ucf_blend_f64`` in ucf_runtime.h), since GCC turns a float ``?:`` into a
    branch again."""

    cond: Expr
    if_true: Expr
    if_false: Expr
    branchless: bool = False

    @property
    def type(self) -> str:
        return self.if_true.type


@dataclass(frozen=True)
class Math(Expr):
    """A floating-point libm function of one argument: sqrt, exp, sin, cos, tanh or erf."""

    fn: str
    operand: Expr

    @property
    def type(self) -> str:
        return self.operand.type


MATH_FUNCTIONS = ("sqrt", "exp", "sin", "cos", "tanh", "erf")


@dataclass(frozen=True)
class Bits(Expr):
    """A bitmap's operations on an i64 word, as two's complement with nothing undefined
    (C's signed shifts and overflow are not): ``ctz`` the trailing zero bits (64 for zero,
    so a branch-free loop may take it of a word it has emptied), ``blsr`` the word
    without its lowest set bit, ``bit`` the word whose bit n (0..63) alone is set,
    ``popcount`` its set bits."""

    fn: str
    operand: Expr

    @property
    def type(self) -> str:
        return self.operand.type


class Stmt:
    #: The fields holding nested statement lists, in execution order (``ucf.ir.walk``).
    BLOCKS: ClassVar[tuple[str, ...]] = ()


@dataclass
class Decl(Stmt):
    var: Var
    init: Expr


@dataclass
class Assign(Stmt):
    var: Var
    value: Expr


@dataclass
class Store(Stmt):
    """``array[index] = value`` (``+=`` if accumulating); a vector value stores its lanes
    at ``index`` on."""

    array: Array
    index: Expr
    value: Expr
    accumulate: bool = False
    atomic: bool = False  # the add must not race with other threads' adds
    release: bool = False  # an atomic store publishing the writes before it (``Load.acquire``)


@dataclass
class FetchAdd(Stmt):
    """Declares ``var`` holding ``array[index]`` and adds ``value`` there, as one atomic
    step: the old value tells concurrent threads apart, so each may claim a slot of
    its own (CUDA's ``atomicAdd``; on CPUs, a thread claims a shared panel to pack)."""

    var: Var
    array: Array
    index: Expr
    value: Expr


@dataclass
class For(Stmt):
    BLOCKS: ClassVar[tuple[str, ...]] = ("prologue", "body", "epilogue")
    var: Var
    start: Expr
    end: Expr
    body: list[Stmt]
    parallel: str | None = None  # None, or a unit name such as "CPUThread"
    label: str = ""  # the schedule's name for this loop (an index variable, original or derived)
    strategy: str = ""  # race strategy of a parallel loop
    # OpenMP-style (kind, chunk; 0 = even blocks); kind "blocks": static, one contiguous
    # block per thread also on the llvm target (``OpenMPLoops.static_block``)
    schedule: tuple[str, int] = ("static", 0)
    unroll: int = 0  # unroll count the backend compiler is told to use
    align: int = 0  # bytes the loop's first instruction is aligned to (0: the backend's choice)
    reduction: list[Var] = field(default_factory=list)  # scalars summed across threads/lanes
    prologue: list[Stmt] = field(default_factory=list)  # per-thread setup of a parallel loop
    epilogue: list[Stmt] = field(default_factory=list)  # per-thread teardown
    # A CPUThread loop starts threads only when this holds (OpenMP's ``if`` clause); read
    # before the loop, so it names only what is defined there. None: always.
    parallel_if: Expr | None = None


@dataclass
class While(Stmt):
    BLOCKS: ClassVar[tuple[str, ...]] = ("body",)
    cond: Expr
    body: list[Stmt]
    label: str = ""  # set when this is the loop over an index variable (co-iteration)


@dataclass
class If(Stmt):
    BLOCKS: ClassVar[tuple[str, ...]] = ("then", "orelse")
    cond: Expr
    then: list[Stmt]
    orelse: list[Stmt] = field(default_factory=list)


#: Where a workspace (``Alloc``) starts: a cache line, so that no vector load of the
#: packed panels micro-kernels stream straddles two lines (calloc aligns to 16 bytes;
#: a 32-byte load at 16 past a line split every other time, and the c target's
#: condensed MoE kernel ran 1.4x as long).
ALIGN = 64
#: The size of a transparent huge page on x86-64 Linux (``Alloc.huge``).
HUGE_BYTES = 2 << 20
#: Linux's ``madvise`` advice by number (the llvm target has no headers): the range may
#: take huge pages, and (Linux 6.1 on) its pages are made huge now.
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


@dataclass
class Alloc(Stmt):
    """A local array (a workspace) of ``size`` elements, starting on an ``ALIGN``-byte
    boundary; zero-filled unless ``zeroed`` is False (a panel every read of which
    follows a write: filling megabytes of zeros each call is not free). ``huge`` (not
    zeroed only): where it takes ``HUGE_BYTES`` or more, it starts on a ``HUGE_BYTES``
    boundary and, on Linux, its whole huge pages are made transparent huge pages
    (``madvise``; why: ``ucf.passes.panels``)."""

    array: Array
    size: Expr
    zeroed: bool = True
    huge: bool = False


@dataclass
class Pick(Stmt):
    """Names ``first`` as ``array`` where ``cond`` holds, else ``second``: a parallel
    loop's per-thread setup choosing the team's shared panels or its own at run time
    (``ucf.passes.panels``). Nothing is allocated or freed under the new name."""

    array: Array
    cond: Expr
    first: Array
    second: Array


@dataclass
class Free(Stmt):
    array: Array


@dataclass
class Prefetch(Stmt):
    """A hint to bring ``array[index]``'s cache line in for reading, into cache ``level``
    and those beyond it (1: every level, x86's ``prefetcht0``; 2: the L2 but not the L1,
    ``prefetcht1``). It never faults, and the backends compute its address without
    assuming it lies in the array, so the index may be past the end
    (``ucf.passes.prefetch``, ``ucf.passes.streams``)."""

    array: Array
    index: Expr
    level: int = 1

    @property
    def locality(self) -> int:
        """``level`` as LLVM's ``llvm.prefetch`` and GCC's ``__builtin_prefetch`` spell it:
        3 for level 1, 2 for level 2."""
        return 4 - self.level


@dataclass
class Pause(Stmt):
    """A spin-wait hint (x86's ``pause``; nothing elsewhere): one turn of a loop that
    waits for another thread, which then draws less power and leaves the core's other
    hardware thread its share (``ucf.passes.panels``)."""


@dataclass
class Yield(Stmt):
    """``sched_yield()``: a waiting thread gives its core to another runnable one, such
    as the descheduled thread it waits for on a busy machine (``ucf.passes.panels``)."""


@dataclass
class Call(Stmt):
    """A call of another function of the same module (a helper such as the sort)."""

    name: str
    args: list


@dataclass
class Comment(Stmt):
    text: str


@dataclass
class Param:
    """A scalar or array parameter of a kernel function, in ABI order."""

    name: str
    type: str  # scalar type, or the element type for arrays
    is_array: bool
    output: bool = False
    doc: str = ""
    role: tuple = ()  # what the executor binds here, e.g. ("pos", slot, level)


@dataclass
class Function:
    name: str
    params: list[Param]
    body: list[Stmt]
    doc: str = ""
    internal: bool = False  # a helper: not exported, not in the header


def const_like(e: Expr, value) -> Const:
    return Const(value, e.type)


def _is_const(e: Expr, value) -> bool:
    return isinstance(e, Const) and e.value == value


def add(a: Expr, b: Expr) -> Expr:
    if _is_const(b, 0):
        return a
    if _is_const(a, 0):
        return b
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value, a.type)
    return Bin("+", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    if _is_const(b, 0):
        return a
    return Bin("-", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    if _is_const(a, 0) or _is_const(b, 0):
        return Const(0, a.type)
    if _is_const(b, 1):
        return a
    if _is_const(a, 1):
        return b
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value, a.type)
    return Bin("*", a, b)


def add_product(acc: Expr, term: Expr) -> Expr:
    """``acc + term``, fused into one ``FMA`` when ``term`` is a product of floats: the
    one rule by which ucf fuses (``ucf.passes.fma``)."""
    if isinstance(term, Bin) and term.op == "*" and element(term.type) in FLOAT_TYPES:
        if term.type == acc.type:
            return FMA(term.left, term.right, acc)
    return add(acc, term)


def minimum(a: Expr, b: Expr) -> Expr:
    return Bin("min", a, b)


def land(a: Expr, b: Expr) -> Expr:
    if _is_const(a, True):
        return b
    if _is_const(b, True):
        return a
    return Logic("and", a, b)


def lor(a: Expr, b: Expr) -> Expr:
    return Logic("or", a, b)


def cast(e: Expr, ty: str) -> Expr:
    if e.type == ty:
        return e
    if isinstance(e, Const):
        return Const(float(e.value) if ty in FLOAT_TYPES else int(e.value), ty)
    return Cast(e, ty)
