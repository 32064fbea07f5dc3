"""TACO's format letters (``-f=A:ds``) in ucf's.

The two spellings clash: TACO's ``s`` (sparse) is ucf's ``C`` (compressed), while
ucf's ``S`` is a singleton, TACO's ``q``. So ucf never reads TACO's letters as its
own; ``ucf taco`` translates them here, and a format that only makes sense as
TACO's letters is refused with its translation (:func:`hint`).
"""

from __future__ import annotations

from ucf.errors import FormatError

#: TACO's mode formats: letter -> (ucf letter, what TACO calls it).
LETTERS = {
    "d": ("U", "dense"),
    "s": ("C", "sparse (compressed)"),
    "z": ("C", "sparse without stored zeros"),
    "u": ("C", "sparse, not unique"),
    "q": ("S", "singleton"),
    "c": ("S", "singleton, not unique"),
    "p": ("", "singleton, padded"),
}


def from_taco(letters: str, ordering: str = "") -> str:
    """ucf's format for TACO's ``letters`` and optional mode ``ordering`` (``"1,0"``).

    ucf stores duplicates of a coordinate only in the levels above singletons (its
    COO, ``CS``, is TACO's ``uq``), so TACO's not-unique kinds are taken there and
    refused elsewhere, as is the padded singleton."""
    kinds = []
    for k, letter in enumerate(letters):
        if letter not in LETTERS:
            raise FormatError(
                f"TACO format '{letters}': '{letter}' is not one of TACO's mode formats "
                f"({', '.join(f'{k} {v[1]}' for k, v in LETTERS.items())})"
            )
        ucf, name = LETTERS[letter]
        below_singleton = letters[k + 1 : k + 2] in ("q", "c")
        if letter == "p" or (letter in "uc" and not below_singleton):
            raise FormatError(
                f"TACO format '{letters}': ucf has no {name} level "
                + ("" if letter == "p" else "except above a singleton (TACO's uq is COO) ")
                + "at level "
                + str(k)
            )
        kinds.append(ucf)
    text = "".join(kinds)
    if ordering:
        modes = [m.strip() for m in ordering.split(",")]
        if sorted(modes) != [str(m) for m in range(len(letters))]:
            raise FormatError(
                f"TACO format '{letters}:{ordering}': the mode ordering must list each of the "
                f"{len(letters)} modes once"
            )
        text += ":" + ",".join(modes)
    return text


def hint(text: str) -> str:
    """For a format ucf refuses: if it reads as TACO's letters, what ucf calls it."""
    letters, _, ordering = text.partition(":")
    if not letters or not set(letters) <= set(LETTERS):
        return ""
    try:
        ucf = from_taco(letters, ordering)
    except FormatError:
        return ""
    return (
        f"; '{text}' reads as TACO's letters, which are ucf's '{ucf}' (ucf's S is a "
        "singleton, TACO's s compressed); `ucf taco` takes TACO's spelling"
    )
