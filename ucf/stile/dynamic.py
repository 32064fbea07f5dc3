"""Kernels over dynamic operands: dense data whose sparsity is known only at call time.

``ucf.compile(stmt, dynamic={"A": (32, 1)})`` compiles once for an operand A that
comes dense on every call, with a mask (``masks={"A": m}``) or without one (its
nonzeros are the mask).  Every call builds the index of A's live micro-tiles with
a generated kernel (``ucf.stile.tile_index``: no sort; on CUDA with atomicAdd slot claims), and
the compute runs over those tiles only, reading A's dense array in place.

On llvm and c, a matmul over A's last variable, and MoE's product with A as the
routing, run as gathered dense compute tiles instead (``ucf.stile.gathered``). Any other statement
is rewritten so that an ordinary ucf kernel does this.  Each of A's
variables whose tile extent exceeds 1 is split into the tile and the place in it,
as for a blocked format (``ucf.cin.blocking``), and the tile index T joins A's
access: ``C(i,n) = A(i,k) * B(k,n)`` with tiles of 32 x 1 becomes
``C(i_blk,i_in,n) = T(i_blk,k) * A(i_blk,i_in,k) * B(k,n)``.  T is stored
``U...UQ``: one dense level per leading mode of tiles and an unordered compressed
last level, so it drives the loop over live tile columns while A (row-major, seen
as ``(M/32, 32, K)``: a reshape, no copy) and B are located densely.  Iterating
the live tiles in whatever order the index lists them is legal because the
condensed variable is permutation invariant, which the compile checks
(``ucf.cin.invariance.check_condense``: a compound variable, the ``x`` of a
convolution, is refused).  Extents that the tiles do not divide are padded with
zeros, as blocked formats are: the operands sharing a split variable are copied
then.

The mask wins: A is multiplied by the mask (read in place as bytes when it is
boolean; A's own nonzeros when no mask is given), so a finite nonzero of A
outside the mask counts as zero even in a live tile. A NaN or infinity there
still reaches the result when its tile is live, as NaN * 0 is NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ucf import pipeline
from ucf.cin.blocking import Blocking, unblock
from ucf.cin.invariance import check_condense, classify, describe
from ucf.errors import OperandError, ScheduleError, ShapeError, UnsupportedError, boundary
from ucf.exec import blocked_call
from ucf.exec.binding import check_mappings, check_output, refuse_positional
from ucf.exec.kernel import Kernel
from ucf.exec.shapes import bound_extents, check_orders, wrong_order
from ucf.format.format import Format, parse_formats
from ucf.format.scipy_layouts import is_scipy
from ucf.format.tensor import Tensor
from ucf.format.values import VALUES, index_dtype_of, value_dtype
from ucf.lang import ast
from ucf.lang.affine import Affine
from ucf.lang.parser import parse_statement
from ucf.schedule.candidates import first_passing
from ucf.schedule.commands import Command, Parallelize, Reorder, SplitCommand
from ucf.schedule.gpu_model import BLOCKS, DEFAULT_GPU_THREADS, THREADS
from ucf.schedule.records import Parallel
from ucf.schedule.text import as_commands, spelled
from ucf.stile import gathered, tile_index


class DynamicKernel:
    """A kernel with one dynamic operand; call it like a Kernel, with ``masks=``."""

    @boundary
    def __init__(
        self,
        expr: str,
        formats: dict[str, Any] | None,
        schedule: str | None,
        target: str,
        dtype: Any,
        index_dtype: Any,
        dynamic: Mapping[str, Any],
        emulate: bool = False,
    ):
        stmt = parse_statement(expr)
        if target not in tile_index.INDEX_TARGETS:
            raise UnsupportedError(
                f"dynamic operands run on {', '.join(tile_index.INDEX_TARGETS)}, not {target!r}"
            )
        if emulate and target != "cuda":
            raise UnsupportedError("emulate=True runs generated CUDA and needs target='cuda'")
        if not isinstance(dynamic, Mapping):
            raise OperandError(f"dynamic= maps an operand to its micro-tile shape, got {dynamic!r}")
        if len(dynamic) != 1:
            raise UnsupportedError(
                f"dynamic= maps one operand to its micro-tile shape (one dynamic operand per "
                f"kernel), got {dynamic!r}"
            )
        ((name, granularity),) = dynamic.items()
        held = [a for a in ast.accesses(stmt.rhs) if a.tensor == name]
        if not held:
            names = sorted({a.tensor for a in ast.accesses(stmt.rhs)})
            raise OperandError(
                f"dynamic= names {name}, which is not an operand of {stmt} "
                f"(operands: {', '.join(names)})"
            )
        if len(held) > 1:
            raise UnsupportedError(f"dynamic operand {name} is read more than once in {stmt}")
        access = held[0]
        if not access.indices:
            raise OperandError(f"dynamic operand {name} is a scalar; it has no tiles")
        own = [idx.single_variable for idx in access.indices if idx.single_variable]
        if len(set(own)) < len(own):
            v = next(v for v in own if own.count(v) > 1)
            raise UnsupportedError(
                f"dynamic operand {name} is read as {access}, with the index variable {v} "
                "twice; its tiles cut each of its modes apart, so give each mode a variable "
                "of its own (pass the diagonal as a tensor of its own)"
            )
        given = dict(formats or {})
        formats = parse_formats(given, ast.statement_orders(stmt))  # parsed once, here
        stated = formats.pop(name, None)
        if stated is not None and (not stated.is_dense or stated.values):
            raise OperandError(
                f"dynamic operand {name} is passed dense, with a mask, and read in the "
                f"kernel's dtype; its format may not be '{given[name]}'"
            )
        self.granularity = tile_index.check_granularity(
            granularity, len(access.indices), f"dynamic operand {name}"
        )
        # The live tiles are listed in any order along A's last mode, and each row of
        # tiles on its own: legal unless a variable of A is compound.
        kinds = classify(stmt)  # output variables first: a convolution's x before its r
        own = set(ast.index_variables(access))
        try:
            check_condense(stmt, [v for v in kinds if v in own])
        except ScheduleError as e:
            raise ScheduleError(f"dynamic operand {name}: {e}") from None
        self.name, self.target, self.statement = name, target, stmt
        self.emulate = emulate
        taken = {a.tensor for a in (stmt.lhs, *ast.accesses(stmt.rhs))}
        self._index = ast.fresh("T", taken)
        self._mask = ast.fresh("K", taken)
        self._with_mask = replace(
            stmt,
            rhs=_replace(
                stmt.rhs, access, _product(access, ast.Access(self._mask, access.indices))
            ),
        )
        commands = as_commands(schedule)
        self._generic = (access, formats, commands, dtype, index_dtype)
        # the other operands' formats as given (the dynamic one is dense)
        self.formats = {n: str(f) for n, f in given.items() if n != name}
        self._kernel: Kernel | None = None
        self._blocking: Blocking | None = None
        self.dtype = pipeline.compute_dtype(expr, formats, dtype)
        self.index_dtype = index_dtype_of(index_dtype)
        shape = None
        if target in tile_index.TARGETS:  # gathered compute tiles are CPU kernels
            shape = gathered.match(stmt, name, self.granularity, formats, self.dtype, commands)
        self._condensed = None
        if shape is None:
            self._build_generic()
        else:
            self._condensed = gathered.Condensed(
                stmt, name, shape, self.granularity, target, self.dtype, self.index_dtype
            )

    def _build_generic(self) -> None:
        """The generic kernel (a rewrite of the statement), built on first need when the
        condensed one runs the calls."""
        access, formats, commands, dtype, index_dtype = self._generic
        self._kernel, self._blocking = self._rewrite(
            self.statement, access, formats, commands, self.target, dtype, index_dtype
        )
        self.dtype, self.index_dtype = self._kernel.dtype, self._kernel.index_dtype

    @property
    def parsed_formats(self) -> dict[str, Format]:
        """The other operands' formats as given, parsed (``formats`` keeps them as
        spelled)."""
        return dict(self._generic[1])

    def __repr__(self) -> str:
        return (
            f"DynamicKernel('{self.statement}', dynamic={{{self.name!r}: {self.granularity}}}, "
            f"target={self.target!r}, dtype={self.dtype})"
        )

    @property
    def kernel(self) -> Kernel:
        """The generic kernel of the rewritten statement (built now if the condensed
        kernel runs the calls)."""
        if self._kernel is None:
            self._build_generic()
        return self._kernel

    @property
    def blocking(self) -> Blocking | None:
        self.kernel  # noqa: B018  (built on first need)
        return self._blocking

    def _rewrite(
        self,
        stmt: ast.Statement,
        access: ast.Access,
        formats: dict[str, Format],
        commands: list[Command] | None,
        target: str,
        dtype: Any,
        index_dtype: Any,
    ) -> tuple[Kernel, Blocking | None]:
        """The kernel for ``stmt`` with A's access replaced by ``T(tiles) * K(...) * A(...)``,
        split for the tiles, and the blocking that splits the user's operands (None when
        no tile extent exceeds 1)."""
        name, g = self.name, self.granularity
        order = len(access.indices)
        tiled = Format.tiled(g)
        stmt = self._with_mask  # the user's statement, the mask factor included
        names = {a.tensor: len(a.indices) for a in (stmt.lhs, *ast.accesses(stmt.rhs))}
        fmts = {n: formats.get(n) or Format.dense(k) for n, k in names.items()}
        user = {**fmts, name: Format.dense(order), self._mask: Format.dense(order)}
        fmts[name] = tiled
        fmts[self._mask] = replace(tiled, values=VALUES["uint8"])
        b = unblock(stmt, fmts, first=(name, self._mask))  # the tiles claim first
        split_stmt, split_fmts = stmt, fmts
        if b is not None:  # A and K are passed dense: their views are cut from that
            b.user_formats.update(
                {v: user[t] for v, t in b.sources.items() if t in (name, self._mask)}
            )
            split_stmt, split_fmts = b.statement, dict(b.formats)
        tiles = tuple(
            _tile_index(b, v, t) for v, t in zip(_own(access), self.granularity, strict=True)
        )
        split_mask = next(a for a in ast.accesses(split_stmt.rhs) if a.tensor == self._mask)
        split_access = next(a for a in ast.accesses(split_stmt.rhs) if a.tensor == name)
        rhs = _replace(
            split_stmt.rhs, split_mask, _product(ast.Access(self._index, tiles), split_mask)
        )
        inner = replace(split_stmt, rhs=rhs)
        inner_formats = {n: f for n, f in split_fmts.items() if n != name}
        inner_formats[self._index] = tile_index.index_format(order, target)
        args = (str(inner), inner_formats)
        emulate = self.emulate
        # The split is made here, so the kernel is told of it: loops over a last, partial
        # tile stop at the variable's extent (ucf.lower.lowerer's loop ends).
        blocks = None
        if b is not None:
            blocks = {
                inner_var: (v, outer, size)
                for v, size in b.sizes.items()
                for outer, inner_var in [b.names[v]]
            }
        if commands is None:
            order = _tiles_first(inner, tiles, split_access)
            default = (
                _gpu_schedule(inner, order) if target == "cuda" else _cpu_schedule(inner, order)
            )
            # the tiles first, else the target's own default
            kernel = first_passing(
                [default] if default is not None else [],
                lambda c: Kernel(*args, c, target, dtype, index_dtype, emulate, blocks=blocks),
                shown=spelled,
            )
            if kernel is not None:
                return kernel, b
        try:
            return Kernel(*args, commands, target, dtype, index_dtype, emulate, blocks=blocks), b
        except UnsupportedError as e:
            # its tensors and variables are the rewrite's, which the user never wrote
            raise UnsupportedError(
                f"dynamic={{{name!r}: {g}}} in {self.statement}: {name} is read through an "
                f"index of its live tiles, {self._index}({', '.join(map(str, tiles))}), and "
                f"the statement that reads it is refused: {e}"
            ) from None

    @property
    def cin(self) -> str:
        if self._condensed is None:
            return self.kernel.cin
        notes = [*self._condensed.notes(), describe(self.statement)]
        return "\n".join([str(self.statement), *(f"  # {n}" for n in notes)])

    @property
    def source(self) -> str:
        if self._condensed is None:
            return self.kernel.source
        return self._condensed.source

    @property
    def asm(self) -> str:
        """The host assembly of the kernel that runs the calls (``Kernel.asm``): the
        condensed kernel's register tiles can be read there."""
        if self._condensed is None:
            return self.kernel.asm
        return self._condensed.asm

    @boundary
    def __call__(
        self,
        *positional: Any,
        out: Any = None,
        masks: Mapping[str, Any] | None = None,
        **operands: Any,
    ) -> Tensor:
        refuse_positional(self.statement, positional)
        names = {a.tensor for a in ast.accesses(self.statement.rhs)}
        if set(operands) != names:
            raise OperandError(
                f"{self.statement} reads the operands {', '.join(sorted(names))}; this call "
                f"passes {', '.join(sorted(operands)) or 'none'}"
            )
        dense = _dense(operands[self.name], self.name)
        if dense.ndim != len(self.granularity):
            raise ShapeError(wrong_order(self.name, dense.shape, len(self.granularity)))
        mask = self._mask_of(masks, dense)
        given = {**operands, self.name: dense, self._mask: mask}
        if out is not None:
            check_output(out, given, self.statement.lhs.tensor)
        tensors = {n: _tensor(v, n) for n, v in given.items()}
        # Checked on the user's statement, so errors name the user's operands.
        stmt = self._with_mask
        check_orders({a.tensor: len(a.indices) for a in ast.accesses(stmt.rhs)}, tensors)
        lhs = ast.index_variables(stmt.lhs)
        extents = bound_extents(stmt, lhs, tensors, takes_shapes=False)
        index = tile_index.build(
            mask, self.granularity, self.target, self.dtype, self.index_dtype, self.emulate, True
        )
        if self._condensed is None and self.blocking is None:
            return self.kernel(out=out, **tensors, **{self._index: index})
        shape = tuple(extents[v] for v in ast.index_variables(self.statement.lhs))
        if out is not None and tuple(np.shape(out)) != shape:
            raise ShapeError(
                f"out= has shape {tuple(np.shape(out))} but {self.statement.lhs} has shape {shape}"
            )
        if self._condensed is not None:
            return self._condensed(dense, mask, index, tensors, out)

        def run(split: dict[str, Tensor], split_extents: dict[str, int], out: Any) -> Tensor:
            own = {v: extents[v] for v in self.blocking.sizes}  # where partial tiles end
            return self.kernel(out=out, shapes=own, **split, **{self._index: index})

        plan = _Shim(self.blocking, self._with_mask)
        return blocked_call.run(run, plan, tensors, extents, out, self.dtype)

    def _mask_of(self, masks: Mapping[str, Any] | None, dense: np.ndarray) -> np.ndarray:
        """The call's mask of the dynamic operand as bytes 0/1: the one given, else the
        operand's nonzeros."""
        check_mappings(masks=masks)
        for n in masks or {}:
            if n != self.name:
                raise OperandError(
                    f"masks= gives a mask for {n}, which is not a dynamic operand of this "
                    f"kernel (dynamic: {self.name})"
                )
        given = (masks or {}).get(self.name)
        m = tile_index.mask_array(
            dense if given is None else given,
            f"dynamic operand {self.name}" if given is None else f"the mask of {self.name}",
        )
        if m.shape != dense.shape:
            raise OperandError(
                f"the mask of {self.name} has shape {m.shape} but {self.name} has shape "
                f"{dense.shape}"
            )
        if given is not None and np.asarray(given).dtype == np.bool_:
            return m  # the booleans' bytes, in place
        return (m != 0).view(np.uint8)


@dataclass(frozen=True)
class _Shim:
    """What ``ucf.exec.blocked_call.run`` reads of a plan."""

    blocking: Blocking
    statement: ast.Statement


def _own(access: ast.Access) -> list[str]:
    return [idx.single_variable for idx in access.indices]


def _tile_index(b: Blocking | None, v: str, tile: int) -> Affine:
    """The index of T's mode over ``v``: the tile, ``v`` itself when its tiles are
    single elements, or, when another tensor stores ``v`` in blocks (an ``nm(2,4)``
    operand beside tiles of 1 along ``v``), ``v`` rebuilt from its block and place."""
    if b is None or v not in b.sizes:
        return Affine.var(v)
    outer, inner = b.names[v]
    if b.sizes[v] == tile:  # the tiles claimed v first (unblock's ``first``)
        return Affine.var(outer)
    if tile > 1:  # only the output claims before the tiles
        raise UnsupportedError(
            f"the output stores {v} in blocks of {b.sizes[v]}, but the dynamic operand's tiles "
            f"cut it by {tile}; use tiles of {b.sizes[v]} along {v}, or a plain output"
        )
    return Affine.var(outer).scale(b.sizes[v]) + Affine.var(inner)


def _tiles_first(stmt: ast.Statement, tiles: tuple[Affine, ...], places: ast.Access) -> list[str]:
    """The default loop order: the loops over tiles outermost (so a row of tiles reads
    its index once, and a live tile's row of B serves every row in the tile), then
    the places in the tiles (``places`` is the split access of A), then the summed
    variables, then the output's innermost (rows of the output written in order)."""
    out = ast.index_variables(stmt.lhs)
    summed = [v for v in ast.index_variables(stmt.rhs) if v not in out]
    seen = [v for t in tiles for v in t.variables] + ast.index_variables(places) + summed + out
    return list(dict.fromkeys(seen))


def _cpu_schedule(stmt: ast.Statement, order: list[str]) -> list[Command]:
    """The tiles-first order, its outermost loop parallel when it is an output
    variable's."""
    commands: list[Command] = [Reorder(tuple(order))]
    if order[0] in ast.index_variables(stmt.lhs):
        commands.append(Parallelize(order[0], Parallel("CPUThread", "NoRaces")))
    return commands


def _gpu_schedule(stmt: ast.Statement, order: list[str]) -> list[Command] | None:
    """On CUDA: a GPU block per iteration of the tiles-first order's outermost loop (an
    output variable's) and per ``DEFAULT_GPU_THREADS`` of the output's last variable when A
    does not hold it (B's columns ``n``), a thread per column. Inside, each thread runs the other
    output variables, then the summed ones innermost, adding into a running sum: the
    threads of a block read B's rows at the tile's live k's side by side and share the
    reads of A, its mask and the index. None (the CUDA default) when the nest has no
    such pair of loops."""
    out = ast.index_variables(stmt.lhs)
    columns = out[-1]
    if order[0] not in out or columns == order[0]:
        return None
    inner = [v for v in order[1:] if v in out and v != columns]
    inner += [v for v in order[1:] if v not in out]
    blk, thr = f"{columns}_gblk", f"{columns}_gthr"
    return [
        Reorder((order[0], columns, *inner)),
        SplitCommand(columns, blk, thr, DEFAULT_GPU_THREADS),
        Parallelize(order[0], BLOCKS),
        Parallelize(blk, BLOCKS),
        Parallelize(thr, THREADS),
    ]


def _product(left: ast.Expr, right: ast.Expr) -> ast.Expr:
    return ast.Binary("*", left, right)


def _replace(e: ast.Expr, old: ast.Access, new: ast.Expr) -> ast.Expr:
    """``e`` with the access ``old`` replaced by ``new``."""
    if e == old:
        return new
    return ast.with_children(e, [_replace(c, old, new) for c in ast.children(e)])


def _dense(value: Any, name: str) -> np.ndarray:
    """A dynamic operand's dense array (a view where it can be)."""
    if is_scipy(value):
        raise OperandError(
            f"dynamic operand {name} is passed dense (a numpy array or a dense ucf.Tensor) "
            f"with masks= for its sparsity, not as a scipy sparse {value.format} matrix"
        )
    if isinstance(value, Tensor):
        if not value.format.is_dense or value.format.blocked:
            raise OperandError(
                f"dynamic operand {name} is passed dense (a numpy array or a dense "
                f"ucf.Tensor), not as '{value.format}'"
            )
        return np.asarray(value)
    try:
        a = np.ascontiguousarray(value)
    except (TypeError, ValueError) as e:
        raise OperandError(f"dynamic operand {name} is not an array: {e}") from None
    value_dtype(a.dtype, name)  # before its nonzeros are taken for a mask
    return a


def _tensor(value: Any, name: str) -> Tensor:
    """An operand as a Tensor (a C-contiguous array wrapped without a copy); errors
    name it."""
    from ucf.format.interop import as_tensor

    return as_tensor(value, name=name)
