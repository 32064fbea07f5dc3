"""Format strings: one level kind per storage level plus a mode ordering."""

from __future__ import annotations

from dataclasses import dataclass

from ucf.errors import FormatError
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


@dataclass(frozen=True)
class Format:
    """An immutable storage format: level kinds outer to inner and the mode each stores."""

    levels: tuple[LevelKind, ...]
    mode_order: tuple[int, ...]

    @property
    def order(self) -> int:
        return len(self.levels)

    @property
    def letters(self) -> str:
        return "".join(k.letter for k in self.levels)

    @property
    def is_dense(self) -> bool:
        return all(k.full for k in self.levels)

    def unique(self, level: int) -> bool:
        """A level is non-unique exactly when a singleton level hangs below it."""
        return not (level + 1 < self.order and self.levels[level + 1].branchless)

    def run_end(self, level: int) -> int:
        """One past the last branchless level below ``level``: the levels that share its
        positions (a COO run ``C S S``)."""
        end = level + 1
        while end < self.order and self.levels[end].branchless:
            end += 1
        return end

    def level_of_mode(self, mode: int) -> int:
        return self.mode_order.index(mode)

    def __str__(self) -> str:
        if self.mode_order == tuple(range(self.order)):
            return self.letters
        return self.letters + ":" + ",".join(map(str, self.mode_order))

    def __repr__(self) -> str:
        return f"Format('{self}')"


def dense_format(order: int) -> Format:
    return Format(tuple(KINDS["U"] for _ in range(order)), tuple(range(order)))


def parse_format(text: str | Format, order: int | None = None, tensor: str = "") -> Format:
    """Parse ``UC``, ``UC:1,0`` or an alias; ``order`` checks (and sizes aliases)."""
    if isinstance(text, Format):
        fmt = text
    else:
        fmt = _parse(str(text), order, tensor)
    if order is not None and fmt.order != order:
        who = f" of tensor {tensor}" if tensor else ""
        raise FormatError(
            f"format '{fmt}'{who} has {fmt.order} levels but the tensor has order {order}"
        )
    _check_structure(fmt, tensor)
    return fmt


def _parse(text: str, order: int | None, tensor: str) -> Format:
    who = f" for tensor {tensor}" if tensor else ""
    src = text.strip()
    alias = src.lower()
    if alias in ALIASES:
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
    bad = [c for c in letters if c not in KINDS]
    if not letters or bad:
        shown = bad[0] if bad else "(empty)"
        raise FormatError(
            f"bad format '{text}'{who}: level kind {shown!r} is not one of "
            f"{', '.join(KINDS)} (or an alias: {', '.join(ALIASES)})"
        )
    if modes.strip():
        try:
            mode_order = tuple(int(m) for m in modes.split(","))
        except ValueError:
            raise FormatError(
                f"bad format '{text}'{who}: the mode ordering after ':' must be "
                "comma-separated integers"
            ) from None
    else:
        mode_order = tuple(range(len(letters)))
    if sorted(mode_order) != list(range(len(letters))):
        raise FormatError(
            f"bad format '{text}'{who}: mode ordering {list(mode_order)} is not a "
            f"permutation of 0..{len(letters) - 1}"
        )
    return Format(tuple(KINDS[c] for c in letters), mode_order)


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
