"""Fibertree pictures of a tensor's storage: the drawing this field uses to explain
formats (a root, one row of coordinates per level, the values under the last).

One layout, two renderers: :func:`svg` writes SVG text (Jupyter's ``_repr_svg_``,
``ucf.show(t, "a.svg")``, ``ucf serve``), :func:`png` draws the same layout with
matplotlib. Every level is unpacked by its own level kind (``LevelKind.unpack``),
so a new kind draws without changes here. A large tensor is drawn in part, the
first positions of each level, and the picture says how many it leaves out.
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ucf.errors import MissingDependencyError

#: At most this many leaf slots (last-level positions, and positions with no
#: children) are drawn; beyond it the first positions of each level are.
MAX_SLOTS = 32
SLOT = 34  # horizontal pixels per slot
ROW = 58  # vertical pixels per level
RADIUS = 12
LEFT = 172  # the level labels' column
TOP = 44
#: Fill colour of a level kind's nodes, by letter.
COLOURS = {"U": "#d9d9d9", "C": "#9ecae1", "S": "#a1d99b", "F": "#fdae6b", "Q": "#bcbddc"}


@dataclass
class Node:
    level: int  # -1: the root; the tensor's levels count from 0
    pos: int  # its position in the level
    label: str
    parent: int | None  # index of the parent in Layout.nodes
    x: float = 0.0


@dataclass
class Layout:
    """What both renderers draw: nodes with places, rows with labels, and notes."""

    title: str
    nodes: list[Node]
    values: list[tuple[int, str]]  # (node index of a last-level position, value text)
    rows: list[str]  # one label per level
    kinds: list[str]  # each level's letter
    notes: list[str] = field(default_factory=list)
    width: float = 0.0

    @property
    def height(self) -> float:
        return TOP + ROW * (len(self.rows) + 1) + 30 + 16 * len(self.notes)


def layout(t: Any, name: str = "T") -> Layout:
    """The picture of Tensor ``t``'s levels (at most :data:`MAX_SLOTS` leaf slots)."""
    fmt = t.format
    dims = fmt.level_dims(t.shape)
    total = t.level_sizes()
    first = min(total[0], MAX_SLOTS) if total else 0  # each takes a slot at least
    lo, hi = 1, max(first, 1)
    while lo < hi:  # the most top-level positions whose subtrees fit
        mid = (lo + hi + 1) // 2
        # A level of more than MAX_SLOTS positions has more leaf slots below it, so
        # capping the levels there still tells whether the subtrees fit.
        if _slots(_prefix(t, dims, mid, MAX_SLOTS + 1)) <= MAX_SLOTS:
            lo = mid
        else:
            hi = mid - 1
    levels = _prefix(t, dims, min(lo, first), MAX_SLOTS)
    nodes = [Node(-1, 0, name, None)]
    values = []
    numbers = t.numbers() if fmt.levels else t.vals
    index: dict[tuple[int, int], int] = {(-1, 0): 0}
    for lvl, (parent, coord) in enumerate(levels):
        for p, (up, c) in enumerate(zip(parent.tolist(), coord.tolist(), strict=True)):
            index[lvl, p] = len(nodes)
            nodes.append(Node(lvl, p, str(c), index[lvl - 1, up]))
    last = len(levels) - 1
    for i, n in enumerate(nodes):
        if n.level == last:
            values.append((i, _number(numbers[n.pos])))
    _place(nodes)
    kinds = [k.spelling for k in fmt.levels]
    rows = [f"{k.spelling} · mode {m}" for k, m in zip(fmt.levels, fmt.maps, strict=True)]
    shown = [len(p) for p, _ in levels]
    notes = [
        f"level {lvl}: the first {s} of {n} positions"
        for lvl, (s, n) in enumerate(zip(shown, total, strict=True))
        if s < n
    ]
    shape = "×".join(map(str, t.shape)) or "scalar"
    title = f"{name}: {fmt.name} ({fmt}), {shape}, {t.nnz} stored, {t.dtype}"
    width = LEFT + SLOT * (max((n.x for n in nodes), default=0) + 1) + 20
    return Layout(title, nodes, values, rows, kinds, notes, max(width, 8.0 * len(title) + 20))


def _prefix(t: Any, dims: list[int], first: int, cap: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each level's (parent, coordinate) arrays for the subtrees of the first ``first``
    top-level positions, no level keeping more than its first ``cap`` positions. Only
    the parents those need are unpacked, so a huge tensor costs what is drawn."""
    levels = []
    count = 1  # the root
    for lvl, kind in enumerate(t.format.levels):
        want = min(first, cap) if lvl == 0 else cap
        given, dim = t.levels[lvl], dims[lvl]
        size = functools.partial(_size, kind, given, dim)
        n = count
        if size(n) > want:  # the fewest parents whose children reach ``want``
            lo, hi = 1, n
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if size(mid) >= want else (mid + 1, hi)
            n = lo
        (parent, coord), m = kind.unpack(_cut(given, n, size(n)), dim, [np.arange(n)], n)
        parent, coord = parent[:want], coord[:want]
        levels.append((parent, coord))
        count = len(parent)
    return levels


def _size(kind: Any, arrays: dict[str, np.ndarray], dim: int, parents: int) -> int:
    """Positions a level holds under its first ``parents`` parents."""
    return kind.size(_cut(arrays, parents), parents, dim)


def _cut(arrays: dict[str, np.ndarray], parents: int, positions: int | None = None) -> dict:
    """A level's arrays for its first ``parents`` parents (and ``positions`` positions):
    ``pos`` has one entry per parent and one more, ``crd`` one per position."""
    cut = dict(arrays)
    if "pos" in cut:
        cut["pos"] = cut["pos"][: parents + 1]
    if "crd" in cut and positions is not None:
        cut["crd"] = cut["crd"][:positions]
    return cut


def _slots(levels: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Leaf slots of a tree: last-level positions, and positions without children."""
    if not levels:
        return 1
    childless = sum(
        len(above[0]) - len(np.unique(below[0]))
        for above, below in zip(levels, levels[1:], strict=False)
    )
    return len(levels[-1][0]) + childless


def _place(nodes: list[Node]) -> None:
    """Leaves (and childless nodes) one slot apart in order; parents over their children."""
    children: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        if n.parent is not None:
            children.setdefault(n.parent, []).append(i)
    slot = 0

    def visit(i: int) -> None:
        nonlocal slot
        kids = children.get(i, [])
        if not kids:
            nodes[i].x = slot
            slot += 1
            return
        for k in kids:
            visit(k)
        nodes[i].x = (nodes[kids[0]].x + nodes[kids[-1]].x) / 2

    visit(0)


def _number(v: Any) -> str:
    v = v.item() if hasattr(v, "item") else v
    return f"{v:.2g}" if isinstance(v, float) else str(v)


def _xy(layout: Layout, n: Node) -> tuple[float, float]:
    return LEFT + SLOT * n.x + SLOT / 2, TOP + ROW * (n.level + 1)


# --------------------------------------------------------------------------- renderers


def svg(t: Any, name: str = "T") -> str:
    """The fibertree of ``t`` as SVG text. Nodes are ``<g class="node">`` elements with
    ``data-level`` and ``data-pos`` and values ``<g class="value">``, so the page and
    the tests can read the picture back."""
    lay = layout(t, name)
    root = ET.Element(
        "svg",
        xmlns="http://www.w3.org/2000/svg",
        width=f"{lay.width:.0f}",
        height=f"{lay.height:.0f}",
        viewBox=f"0 0 {lay.width:.0f} {lay.height:.0f}",
        attrib={"font-family": "monospace", "font-size": "12", "class": "fibertree"},
    )
    ET.SubElement(root, "title").text = lay.title
    ET.SubElement(root, "text", x="8", y="18", attrib={"font-weight": "bold"}).text = lay.title
    for lvl, label in enumerate(lay.rows):
        y = TOP + ROW * (lvl + 1) + 4
        row = ET.SubElement(root, "text", x="8", y=f"{y:.0f}", attrib={"class": "level-label"})
        row.text = f"level {lvl}: {label}"
    edges = ET.SubElement(root, "g", attrib={"class": "edges", "stroke": "#555"})
    for n in lay.nodes:
        if n.parent is not None:
            (x1, y1), (x2, y2) = _xy(lay, lay.nodes[n.parent]), _xy(lay, n)
            ET.SubElement(
                edges,
                "line",
                x1=f"{x1:.1f}",
                y1=f"{y1 + RADIUS:.1f}",
                x2=f"{x2:.1f}",
                y2=f"{y2 - RADIUS:.1f}",
                attrib={"class": "edge"},
            )
    for n in lay.nodes:
        x, y = _xy(lay, n)
        kind = "root" if n.level < 0 else "node"
        g = ET.SubElement(
            root, "g", attrib={"class": kind, "data-level": str(n.level), "data-pos": str(n.pos)}
        )
        fill = "#ffffff" if n.level < 0 else COLOURS.get(lay.kinds[n.level][0], "#eeeeee")
        ET.SubElement(
            g, "circle", cx=f"{x:.1f}", cy=f"{y:.1f}", r=str(RADIUS), fill=fill, stroke="#333"
        )
        ET.SubElement(
            g, "text", x=f"{x:.1f}", y=f"{y + 4:.1f}", attrib={"text-anchor": "middle"}
        ).text = n.label
    for i, text in lay.values:
        x, y = _xy(lay, lay.nodes[i])
        y += ROW * 0.75
        g = ET.SubElement(root, "g", attrib={"class": "value", "data-pos": str(lay.nodes[i].pos)})
        ET.SubElement(
            g,
            "rect",
            x=f"{x - SLOT / 2 + 2:.1f}",
            y=f"{y - 12:.1f}",
            width=str(SLOT - 4),
            height="18",
            fill="#fff7bc",
            stroke="#333",
        )
        ET.SubElement(
            g,
            "text",
            x=f"{x:.1f}",
            y=f"{y + 1:.1f}",
            attrib={"text-anchor": "middle", "font-size": "9"},
        ).text = text
    for k, note in enumerate(lay.notes):
        y = lay.height - 10 - 16 * (len(lay.notes) - 1 - k)
        ET.SubElement(root, "text", x="8", y=f"{y:.0f}", attrib={"class": "note"}).text = note
    return ET.tostring(root, encoding="unicode")


def png(t: Any, path: str | Path, name: str = "T", dpi: int = 100) -> Path:
    """The same picture as :func:`svg`, drawn with matplotlib into a PNG file."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Circle, Rectangle
    except ImportError:
        raise MissingDependencyError(
            "a PNG fibertree needs matplotlib, which is not installed: pip install matplotlib "
            "(or write .svg, which needs nothing)"
        ) from None

    lay = layout(t, name)
    fig = Figure(figsize=(lay.width / dpi, lay.height / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, lay.width)
    ax.set_ylim(lay.height, 0)
    ax.axis("off")
    text = {"family": "monospace", "fontsize": 9}
    ax.text(8, 18, lay.title, weight="bold", **text)
    for lvl, label in enumerate(lay.rows):
        ax.text(8, TOP + ROW * (lvl + 1) + 4, f"level {lvl}: {label}", **text)
    for n in lay.nodes:
        x, y = _xy(lay, n)
        if n.parent is not None:
            px, py = _xy(lay, lay.nodes[n.parent])
            ax.plot([px, x], [py + RADIUS, y - RADIUS], color="#555", linewidth=1)
        fill = "#ffffff" if n.level < 0 else COLOURS.get(lay.kinds[n.level][0], "#eeeeee")
        ax.add_patch(Circle((x, y), RADIUS, facecolor=fill, edgecolor="#333"))
        ax.text(x, y, n.label, ha="center", va="center", **text)
    for i, value in lay.values:
        x, y = _xy(lay, lay.nodes[i])
        y += ROW * 0.75
        ax.add_patch(
            Rectangle(
                (x - SLOT / 2 + 2, y - 12), SLOT - 4, 18, facecolor="#fff7bc", edgecolor="#333"
            )
        )
        ax.text(x, y - 3, value, ha="center", va="center", family="monospace", fontsize=7)
    for k, note in enumerate(lay.notes):
        ax.text(8, lay.height - 10 - 16 * (len(lay.notes) - 1 - k), note, **text)
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    return path
