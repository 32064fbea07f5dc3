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
from ucf.format.format import Format, LevelMap
from ucf.lang import ast
from ucf.lang.affine import Affine


@dataclass(frozen=True)
class Blocking:
    """The split of a statement's blocked index variables.

    ``sizes`` maps each blocked variable to its block size and ``names`` to its
    (block, place) variables; ``statement`` and ``formats`` are the split statement
    and each tensor's plain format over its split modes (the output's included);
    ``modes`` gives, per tensor, the block size of each original mode (0: not split),
    and ``user_formats`` the formats as given.
    """

    sizes: dict[str, int]
    names: dict[str, tuple[str, str]]
    statement: ast.Statement
    formats: dict[str, Format]
    modes: dict[str, tuple[int, ...]]
    user_formats: dict[str, Format]

    def split_shape(self, tensor: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of ``tensor`` in the split statement."""
        out: list[int] = []
        for n, b in zip(shape, self.modes[tensor], strict=True):
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


def unblock(stmt: ast.Statement, formats: dict[str, Format]) -> Blocking | None:
    """The split that turns ``stmt`` over ``formats`` (every tensor's, the output's
    included) into a statement over plain formats, or None if no format is blocked."""
    sizes: dict[str, int] = {}
    owner: dict[str, str] = {}
    for a in [stmt.lhs, *ast.accesses(stmt.rhs)]:
        fmt = formats[a.tensor]
        if not fmt.blocked:
            continue
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
            if sizes.get(v, b) != b:
                raise UnsupportedError(
                    f"index variable {v} runs over blocks of {sizes[v]} in {owner[v]} and of "
                    f"{b} in {a.tensor}; store both with the same block size"
                )
            sizes[v], owner[v] = b, a.tensor
    if not sizes:
        return None
    taken = set(ast.index_variables(stmt.rhs)) | set(ast.index_variables(stmt.lhs))
    taken |= {v for s in _sums(stmt.rhs) for v in s.vars}
    names = {v: (_fresh(f"{v}_blk", taken), _fresh(f"{v}_in", taken)) for v in sizes}
    modes: dict[str, tuple[int, ...]] = {}
    split_formats: dict[str, Format] = {}
    for a in [stmt.lhs, *ast.accesses(stmt.rhs)]:
        for idx in a.indices:
            if idx.single_variable is None and set(idx.variables) & set(sizes):
                raise UnsupportedError(
                    f"{a}: index {idx} uses a blocked variable; a variable stored in blocks "
                    "may only be used alone"
                )
        modes[a.tensor] = tuple(sizes.get(idx.single_variable, 0) for idx in a.indices)
        split_formats[a.tensor] = _split_format(formats[a.tensor], modes[a.tensor])
    rhs = _rename(stmt.rhs, names)
    lhs = _split_access(stmt.lhs, names)
    statement = replace(stmt, lhs=lhs, rhs=rhs)
    return Blocking(sizes, names, statement, split_formats, modes, dict(formats))


def user_variables(stmt: ast.Statement) -> tuple[str, ...]:
    """The index variables of the statement the user wrote (the kernel's are split)."""
    seen = dict.fromkeys(ast.index_variables(stmt.lhs))
    seen.update(dict.fromkeys(ast.index_variables(stmt.rhs)))
    return tuple(seen)


def _fresh(name: str, taken: set[str]) -> str:
    k = 1
    base = name
    while name in taken:
        name = f"{base}{k}"
        k += 1
    taken.add(name)
    return name


def _sums(e: ast.Expr) -> list[ast.Sum]:
    found = [e] if isinstance(e, ast.Sum) else []
    return found + [s for c in ast.children(e) for s in _sums(c)]


def _split_access(a: ast.Access, names: dict[str, tuple[str, str]]) -> ast.Access:
    indices: list[Affine] = []
    for idx in a.indices:
        v = idx.single_variable
        if v in names:
            indices += [Affine.var(names[v][0]), Affine.var(names[v][1])]
        else:
            indices.append(idx)
    return ast.Access(a.tensor, tuple(indices))


def _rename(e: ast.Expr, names: dict[str, tuple[str, str]]) -> ast.Expr:
    if isinstance(e, ast.Access):
        return _split_access(e, names)
    if isinstance(e, ast.Sum):
        vs = tuple(w for v in e.vars for w in (names.get(v) or (v,)))
        return ast.Sum(vs, _rename(e.body, names), e.op)
    return ast.with_children(e, [_rename(c, names) for c in ast.children(e)])


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
