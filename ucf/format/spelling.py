"""How format text spells a format's pieces: the names users write (``csr``,
``bcsr(bh,bw)``, ``ell(w)``, ``nm(n,m)``) and the levels behind them, level letters
and level maps (``0/32``), each read and checked against what the user wrote.
``ucf.format.format.parse_format`` assembles a ``Format`` from them, and
``Format.name`` looks its own name up among the names spelled here."""

from __future__ import annotations

import re

from ucf.errors import FormatError
from ucf.format import taco_letters
from ucf.format.level_map import LevelMap
from ucf.format.levels import KINDS, LevelKind

ALIASES = {
    "dense": None,  # expands to one U per mode
    "csr": "UC",
    "csc": "UC:1,0",
    "dcsr": "CC",
    "dcsc": "CC:1,0",
    "coo": None,  # C followed by S for every further mode
    "csf": None,  # C for every mode
}

#: Blocked formats by name, ``bcsr(bh, bw)`` etc.: blocks of bh x bw, stored row-major
#: inside; ``bcsc`` orders the blocks by column (as torch's ``sparse_bsc``).
BLOCK_ALIASES = {
    "bcsr": "UCUU:0/{h},1/{w},0%{h},1%{w}",
    "bcsc": "UCUU:1/{w},0/{h},0%{h},1%{w}",
    "bdcsr": "CCUU:0/{h},1/{w},0%{h},1%{w}",
}
#: Fixed-width formats by name (see ``ucf.format.levels.fixed``), each its parameter
#: names and its levels: every mode dense but the last. ``ell(w)`` keeps w coordinates
#: of the last mode per row (ELL); ``nm(n, m)`` cuts the last mode into groups of m and
#: keeps n places of each (N:M sparsity, 2:4 is ``nm(2,4)``). ``{u}`` stands for the
#: dense levels, ``{modes}`` for their maps and ``{last}`` for the last mode.
WIDTH_ALIASES = {
    "ell": (("w",), "{u}F{w}"),
    "nm": (("n", "m"), "{u}UF{n}:{modes}{last}/{m},{last}%{m}"),
}
NAMED = re.compile(r"\s*([A-Za-z]+)\s*\(\s*(\d+(?:\s*,\s*\d+)*)\s*\)\s*")
_LEVEL = re.compile(r"(.)(\d*)")


def named_levels(name: str, args: str, order: int | None, text: str, who: str) -> str:
    """The levels behind ``bcsr(2,3)``, ``ell(4)`` or ``nm(2,4)`` (for a tensor of ``order``)."""
    values = [int(a) for a in args.split(",")]
    if name in BLOCK_ALIASES and len(values) == 2:
        if min(values) < 1:
            raise FormatError(f"bad format '{text}'{who}: block sizes must be positive")
        return BLOCK_ALIASES[name].format(h=values[0], w=values[1])
    params, levels = WIDTH_ALIASES.get(name, ((), ""))
    if not params or len(values) != len(params):
        known = [f"{n}(bh, bw)" for n in BLOCK_ALIASES]
        known += [f"{n}({', '.join(p)})" for n, (p, _) in WIDTH_ALIASES.items()]
        raise FormatError(
            f"bad format '{text}'{who}: unknown format '{name}' with {len(values)} "
            f"parameter(s) (one of {', '.join(known)})"
        )
    given = dict(zip(params, values, strict=True))
    if min(values) < 1:
        raise FormatError(f"bad format '{text}'{who}: {', '.join(params)} must be positive")
    if given.get("n", 0) > given.get("m", 1):
        raise FormatError(
            f"bad format '{text}'{who}: n = {given['n']} nonzeros cannot exceed the group "
            f"size m = {given['m']}"
        )
    n = 2 if order is None else order
    if n < 1:
        raise FormatError(f"bad format '{text}'{who}: '{name}' needs a tensor of order 1 or more")
    modes = "".join(f"{m}," for m in range(n - 1))
    return levels.format(u="U" * (n - 1), modes=modes, last=n - 1, **given)


def _stored() -> str:
    """The letters of the kinds tensors are stored in (a kernel's own, such as a
    workspace's list, are left out)."""
    return ", ".join(letter for letter, kind in KINDS.items() if kind.stored)


def level_kinds(letters: str, text: str, who: str) -> tuple[LevelKind, ...]:
    """The level kinds ``letters`` spells, each a letter with any number it takes (``UF4``)."""
    kinds = []
    for token in _LEVEL.finditer(letters):
        letter, number = token.groups()
        if letter not in KINDS or not KINDS[letter].stored:
            raise FormatError(
                f"bad format '{text}'{who}: level kind {letter!r} is not one of "
                f"{_stored()} (or an alias: {', '.join(ALIASES)}, or "
                f"{', '.join(f'{n}(...)' for n in [*BLOCK_ALIASES, *WIDTH_ALIASES])})"
                + taco_letters.hint(text.strip())
            )
        kind = KINDS[letter]
        if number:
            try:
                kind = kind.with_parameter(int(number))
            except FormatError as e:
                raise FormatError(f"bad format '{text}'{who}: {e}") from None
        elif kind.parameter is not None:
            raise FormatError(
                f"bad format '{text}'{who}: level kind {letter!r} ({kind.name}) takes its "
                f"{kind.parameter} after the letter, e.g. '{letter}4'"
            )
        kinds.append(kind)
    if not kinds:
        raise FormatError(
            f"bad format '{text}'{who}: level kind '(empty)' is not one of "
            f"{_stored()} (or an alias: {', '.join(ALIASES)})"
        )
    return tuple(kinds)


_MAP = re.compile(r"\s*(\d+)\s*(?:/\s*(\d+))?\s*(?:%\s*(\d+))?\s*")


def parse_level_map(item: str, text: str, who: str) -> LevelMap:
    """``m``, ``m/b`` (the block of size b), ``m%b`` (the place in it) or ``m/b%c``."""
    match = _MAP.fullmatch(item)
    if match is None:
        raise FormatError(
            f"bad format '{text}'{who}: '{item.strip()}' after ':' is not a mode ('0'), a "
            "block index ('0/32') or an offset in a block ('0%32')"
        )
    mode, div, mod = match.groups()
    lm = LevelMap(int(mode), int(div or 1), int(mod or 0))
    if lm.div < 1 or (mod is not None and lm.mod < 1):
        raise FormatError(f"bad format '{text}'{who}: block sizes in '{lm}' must be positive")
    return lm


def letters_fit_better(alias: str, src: str, order: int | None) -> bool:
    """Whether ``src`` should be read as level letters rather than as the alias it also
    spells: ``CSC`` for an order-3 tensor is compressed, singleton, compressed, since
    the alias ``csc`` is a matrix format."""
    fixed = ALIASES[alias]
    if fixed is None or order is None:
        return False
    levels = len(fixed.partition(":")[0])
    return levels != order and len(src) == order and all(c in KINDS for c in src.upper())


def check_maps(maps: tuple[LevelMap, ...], text: str, who: str) -> None:
    """Each mode 0..n-1 appears, and its levels split its coordinate in mixed radix:
    the outermost ``m/b0``, then ``m/b1%(b0/b1)`` ..., the innermost ``m%bk``."""
    modes = sorted({m.mode for m in maps})
    if modes != list(range(len(modes))):
        raise FormatError(
            f"bad format '{text}'{who}: the modes after ':' ({', '.join(map(str, modes))}) "
            f"are not 0..{len(modes) - 1}"
        )
    for mode in modes:
        chain = [m for m in maps if m.mode == mode]
        for k, m in enumerate(chain):
            last = k == len(chain) - 1
            above = chain[k - 1].div if k else 0
            ok = (m.div == 1 or not last) and (not k or above % m.div == 0)
            if not ok or m.mod != (above // m.div if k else 0):
                shown = ",".join(map(str, chain))
                raise FormatError(
                    f"bad format '{text}'{who}: the levels of mode {mode} ({shown}) do not "
                    f"split its coordinate into blocks: write '{mode}' alone, or "
                    f"'{mode}/b' before '{mode}%b' (nested: '{mode}/b', '{mode}/c%(b/c)', "
                    f"'{mode}%c')"
                )
