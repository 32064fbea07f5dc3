"""Pieces of LLVM IR text that the compiled passes over index arrays
(``ucf.exec.array_checks``) are written with: an index widened to i64 or narrowed
back, an array read, the counted loop every pass runs, a segment's bounds, a loop
over segments and the branch-free count of indices that fall. Each check then says
only what it reads and what it keeps; a new pass over ``pos`` and ``crd`` starts
here. ``t`` is always the index type, ``i32`` or ``i64``."""

from __future__ import annotations


def widened(t: str, value: str, to: str) -> str:
    """IR that makes ``value`` (of type ``t``) an i64 named ``to``: sign- or zero-
    extended, or the value itself under another name."""
    if t == "i64":
        return f"  %{to} = add i64 {value}, 0\n"
    return f"  %{to} = {{ext}} {t} {value} to i64\n"


def narrowed(t: str, value: str, to: str) -> str:
    """IR that makes the i64 ``value`` a ``t`` named ``to``."""
    if t == "i64":
        return f"  %{to} = add i64 {value}, 0\n"
    return f"  %{to} = trunc i64 {value} to {t}\n"


def loaded(t: str, array: str, at: str, name: str) -> str:
    """IR that reads ``array[at]`` (a ``t``) into ``%name``, its address ``%name.at``."""
    return (
        f"  %{name}.at = getelementptr inbounds {t}, {t}* %{array}, i64 {at}\n"
        f"  %{name} = load {t}, {t}* %{name}.at\n"
    )


def counted_loop(
    label: str,
    entry: str,
    counter: str,
    bounds: tuple[str, str],
    carried: tuple[tuple[str, str, str, str], ...],
    body: str,
    exit: str,
    skip: str | None,
    compare: str = "slt",
) -> str:
    """The counted loop the checks share: block ``label``, entered from block
    ``entry``, runs ``body`` for ``%counter`` from ``bounds[0]`` while ``%counter1``
    (the next, defined after the body) is below ``bounds[1]`` (``compare``), then
    goes to ``exit``; with ``skip``, it ends block ``entry`` with the test that goes
    there instead when the loop would not run once. Each of ``carried`` (name, type,
    first value, next value) is a value the body updates. Written once, so each check
    says only what it reads and what it keeps."""
    phis = "".join(
        f"  %{name} = phi {ty} [{first}, %{entry}], [{after}, %{label}]\n"
        for name, ty, first, after in ((counter, "i64", bounds[0], f"%{counter}1"), *carried)
    )
    guard = (
        f"  %{label}.any = icmp sgt i64 {bounds[1]}, {bounds[0]}\n"
        f"  br i1 %{label}.any, label %{label}, label %{skip}\n"
        if skip
        else ""
    )
    return (
        f"{guard}{label}:\n{phis}{body}  %{counter}1 = add nuw nsw i64 %{counter}, 1\n"
        f"  %{label}.more = icmp {compare} i64 %{counter}1, {bounds[1]}\n"
        f"  br i1 %{label}.more, label %{label}, label %{exit}\n"
    )


def segment_bounds(t: str, at: str, after: str, first: str, last: str) -> str:
    """IR that reads a segment's bounds: ``pos[at]`` into ``%first`` and ``pos[at + 1]``
    (its index ``%after``) into ``%last``."""
    return (
        loaded(t, "pos", at, first)
        + f"  %{after} = add nuw nsw i64 {at}, 1\n"
        + loaded(t, "pos", f"%{after}", last)
    )


def each_segment(
    t: str, entry: str, start: str, carried: tuple, body: str, exit: str, skip: str
) -> str:
    """A loop ``row`` (``counted_loop``) over the segments ``%k`` of ``pos`` from ``start`` to
    ``%major``, each one's bounds read into ``%a`` and ``%b`` before ``body``."""
    bounds = segment_bounds(t, "%k", "k.up", "a", "b")
    return counted_loop("row", entry, "k", (start, "%major"), carried, bounds + body, exit, skip)


def count_falls(t: str, count: str) -> str:
    """The end of a loop's body over ``crd`` at ``%q`` (from 1), ``crd[q]`` read into
    ``%c``: ``%<count>1`` is ``%count`` plus 1 when ``%c`` is at most the index before
    it. Counted with no branch, so the pass vectorizes."""
    return (
        "  %qm = add nsw i64 %q, -1\n"
        + loaded(t, "crd", "%qm", "before")
        + f"""  %le = icmp sle {t} %c, %before
  %le64 = zext i1 %le to i64
  %{count}1 = add i64 %{count}, %le64
"""
    )
