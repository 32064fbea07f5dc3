"""Replaying a kernel call whose operands are the very objects of the last one.

Iterative code calls a kernel in a loop with the same arrays, updated in place
(a solver's vectors, a layer's weights): checking names and orders, finding
extents, measuring statistics, choosing a plan and building the argument
list then repeat work whose answer cannot have changed, and cost tens of
microseconds against a kernel of a few. A call that bound every operand as it
is (no conversion: a blocked kernel's split operands are then views of the
user's arrays) and wrote a dense output in place, or a sparse output with an
operand's structure (``ucf.exec.operand_structure``), is remembered per thread, the last
``REMEMBERED`` of them (ping-pong buffers alternate); a call replays one's
argument list when each operand is the same object with the same shape, strides
and dtype (a numpy array), or holds the same arrays in the same format (a
``ucf.Tensor``), and the thread count is unchanged. Kernels whose checks read
operand values (a static operand's, quantized zero points bounding an int32
sum) are not remembered.

Addresses stay valid because the remembered arrays are held by weak reference
and checked for identity: numpy refuses ``resize`` on an array with a weak
reference, a changed shape, stride or dtype is seen by the check, and a
remembered array that dies ends its replay. The comparison is by identity and
a few attributes, never by value, so it costs a fraction of a microsecond per
operand; a call replayed ``PACK_AFTER`` times goes through a trampoline with
its arguments packed (``ucf.toolchain.trampoline``), which saves ctypes converting them
one by one.

A replay keeps the dense output it returned (up to ``KEEP_BYTES``, where the kernel
writes every element, and not an arena's slice: a view of a slice names the arena as its
base, so the slice's references would not count it) and the next replay writes its
values again, in a new Tensor, where the caller let go of it and of every view of its
values (their reference counts say so): a loop that drops each result gets its memory
back with no output taken from the pool (``ucf.exec.recycled``) or given back to it. A
result still held gets a new output, as before. A weak reference to a dropped result's
values does not die, then, and shows what a later call wrote. A thread's replays keep
at most ``KEPT_BYTES`` of outputs together, those kept longest ago let go first, as the
pool is bounded: without the bound a program of many kernels held an output for each.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ucf.exec import binding, recycled, scipy_operands
from ucf.exec.operand_structure import Rebuilt
from ucf.format.construction import trusted
from ucf.format.scipy_layouts import is_scipy
from ucf.format.tensor import Tensor
from ucf.toolchain.trampoline import Packed


class _Arena:
    """Zeroed memory handed out in slices for small outputs, with the address of each
    known by arithmetic: asking numpy for a new array's address costs more than a
    small kernel's whole run. A slice keeps its arena alive; an arena is never reused,
    so what it hands out is zero, and at most one arena's worth of memory outlives
    the outputs still in use."""

    SIZE = 1 << 14  # elements; outputs up to 1/16 of it come from an arena

    __slots__ = ("buf", "addr", "used")

    def __init__(self, dtype: np.dtype) -> None:
        self.buf = np.zeros(self.SIZE, dtype=dtype)
        self.addr, self.used = self.buf.ctypes.data, 0

    def take(self, n: int) -> tuple[np.ndarray, int] | None:
        start = self.used
        if start + n > self.SIZE:
            return None
        self.used = start + n
        return self.buf[start : start + n], self.addr + start * self.buf.itemsize


def _values(arenas: dict, n: int, dtype: np.dtype, zero: bool) -> tuple[np.ndarray, int]:
    """``n`` values, zeroed if ``zero``, and their address."""
    if n <= _Arena.SIZE // 16:
        arena = arenas.get(dtype)
        got = arena.take(n) if arena is not None else None
        if got is None:
            arena = arenas[dtype] = _Arena(dtype)
            got = arena.take(n)
        return got
    vals = np.zeros(n, dtype=dtype) if zero else recycled.uninitialized((n,), dtype)
    return vals, _address(vals)


def _uninitialized(n: int, dtype: np.dtype) -> tuple[np.ndarray, int]:
    """``n`` elements holding anything, and their address."""
    return _values(_ARENAS.__dict__, n, dtype, False)


def _address(a: np.ndarray) -> int:
    """The address of a new array's memory: that of a ctypes view of its buffer costs a
    sixth of ``a.ctypes.data`` (0.25 against 1.5 µs); numpy's for an empty array, whose
    buffer is too small to view."""
    return ctypes.addressof(ctypes.c_char.from_buffer(a)) if a.nbytes else a.ctypes.data


#: Calls remembered per kernel and thread: enough for alternating buffers and an
#: ``out=`` next to a fresh output, few enough that a miss costs little to find.
REMEMBERED = 4
#: Replays of one call after which its arguments are packed for a trampoline
#: (``ucf.toolchain.trampoline``): a call repeated this often is in a loop, where the
#: trampoline's one-time compile pays for itself.
PACK_AFTER = 16
#: A replayed dense output of at most this many bytes is kept by its replay, and written
#: again by the next replay if the caller let go of it (``_let_go``): taking an output
#: from the pool and giving it back costs tens of microseconds where the call's Python
#: finds its objects out of the caches (bcsr SpMM 1024^3 after torch's matmul, h91).
KEEP_BYTES = 16 << 20

#: The most bytes of outputs one thread's replays keep together (``_keep``): the pool's
#: bound (``recycled.IDLE_BYTES``), since a kept output is one the pool would hold.
KEPT_BYTES = recycled.IDLE_BYTES

#: The given output's name among the arrays compared: no keyword argument's.
_OUT = object()
#: What a changed operand can raise while it is compared (a level dropped, an array
#: swapped for something else): it is then not the remembered one.
_CHANGED = (LookupError, AttributeError, TypeError)


def _array_probe(name: Any, value: np.ndarray, died: Callable) -> tuple:
    return (name, weakref.ref(value, died), value.shape, value.strides, value.dtype)


def _compared(m: Any) -> bool:
    """Whether a replay compares a scipy matrix (CSR, CSC and COO, which a call reads in
    place)."""
    return m.format in ("csr", "csc", "coo")


def _same_arrays(m: Any, t: Tensor) -> bool:
    """Whether ``t`` holds exactly the arrays of the scipy matrix ``m`` (and for a COO,
    the positions ``scipy_operands`` keeps beside its rows for as long as they live)."""
    held = {id(a) for a in t.arrays}
    own = {id(a) for a in scipy_operands.arrays(m)}
    if m.format == "coo":
        own.add(id(scipy_operands.starts(m.row)))
    return held == own


def _scipy_probe(name: str, m: Any, died: Callable, free: frozenset[str]) -> tuple:
    """A scipy matrix, its three arrays, and whether its order is checked on a replay
    (the kernel relies on it: ``name`` is not in ``free``)."""
    arrays = tuple(weakref.ref(a, died) for a in scipy_operands.arrays(m))
    return (name, weakref.ref(m, died), m.shape, arrays, name not in free)


def _tensor_probe(name: str, t: Tensor, died: Callable) -> tuple:
    """Every array ``t`` holds, by level and key, and what decides how it binds."""
    arrays = tuple(
        (lvl, key, weakref.ref(a, died))
        for lvl, level in enumerate(t.levels)
        for key, a in level.items()
    )
    sizes = tuple(len(level) for level in t.levels)
    scales = None
    if t.scales is not None:
        scales = (weakref.ref(t.scales.scale, died), weakref.ref(t.scales.zero_point, died))
    vals = weakref.ref(t.vals, died)
    return (name, t.shape, t.format, t.index_dtype, vals, sizes, arrays, scales)


class Probes:
    """What a call's operands and output were, compared by identity and a few
    attributes: the check that a later call binds exactly as this one did."""

    __slots__ = (
        "dead",
        "arrays",
        "tensors",
        "scipy",
        "count",
        "out_address",
        "out_flat",
        "threads",
    )

    def __init__(
        self,
        operands: dict[str, Any],
        out: np.ndarray | None,
        threads: int,
        free: frozenset[str] = frozenset(),
    ) -> None:
        """``free`` names the scipy operands whose order the kernel does not rely on
        (``ucf.exec.order_free``); every other one's is checked on each replay."""
        # A remembered object that dies ends the replay: nothing else can be it, and
        # comparing with a dead reference's None must not let a None through.
        self.dead: list = []
        died = self.dead.append
        # numpy operands first: the likeliest to differ, and the cheapest to compare
        items = [*operands.items(), *([] if out is None else [(_OUT, out)])]
        self.arrays = tuple(_array_probe(n, v, died) for n, v in items if isinstance(v, np.ndarray))
        self.tensors = tuple(_tensor_probe(n, v, died) for n, v in items if isinstance(v, Tensor))
        scipy = [(n, v) for n, v in operands.items() if is_scipy(v)]
        self.scipy = tuple(_scipy_probe(n, v, died, free) for n, v in scipy if _compared(v))
        if len(self.scipy) != len(scipy):
            self.dead.append(None)  # a sparse layout a replay cannot compare: never replays
        self.count = len(operands)
        self.out_address = None if out is None else binding.address(out)
        self.out_flat = out is not None and out.ndim == 1
        self.threads = threads

    def matches(self, operands: dict[str, Any], out: Any, threads: int) -> bool:
        """Whether a call with these operands and output, at ``threads``, binds exactly
        as the remembered one did: the same objects, and for a numpy array the same
        shape, strides and dtype; for a Tensor the same shape, format and index dtype,
        holding the same arrays under the same levels and keys; for a scipy matrix the
        same shape and the same three arrays, whose contents are then checked again
        (``ucf.exec.scipy_operands.recheck``: a matrix changed in place out of bounds
        raises here as on a first call)."""
        if self.dead or threads != self.threads or len(operands) != self.count:
            return False
        if (out is None) is not (self.out_address is None):
            return False
        try:
            for name, ref, shape, strides, dtype in self.arrays:
                v = out if name is _OUT else operands[name]
                if (
                    ref() is not v
                    or v.shape != shape
                    or v.strides != strides
                    or (v.dtype is not dtype and v.dtype != dtype)
                ):
                    return False
            for name, shape, fmt, index_dtype, vals, sizes, arrays, scales in self.tensors:
                v = operands[name]
                if (
                    v.vals is not vals()
                    or not isinstance(v, Tensor)
                    or v.shape != shape
                    or v.format is not fmt
                    or (v.index_dtype is not index_dtype and v.index_dtype != index_dtype)
                ):
                    return False
                levels = v.levels
                if len(levels) != len(sizes):
                    return False
                for lvl, key, ref in arrays:
                    if levels[lvl][key] is not ref():
                        return False
                if tuple(map(len, levels)) != sizes:
                    return False
                if scales is None:
                    if v.scales is not None:
                        return False
                elif v.scales.scale is not scales[0]() or v.scales.zero_point is not scales[1]():
                    return False
            for name, ref, shape, (first, second, data), _ in self.scipy:
                v = operands[name]
                held = scipy_operands.arrays(v)
                if (
                    ref() is not v
                    or held[0] is not first()
                    or held[1] is not second()
                    or held[2] is not data()
                    or v.shape != shape
                ):
                    return False
        except _CHANGED:
            return False
        for name, _, _, _, ordered in self.scipy:
            if not scipy_operands.recheck(operands[name], name, ordered):
                return False
        return True


class Replay:
    """A call's argument list, with the output's address left open: a dense output's
    values, or a sparse output with an operand's structure (``sparse``: its positions,
    coordinates and values, ``ucf.exec.operand_structure``)."""

    __slots__ = (
        "probes",
        "args",
        "out_at",
        "fn",
        "packed",
        "runs",
        "built",
        "zero",
        "shape",
        "format",
        "levels",
        "size",
        "dtype",
        "teams",
        "sparse",
        "kept",
        "__weakref__",  # this thread's keepers (``_keep``)
    )

    def __init__(
        self,
        operands: dict[str, Any],
        out: np.ndarray | None,
        call: tuple[Any, list[Any], int],
        threads: int,
        built: Any,
        result: Tensor,
        zero: bool,
        teams: Any = None,
        free: frozenset[str] = frozenset(),
        sparse: Rebuilt | None = None,
    ) -> None:
        """``call`` is the compiled function, its arguments and the output's index in
        them; ``built`` the plan the call ran (given back to ``k.cin`` on a replay);
        ``teams`` the team states (``ucf.toolchain.team.LoopStates``) whose shrinking to
        one thread makes a call run the plan for one thread instead (None: it keeps
        its plan, and a replay reads no team state); ``free`` the scipy operands whose
        order the kernel does not rely on (see ``Probes``); ``sparse`` how a sparse
        output is made again."""
        self.teams = teams
        self.probes = Probes(operands, out, threads, free)
        self.sparse = sparse
        if sparse is not None:
            sparse.watch(self.probes.dead.append)
        self.fn, self.args, self.out_at = call
        self.packed, self.runs, self.kept = None, 0, None
        self.built, self.zero = built, zero
        self.shape, self.format, self.levels = result.shape, result.format, len(result.levels)
        self.size, self.dtype = result.vals.size, result.vals.dtype

    def matches(self, operands: dict[str, Any], out: Any, threads: int) -> bool:
        return self.probes.matches(operands, out, threads)

    def run(self, out: np.ndarray | None) -> Tensor:
        """Call the function again, into ``out`` or into a new output, zeroed first unless
        the kernel writes every element."""
        packed, sparse = self.packed, self.sparse
        args = self.args if packed is None else packed.args
        if sparse is not None:
            result, address = sparse.output(args, _uninitialized, self.dtype)
        elif out is None:
            kept = self.kept
            if kept is not None and _let_go(kept):
                _, vals, address = kept  # written again, in a new Tensor as every output
            else:
                vals, address = _values(_ARENAS.__dict__, self.size, self.dtype, self.zero)
        else:
            vals = out if self.probes.out_flat else out.reshape(-1)
            if self.zero:
                vals.fill(0)
            address = self.probes.out_address
        args[self.out_at] = address
        self._call(packed, args)
        if sparse is not None:
            return result
        result = trusted(self.shape, self.format, [{} for _ in range(self.levels)], vals)
        if (
            out is None
            and not self.zero
            and vals.nbytes <= KEEP_BYTES
            and not isinstance(vals.base, np.ndarray)  # not a slice: views name vals
        ):
            _keep(self, (result, vals, address))
        return result

    def _call(self, packed: Packed | None, args: list[Any]) -> None:
        """The kernel on ``args``: through the trampoline once the call was replayed
        ``PACK_AFTER`` times."""
        if packed is not None:
            packed.call(packed.address, packed.args_at)
            return
        self.fn(*args)
        self.runs += 1
        if self.runs == PACK_AFTER:
            signature = [t is ctypes.c_void_p for t in self.fn.argtypes]
            self.packed = Packed(self.fn, signature, args)


class FlatReplay:
    """A convolution run on a padded, flattened input (``ucf.exec.padded_conv``), replayed:
    the user's input is copied into the padded buffer the remembered call used (its
    padding stays zero), the flattened kernel is replayed into the buffer it wrote, and
    that is cropped into the user's output. A first call allocates, binds, finds
    extents and chooses a plan; a replay costs the two copies and the kernel (a
    64-channel 28x28 layer: 110 µs of a 280 µs call were the rest, which a second
    thread cannot share)."""

    __slots__ = (
        "probes",
        "inner",
        "flat",
        "x",
        "buf",
        "fout",
        "extents",
        "built",
        "shape",
        "format",
        "teams",
    )

    def __init__(
        self,
        operands: dict[str, Any],
        out: np.ndarray | None,
        threads: int,
        inner: Replay,
        flat: Any,
        padded: tuple[str, np.ndarray],
        computed: Tensor,
        extents: dict[str, int],
        result: Tensor,
    ) -> None:
        self.probes = Probes(operands, out, threads)
        name, self.buf = padded
        self.x = weakref.ref(operands[name])
        self.inner, self.flat, self.fout = inner, flat, computed.vals
        self.extents, self.built, self.teams = dict(extents), inner.built, inner.teams
        self.shape, self.format = result.shape, result.format

    def matches(self, operands: dict[str, Any], out: Any, threads: int) -> bool:
        return self.probes.matches(operands, out, threads)

    def run(self, out: np.ndarray | None) -> Tensor:
        self.flat.fill(self.buf, self.x())
        computed = self.inner.run(self.fout)
        vals = np.empty(math.prod(self.shape), self.fout.dtype) if out is None else out
        vals.reshape(self.shape)[...] = self.flat.crop(computed.vals, computed.shape, self.extents)
        return trusted(self.shape, self.format, [{} for _ in self.shape], vals.reshape(-1))


def _let_go(kept: tuple[Tensor, np.ndarray, int]) -> bool:
    """Whether nothing but ``kept`` holds its output Tensor and values: the caller let go
    of the last replay's result and of every view of its values (a numpy view holds
    its base), so the next replay may write them again. A result whose values were
    swapped for others is not written again."""
    tensor, vals = kept[0], kept[1]
    return (
        tensor.vals is vals
        and sys.getrefcount(kept[0]) <= _ALONE + 1
        and sys.getrefcount(kept[1]) <= _ALONE + 2
    )


def _keep(replay: Replay, kept: tuple[Tensor, np.ndarray, int]) -> None:
    """``replay`` keeps ``kept``; the replays of this thread that kept theirs longest ago
    let go of them while the thread's kept bytes exceed ``KEPT_BYTES``."""
    keepers = _KEEPERS.__dict__.setdefault("replays", {})  # id -> weak reference, oldest first
    keepers.pop(id(replay), None)
    keepers[id(replay)] = weakref.ref(replay)
    replay.kept = kept
    total = 0
    for key in reversed(list(keepers)):
        other = keepers[key]()
        if other is not None and other.kept is not None:
            total += other.kept[1].nbytes
            if total <= KEPT_BYTES:
                continue
            other.kept = None
        del keepers[key]


def _alone() -> int:
    """``sys.getrefcount`` of an object that only a tuple holds, read as ``_let_go``
    reads it: measured, since interpreters differ in the references they count."""
    held = (object(),)
    return sys.getrefcount(held[0])


#: What ``_let_go`` counts for an object only the kept tuple holds; the Tensor and its
#: values each have one reference more there (the local name), and the values another
#: (the Tensor's slot).
_ALONE = _alone()


#: Each thread's arenas by dtype (threads must not share one: taking is not atomic).
_ARENAS = threading.local()
#: Each thread's replays that keep an output (``_keep``).
_KEEPERS = threading.local()


def replayable(
    operands: dict[str, Any],
    slots: dict[str, Tensor],
    out: np.ndarray | None,
    result: Tensor,
    out_address: int,
) -> bool:
    """Whether a replay would bind as this call did: every array the kernel read is one
    an operand holds (the same memory, which the operands' probes vouch for: a converted
    copy, a padded split or a second read of a tensor in another order, ``A(j,i)``, is
    memory a replay would neither check nor keep alive), and the kernel wrote the
    result's own values, and ``out``'s when given (not a buffer copied or cut after).
    A blocked kernel's split operands are views of the user's arrays when the blocks
    divide the extents, so those calls replay too."""
    places = None
    for name, t in slots.items():
        value = operands.get(name)
        if value is t:
            continue
        if (
            isinstance(value, np.ndarray)
            and value.ndim
            and (t.vals is value or t.vals.base is value)
        ):
            continue  # a wrapped array, or a view of all of it (numpy's base owns the memory)
        if is_scipy(value) and _compared(value) and _same_arrays(value, t):
            continue  # a scipy matrix bound in place
        if places is None:  # a view of a view, or another array: compare the memory
            places = _places(operands)
        if places is None or any((binding.address(a), a.nbytes) not in places for a in t.arrays):
            return False
    if out is not None and binding.address(out) != out_address:
        return False
    return binding.address(result.vals) == out_address


def _places(operands: dict[str, Any]) -> set[tuple[int, int]] | None:
    """The address and size of every array the operands hold; None when an operand is
    something a replay does not compare (a 0-d array, a sparse matrix of another
    library)."""
    places = set()
    for value in operands.values():
        if isinstance(value, np.ndarray) and value.ndim:
            places.add((binding.address(value), value.nbytes))
        elif isinstance(value, Tensor):
            places.update((binding.address(a), a.nbytes) for a in value.arrays)
        elif is_scipy(value) and _compared(value):
            places.update((binding.address(a), a.nbytes) for a in scipy_operands.arrays(value))
        else:
            return None
    return places
