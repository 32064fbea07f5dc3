"""Formats: a sequence of level kinds plus what each level stores of the dimensions.

A level stores one index of the tensor's coordinates, a *level map*: a mode's
coordinate ``i`` (``0``), the block it falls in (``0/32``: ``i // 32``) or its
place in the block (``0%32``: ``i % 32``). Plain maps give CSR, CSC and every
permuted format; blocked maps give BCSR as plain levels with no special case
(MLIR's ``(i, j) -> (i floordiv 32, j floordiv 32, i mod 32, j mod 32)``).
Level maps are ``ucf.format.level_map``'s; the names and pieces format text is
written in are read in ``ucf.format.spelling``, and ``parse_format`` here makes a
``Format`` of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache, cached_property
from typing import Any

import numpy as np

from ucf.errors import FormatError, OperandError, boundary
from ucf.format.level_map import LevelMap
from ucf.format.levels import KINDS, LevelKind
from ucf.format.spelling import (
    ALIASES,
    BLOCK_ALIASES,
    NAMED,
    check_maps,
    letters_fit_better,
    level_kinds,
    named_levels,
    parse_level_map,
)
from ucf.format.values import Values, parse_values, reject_nonnumeric, value_dtype

_FILL = re.compile(r"(.*?)\s+fill\s*=\s*(\S*)\s*", re.DOTALL)


@dataclass(frozen=True)
class Format:
    """An immutable storage format: level kinds outer to inner, what each stores, how
    the values are held (``None``: in the type the kernel computes in), and the value
    an absent entry reads as (``fill``: 0, or ``-inf`` for masked attention scores;
    TACO's and Finch's fill value; written ``csr fill=-inf``).

    ``maps`` may be given as mode numbers (a mode ordering) or as ``LevelMap``s.
    """

    levels: tuple[LevelKind, ...]
    maps: tuple[LevelMap, ...]
    values: Values | None = None
    fill: float = 0.0

    def __post_init__(self) -> None:
        maps = tuple(m if isinstance(m, LevelMap) else LevelMap(int(m)) for m in self.maps)
        object.__setattr__(self, "maps", maps)
        fill = float(self.fill)
        if math.isnan(fill):
            raise FormatError("a fill value cannot be NaN: absent entries must equal it")
        if all(k.full for k in self.levels):
            fill = 0.0  # a dense tensor stores every entry: nothing reads a fill
        object.__setattr__(self, "fill", fill + 0.0)  # -0.0 is 0
        if fill and (not all(m.plain for m in maps) or any(k.segment_width for k in self.levels)):
            raise FormatError(
                f"format '{self}': a fill value other than 0 on a blocked or fixed-width "
                "format is not supported (their blocks and slots are padded with zeros)"
            )

    def with_fill(self, fill: float) -> Format:
        """The same format whose absent entries read as ``fill``."""
        return replace(self, fill=fill)

    @property
    def order(self) -> int:
        """The tensor's order (its number of modes); ``len(levels)`` may be larger."""
        return len({m.mode for m in self.maps})

    @property
    def mode_order(self) -> tuple[int, ...]:
        """The mode each level stores (repeated for blocked modes)."""
        return tuple(m.mode for m in self.maps)

    @property
    def blocked(self) -> bool:
        """Whether some level stores a block index or an offset in a block."""
        return not all(m.plain for m in self.maps)

    @property
    def fixed_width(self) -> bool:
        """Whether some level stores a fixed number of entries per parent (``ell(w)``,
        ``nm(n,m)``): rows whose loops have the same trip count."""
        return any(k.segment_width is not None for k in self.levels)

    @classmethod
    def dense(cls, order: int, mode_order: Sequence[int] | None = None) -> Format:
        """Dense levels storing the modes in ``mode_order`` (default: their own order,
        one object per order, so the per-call check that an operand is dense is ``is``)."""
        if not mode_order:
            return _dense(order)
        return cls(tuple(KINDS["U"] for _ in range(order)), tuple(mode_order))

    @classmethod
    def compressed(
        cls, order: int, dense: int = 0, mode_order: Sequence[int] | None = None
    ) -> Format:
        """``dense`` dense levels, then compressed ones (CSR is ``compressed(2, 1)``, CSF
        ``compressed(3)``), storing the modes in ``mode_order``."""
        kinds = [KINDS["U"]] * dense + [KINDS["C"]] * (order - dense)
        return cls(tuple(kinds), tuple(mode_order or range(order)))

    @classmethod
    def blocked_rows(
        cls, bh: int, bw: int, columns: bool = False, places_by_column: bool | None = None
    ) -> Format:
        """Blocks of ``bh`` x ``bw`` in compressed rows of blocks (``bcsr(bh,bw)``), each
        stored row-major; ``columns``: in compressed columns of blocks, each stored
        column-major (the same matrix read column by column). ``places_by_column``
        overrides how a block stores its places: ``bcsc(bh,bw)`` is ``columns=True,
        places_by_column=False``."""
        outer = (LevelMap(0, div=bh), LevelMap(1, div=bw))
        inner = (LevelMap(0, mod=bh), LevelMap(1, mod=bw))
        if columns:
            outer = outer[::-1]
        if columns if places_by_column is None else places_by_column:
            inner = inner[::-1]
        kinds = (KINDS["U"], KINDS["C"], KINDS["U"], KINDS["U"])
        return cls(kinds, outer + inner)

    @classmethod
    def ell(cls, order: int, width: int) -> Format:
        """ELL (``ell(w)``): dense levels over every mode but the last, which keeps
        ``width`` coordinates per row."""
        kinds = [KINDS["U"]] * (order - 1) + [KINDS["F"].with_parameter(width)]
        return cls(tuple(kinds), tuple(range(order)))

    @classmethod
    def dynamic(cls, order: int) -> Format:
        """STile's index of live tiles: dense levels over every mode but the last, and an
        unordered compressed last one (its live tiles, listed in any order)."""
        return cls(tuple([KINDS["U"]] * (order - 1) + [KINDS["Q"]]), tuple(range(order)))

    @classmethod
    def tiled(cls, tile: Sequence[int]) -> Format:
        """Dense levels over micro-tiles of ``tile`` (one extent per mode): a mode whose
        extent is above 1 is stored as its tile, then its place in the tile, as a
        blocked format stores blocks (``UUU:0/32,0%32,1`` for tiles of 32 x 1)."""
        maps = []
        for mode, b in enumerate(tile):
            maps += [LevelMap(mode, div=b), LevelMap(mode, mod=b)] if b > 1 else [LevelMap(mode)]
        return cls(tuple(KINDS["U"] for _ in maps), tuple(maps))

    @classmethod
    def workspace_list(cls) -> Format:
        """A kernel's list of the coordinates a workspace was touched at: one level that
        its consumer walks as a compressed one (``ucf.format.levels.workspace``)."""
        return cls((KINDS["W"],), (0,))

    def with_mode_order(self, mode_order: Sequence[int]) -> Format:
        """The same level kinds and values, storing the modes in ``mode_order`` (plain
        maps only: a blocked format's maps are its own)."""
        return Format(self.levels, tuple(mode_order), self.values)

    def with_levels(self, levels: Sequence[LevelKind]) -> Format:
        """The same maps and values over other level kinds (one per map)."""
        return Format(tuple(levels), self.maps, self.values)

    def level_dims(self, shape: tuple[int, ...]) -> list[int]:
        """Each level's dimension for a tensor of ``shape``."""
        return [m.size(shape[m.mode]) for m in self.maps]

    def level_coords(self, coords: np.ndarray) -> np.ndarray:
        """Mode coordinates (entries x modes) as level coordinates (entries x levels)."""
        if not self.blocked:
            return coords[:, list(self.mode_order)]
        lc = np.empty((len(coords), len(self.maps)), dtype=np.int64)
        for lvl, m in enumerate(self.maps):
            lc[:, lvl] = m.coordinate(coords[:, m.mode])
        return lc

    def mode_coords(self, cols: list[np.ndarray], count: int) -> np.ndarray:
        """Level coordinate columns back to mode coordinates (``count`` x modes): each
        mode's coordinate is the sum of its levels' coordinates times their ``div``."""
        coords = np.zeros((count, self.order), dtype=np.int64)
        for col, m in zip(cols, self.maps, strict=True):
            coords[:, m.mode] += col * m.div if m.div != 1 else col
        return coords

    @cached_property
    def structure(self) -> Format:
        """The levels and maps alone: two tensors whose formats have one structure share
        their index arrays whatever their values are."""
        return replace(self, values=None) if self.values else self

    def with_structure(self, levels: tuple[LevelKind, ...], maps: tuple) -> Format:
        """Other levels and maps holding the same values (a converted or split format)."""
        return Format(levels, maps, self.values, self.fill)

    @property
    def letters(self) -> str:
        return "".join(k.spelling for k in self.levels)

    @property
    def is_dense(self) -> bool:
        return all(k.full for k in self.levels)

    def unique(self, level: int) -> bool:
        """A level is non-unique exactly when a singleton level hangs below it."""
        return not (level + 1 < len(self.levels) and self.levels[level + 1].branchless)

    def run_end(self, level: int) -> int:
        """One past the last branchless level below ``level``: the levels that share its
        positions (a COO run ``C S S``)."""
        end = level + 1
        while end < len(self.levels) and self.levels[end].branchless:
            end += 1
        return end

    def level_of_mode(self, mode: int) -> int:
        return self.mode_order.index(mode)

    @cached_property
    def name(self) -> str:
        """The format as users spell it: a name that parses to exactly this format
        (``bcsr(4,4)``, ``csr``, ``nm(2,4)``) where one does, else its levels (``UCUU:...``).
        Messages use it, so they show what the user wrote, not the levels behind it.
        Cached: finding it parses candidate names, and a kernel that converts an operand
        on every call spells its format on every call."""
        values = f"@{self.values}" if self.values else ""
        values += _fill_text(self.fill)
        for candidate in self._names():
            try:
                plain = replace(self, values=None, fill=0.0)
                if parse_format(candidate, order=self.order) == plain:
                    return candidate + values
            except FormatError:
                continue
        return str(self)

    def _names(self) -> list[str]:
        """Names that might spell this format: the plain aliases, and the blocked and
        fixed-width ones with the sizes its maps and levels hold."""
        names = list(ALIASES)  # parsed at this format's order, so dense and coo fit too
        mods = [m.mod for m in self.maps if m.mod]
        if len(mods) == 2:
            names += [f"{n}({mods[0]},{mods[1]})" for n in BLOCK_ALIASES]
        widths = [k.segment_width for k in self.levels if k.segment_width]
        if len(widths) == 1:
            names.append(f"ell({widths[0]})")
            names += [f"nm({widths[0]},{m})" for m in mods[:1]]
        return names

    def stored_dtype(self, dtype: Any, found: Any) -> np.dtype:
        """The dtype a tensor in this format holds when built from values of dtype ``found``
        with ``dtype`` asked for: the values this format states, else ``dtype``, else
        ``found``. A cast (to a stated or an asked dtype) refuses inputs that are not numbers."""
        if dtype is None and self.values is None:
            return value_dtype(found)
        if self.values is not None and not self.values.plain:
            raise FormatError(
                f"format '{self}' holds {self.values} values, which this constructor cannot "
                "build; use ucf.from_numpy, from_scipy, from_coo or ucf.quantize"
            )
        reject_nonnumeric(np.dtype(found))
        if self.values is None:
            return value_dtype(dtype)
        if dtype is not None and value_dtype(dtype) != self.values.dtype:
            raise FormatError(
                f"format '{self}' holds {self.values} values but dtype={value_dtype(dtype)} was "
                "asked for; give one of them"
            )
        return self.values.dtype

    def __str__(self) -> str:
        text = self.letters
        if self.maps != tuple(LevelMap(m) for m in range(len(self.levels))):
            text += ":" + ",".join(map(str, self.maps))
        return text + (f"@{self.values}" if self.values else "") + _fill_text(self.fill)

    def __repr__(self) -> str:
        return f"Format('{self}')"


@cache
def _dense(order: int) -> Format:
    return Format(tuple(KINDS["U"] for _ in range(order)), tuple(range(order)))


def parse_formats(given: Mapping[str, Any] | None, orders: Mapping[str, int]) -> dict[str, Format]:
    """The formats of a statement's tensors as given at the API (text or ``Format``, by
    tensor), parsed once, each checked against the tensor's order (``orders``: every
    tensor of the statement); a tensor the statement does not use is refused."""
    out = {}
    for name, spelled in (given or {}).items():
        if name not in orders:
            raise OperandError(
                f"formats names tensor {name}, which the statement does not use "
                f"(tensors: {', '.join(orders)})"
            )
        out[name] = parse_format(spelled, order=orders[name], tensor=name)
    return out


def _fill_text(fill: float) -> str:
    """How format text writes a fill value (nothing for 0)."""
    if not fill:
        return ""
    if math.isinf(fill):
        return " fill=-inf" if fill < 0 else " fill=inf"
    return f" fill={fill!r}"


def _parse_fill(text: str, source: str, who: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise FormatError(
            f"bad format '{source}'{who}: fill value '{text}' is not a number "
            "(write fill=-inf, fill=inf or a number such as fill=1)"
        )
    return value


@boundary
def parse_format(text: str | Format, order: int | None = None, tensor: str = "") -> Format:
    """Parse ``UC``, ``UC:1,0`` or an alias, each optionally followed by ``@`` and a
    value description (``csr@float32``) and by the value absent entries read as
    (``csr fill=-inf``); ``order`` checks (and sizes aliases)."""
    if isinstance(text, Format):
        fmt = text
    else:
        who = f" for tensor {tensor}" if tensor else ""
        spec, fill = str(text), 0.0
        filled = _FILL.fullmatch(spec)
        if filled is not None:
            spec, fill = filled.group(1), _parse_fill(filled.group(2), str(text), who)
        levels, at, values = spec.partition("@")
        fmt = _parse(levels, order, tensor)
        if at:
            fmt = replace(fmt, values=parse_values(values, str(text), who, len(fmt.levels)))
        if fill:
            try:
                fmt = fmt.with_fill(fill)
            except FormatError as e:
                raise FormatError(f"bad format '{text}'{who}: {e}") from None
    if order is not None and fmt.order != order:
        who = f" of tensor {tensor}" if tensor else ""
        shown = str(text).strip()
        read = f" (read as '{fmt}')" if shown.upper() != str(fmt) else ""
        raise FormatError(
            f"format '{shown}'{read}{who} has {len(fmt.levels)} levels over {fmt.order} modes but "
            f"the tensor has order {order}"
        )
    _check_structure(fmt, tensor)
    return fmt


def _parse(text: str, order: int | None, tensor: str) -> Format:
    who = f" for tensor {tensor}" if tensor else ""
    src = text.strip()
    named = NAMED.fullmatch(src)
    if named is not None:
        src = named_levels(named.group(1).lower(), named.group(2), order, text, who)
    alias = src.lower()
    if alias in ALIASES and not letters_fit_better(alias, src, order):
        if ALIASES[alias] is not None:
            src = ALIASES[alias]
        else:
            n = order if order is not None else 2
            if n == 0:
                return Format((), ())
            letters = {"dense": "U" * n, "coo": "C" + "S" * (n - 1), "csf": "C" * n}[alias]
            return Format(tuple(KINDS[c] for c in letters), tuple(range(n)))
    letters, _, modes = src.partition(":")
    letters = letters.strip().upper()
    if not letters and order == 0 and not modes:
        return Format((), ())
    kinds = level_kinds(letters, text, who)
    if modes.strip():
        maps = tuple(parse_level_map(item, text, who) for item in modes.split(","))
    else:
        maps = tuple(LevelMap(m) for m in range(len(kinds)))
    if len(maps) != len(kinds):
        raise FormatError(
            f"bad format '{text}'{who}: {len(kinds)} levels but {len(maps)} entries after ':'"
        )
    check_maps(maps, text, who)
    return Format(kinds, maps)


def _check_structure(fmt: Format, tensor: str) -> None:
    who = f" of tensor {tensor}" if tensor else ""
    for lvl, kind in enumerate(fmt.levels):
        if kind.branchless and (lvl == 0 or fmt.levels[lvl - 1].full):
            raise FormatError(
                f"format '{fmt}'{who}: singleton level {lvl} must follow a compressed "
                "or singleton level (e.g. 'CS' is COO)"
            )


#: The formats scipy stores natively, for zero-copy interchange.
CSR = Format((KINDS["U"], KINDS["C"]), (0, 1))
CSC = Format((KINDS["U"], KINDS["C"]), (1, 0))
DCSR = Format((KINDS["C"], KINDS["C"]), (0, 1))
