"""Blocked formats in kernels: a statement over blocked storage is the same statement
over plain storage of higher order.

A tensor stored as ``bcsr(2,3)`` (``UCUU:0/2,1/3,0%2,1%3``) keeps, level by level,
exactly the arrays of a 4-D tensor over ``(i//2, k//3, i%2, k%3)`` in ``UCUU``.  So
rather than teach the lowerer a new kind of level, each blocked index variable
``i`` is split into two variables, ``i_blk`` (the block) and ``i_in`` (the place in
the block), in every access of the statement: ``A(i,k)`` becomes
``A(i_blk,k_blk,i_in,k_in)``.  Every other tensor indexed by ``i`` gets the same two
modes (a dense vector of length n becomes a ``ceil(n/2) x 2`` matrix, padded with
zeros), and the kernel is an ordinary kernel over the split statement.  The block
loops come out innermost and dense, as the levels order them, on every target.

This module decides the split (which variables, which sizes, which formats); the
executor views the user's tensors in the split shapes (``ucf.exec.blocked_call``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from ucf.errors import UnsupportedError
from ucf.format.format import Format
from ucf.format.level_map import LevelMap
from ucf.lang import ast
from ucf.lang.affine import Affine
from ucf.lang.reductions import sums


@dataclass(frozen=True)
class Blocking:
    """The split of a statement's blocked index variables.

    ``sizes`` maps each blocked variable to its block size and ``names`` to its
    (block, place) variables; ``statement`` is the split statement. A tensor read
    under two index lists that the split cuts differently (``x(i)`` and ``x(j)`` with
    ``i`` in blocks of 2 and ``j`` of 3) is two tensors there, one *view* per split:
    ``sources`` maps each tensor of the split statement to the user's tensor it views
    (a view keeps the tensor's name, later ones are named afresh). ``formats`` gives
    each view's plain format over its split modes (the output's included), ``modes``
    the block size of each of its original modes (0: not split), and
    ``user_formats`` the format each view is cut from: the tensor's own, or, for a
    blocked tensor read where its blocks disagree with the split (``A(i,j) *
    A(j,k)`` in ``bcsr(2,3)``), the plain format it is re-packed from.
    """

    sizes: dict[str, int]
    names: dict[str, tuple[str, str]]
    statement: ast.Statement
    formats: dict[str, Format]
    modes: dict[str, tuple[int, ...]]
    user_formats: dict[str, Format]
    sources: dict[str, str]

    def split_shape(self, view: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of ``view`` in the split statement (``shape``: its tensor's)."""
        out: list[int] = []
        for n, b in zip(shape, self.modes[view], strict=True):
            out += [-(-n // b), b] if b else [n]
        return tuple(out)

    def split_extents(self, extents: dict[str, int]) -> dict[str, int]:
        """The extents of the split statement's variables."""
        split = dict(extents)  # a blocked variable's own extent ends its partial block
        for v, b in self.sizes.items():
            outer, inner = self.names[v]
            split[outer] = -(-extents[v] // b)
            split[inner] = b
        return split

    def notes(self) -> list[str]:
        """For ``k.cin``: the split variables, and the tensors seen in two splits."""
        lines = [
            f"{v} runs over blocks of {b}: {outer} is the block and {inner} the place in it"
            for v, b in self.sizes.items()
            for outer, inner in [self.names[v]]
        ]
        for view, tensor in self.sources.items():
            if view != tensor:
                lines.append(
                    f"{view} is {tensor} read in the split of another of its accesses "
                    f"(blocks {self.modes[view]} by mode, as '{self.formats[view]}')"
                )
        return lines


def unblock(
    stmt: ast.Statement, formats: dict[str, Format], first: tuple[str, ...] = ()
) -> Blocking | None:
    """The split that turns ``stmt`` over ``formats`` (every tensor's, the output's
    included) into a statement over plain formats, or None if no format is blocked.

    Each access is split by its own index variables: a tensor read under two index
    lists gets a view per split. A blocked tensor's access claims the block size of
    each variable its blocks cut, output first, then the tensors ``first`` names
    (a dynamic operand's tiles), then left to right; an access whose blocks disagree
    with an earlier claim (or with themselves, ``A(i,i)`` in ``bcsr(2,3)``) is read
    re-packed from its coordinates instead, as a plain tensor over the claimed split."""
    everything = [stmt.lhs, *ast.accesses(stmt.rhs)]
    if not any(formats[a.tensor].blocked for a in everything):
        return None
    sizes: dict[str, int] = {}
    repacked: set[ast.Access] = set()
    rank = {name: k for k, name in enumerate(first)}
    claiming = [stmt.lhs, *sorted(everything[1:], key=lambda a: rank.get(a.tensor, len(rank)))]
    for a in claiming:
        fmt = formats[a.tensor]
        if not fmt.blocked:
            continue
        wanted = _claims(a, fmt)
        if wanted is None or any(sizes.get(v, b) != b for v, b in wanted):
            if a is stmt.lhs:  # the output's blocks come first, so only from themselves
                raise UnsupportedError(
                    f"output {a} ('{fmt}') is stored in blocks of different sizes for one "
                    "index variable; store it dense or in equal blocks"
                )
            repacked.add(a)
            continue
        sizes.update(wanted)
    taken = set(ast.index_variables(stmt.rhs)) | set(ast.index_variables(stmt.lhs))
    taken |= {v for s in sums(stmt.rhs) for v in s.vars}
    names = {v: (ast.fresh(f"{v}_blk", taken), ast.fresh(f"{v}_in", taken)) for v in sizes}
    tensors = {a.tensor for a in everything}
    views: dict[tuple[str, tuple[int, ...], bool], str] = {}
    view_of: dict[ast.Access, str] = {}
    blocking = Blocking(sizes, names, stmt, {}, {}, {}, {})
    for a in everything:
        for idx in a.indices:
            if idx.single_variable is None and set(idx.variables) & set(sizes):
                raise UnsupportedError(
                    f"{a}: index {idx} uses a blocked variable; a variable stored in blocks "
                    "may only be used alone"
                )
        modes = tuple(sizes.get(idx.single_variable, 0) for idx in a.indices)
        key = (a.tensor, modes, a in repacked)
        if key not in views:
            seen = sum(1 for k in views if k[0] == a.tensor)
            view = ast.fresh(f"{a.tensor}_v{seen + 1}", tensors) if seen else a.tensor
            views[key] = view
            fmt = formats[a.tensor]
            user = _plain(fmt) if a in repacked else fmt
            blocking.sources[view] = a.tensor
            blocking.modes[view] = modes
            blocking.user_formats[view] = user
            blocking.formats[view] = _split_format(user, modes)
        view_of[a] = views[key]
    rhs = _rename(stmt.rhs, names, view_of)
    lhs = _split_access(stmt.lhs, names, view_of)
    return replace(blocking, statement=replace(stmt, lhs=lhs, rhs=rhs))


def _claims(a: ast.Access, fmt: Format) -> list[tuple[str, int]] | None:
    """The block size of each variable that ``a``'s blocked modes cut, or None when
    two of its modes cut one variable into blocks of different sizes."""
    found: dict[str, int] = {}
    for mode in range(fmt.order):
        chain = [m for m in fmt.maps if m.mode == mode]
        if len(chain) == 1:
            continue
        if len(chain) > 2:
            raise UnsupportedError(
                f"tensor {a.tensor} ('{fmt}') nests blocks in mode {mode}; kernels read "
                "one level of blocks per mode"
            )
        b = chain[1].mod
        v = a.indices[mode].single_variable
        if v is None:
            raise UnsupportedError(
                f"{a}: mode {mode} of {a.tensor} is stored in blocks of {b}, so its "
                f"index must be a single variable, not {a.indices[mode]}"
            )
        if found.setdefault(v, b) != b:
            return None
    return list(found.items())


def _plain(fmt: Format) -> Format:
    """A blocked format as plain levels, one per mode in the order its blocks are
    stored, each of the kind its block level converts to: what an access whose blocks
    the statement's split cuts otherwise is re-packed from. Values with a scale per
    block have no plain counterpart, so they are read dequantized."""
    kinds, modes = [], []
    for kind, m in zip(fmt.levels, fmt.maps, strict=True):
        if m.mode not in modes:
            kinds.append(kind.reordered())
            modes.append(m.mode)
    values = fmt.values if fmt.values is None or fmt.values.level is None else None
    return Format(tuple(kinds), tuple(modes), values)


def user_variables(stmt: ast.Statement) -> tuple[str, ...]:
    """The index variables of the statement the user wrote (the kernel's are split)."""
    seen = dict.fromkeys(ast.index_variables(stmt.lhs))
    seen.update(dict.fromkeys(ast.index_variables(stmt.rhs)))
    return tuple(seen)


def _split_access(
    a: ast.Access, names: dict[str, tuple[str, str]], view_of: dict[ast.Access, str]
) -> ast.Access:
    indices: list[Affine] = []
    for idx in a.indices:
        v = idx.single_variable
        if v in names:
            indices += [Affine.var(names[v][0]), Affine.var(names[v][1])]
        else:
            indices.append(idx)
    return ast.Access(view_of[a], tuple(indices))


def _rename(
    e: ast.Expr, names: dict[str, tuple[str, str]], view_of: dict[ast.Access, str]
) -> ast.Expr:
    if isinstance(e, ast.Access):
        return _split_access(e, names, view_of)
    if isinstance(e, ast.Sum):
        vs = tuple(w for v in e.vars for w in (names.get(v) or (v,)))
        return ast.Sum(vs, _rename(e.body, names, view_of), e.op)
    return ast.with_children(e, [_rename(c, names, view_of) for c in ast.children(e)])


def _split_format(fmt: Format, blocks: tuple[int, ...]) -> Format:
    """``fmt`` over the split modes: a blocked level stores its block's or its place's
    mode; a plain level over a split mode becomes two levels of its kind (a compressed
    level over ``k`` stores ``k_blk`` compressed, then ``k_in`` as the kind says)."""
    first: dict[int, int] = {}
    k = 0
    for mode, b in enumerate(blocks):
        first[mode] = k
        k += 2 if b else 1
    kinds, maps = [], []
    chains = Counter(m.mode for m in fmt.maps)
    seen: Counter = Counter()
    for lvl, (kind, m) in enumerate(zip(fmt.levels, fmt.maps, strict=True)):
        base = first[m.mode]
        if chains[m.mode] == 2:  # the block (first), then the place in it
            kinds.append(kind)
            maps.append(LevelMap(base + seen[m.mode]))
            seen[m.mode] += 1
        elif blocks[m.mode]:
            kinds += kind.split(fmt.unique(lvl))
            maps += [LevelMap(base), LevelMap(base + 1)]
        else:
            kinds.append(kind)
            maps.append(LevelMap(base))
    return fmt.with_structure(tuple(kinds), tuple(maps))
