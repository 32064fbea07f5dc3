"""Fibertree pictures (``ucf.show``, ``Tensor._repr_svg_``, ``ucf show``): the SVG is
read back and its nodes counted against the tensor's level arrays."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import rand_sparse
from ucf.cli import main
from ucf.format import fibertree

SVG = "{http://www.w3.org/2000/svg}"
FORMATS = [
    "dense", "csr", "csc", "dcsr", "dcsc", "coo", "UQ", "bcsr(2,3)", "bdcsr(2,2)", "ell(4)",
    "nm(2,4)", "UU:1,0",
]  # fmt: skip


def drawn(svg: str) -> dict[str, list[ET.Element]]:
    """The picture's nodes by level (``"-1"`` the root), and its values (``"values"``)."""
    root = ET.fromstring(svg)
    found: dict[str, list[ET.Element]] = {}
    for g in root.iter(f"{SVG}g"):
        kind = g.get("class")
        if kind in ("node", "root"):
            found.setdefault(g.get("data-level"), []).append(g)
        elif kind == "value":
            found.setdefault("values", []).append(g)
    return found


def labels(nodes: list[ET.Element]) -> list[str]:
    return [n.find(f"{SVG}text").text for n in nodes]


def level_coordinates(t: ucf.Tensor, lvl: int) -> list[int]:
    """Each position's coordinate at level ``lvl``, read from the arrays directly."""
    dims = t.format.level_dims(t.shape)
    arrays = t.levels[lvl]
    if "crd" in arrays:
        return arrays["crd"].tolist()
    return [p % dims[lvl] for p in range(t.level_sizes()[lvl])]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_position_is_a_node_with_its_coordinate(fmt):
    rng = np.random.default_rng(len(fmt))
    a = rand_sparse(rng, (4, 6), 0.3)
    t = ucf.from_numpy(a, fmt)
    svg = ucf.show(t, name="A")
    assert 'class="note"' not in svg  # drawn whole
    found = drawn(svg)
    assert labels(found["-1"]) == ["A"]
    for lvl, size in enumerate(t.level_sizes()):
        nodes = found.get(str(lvl), [])
        assert len(nodes) == size, (fmt, lvl)
        assert [int(x) for x in labels(nodes)] == level_coordinates(t, lvl)
    values = found["values"]
    assert len(values) == t.nnz == len(t.vals)
    texts = [v.find(f"{SVG}text").text for v in values]
    assert texts == [f"{v:.2g}" for v in t.vals.tolist()]


def test_each_node_hangs_from_its_parent():
    """Edges go from a position to its children: a CSR row's children are its columns."""
    a = np.array([[0, 1.0, 0, 2.0], [0, 0, 0, 0], [3.0, 0, 0, 4.0]])
    lay = fibertree.layout(ucf.from_numpy(a, "csr"), "A")
    rows = {n.pos: i for i, n in enumerate(lay.nodes) if n.level == 0}
    children = {r: [lay.nodes[i].label for i, n in enumerate(lay.nodes) if n.parent == rows[r]]
                for r in rows}  # fmt: skip
    assert children == {0: ["1", "3"], 1: [], 2: ["0", "3"]}
    xs = [n.x for n in lay.nodes if n.level == 1]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)  # leaves apart, in order


@settings(max_examples=25)
@given(
    shape=st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 4)),
    fmt=st.sampled_from(["csf", "UCC", "CSS", "UUC", "CUU", "UCU:2,0,1"]),
    seed=st.integers(0, 2**16),
)
def test_order_three_formats_draw_every_position(shape, fmt, seed):
    a = rand_sparse(np.random.default_rng(seed), shape, 0.4)
    t = ucf.from_numpy(a, fmt)
    svg = fibertree.svg(t)
    found = drawn(svg)
    shown = [len(found.get(str(lvl), [])) for lvl in range(3)]
    if 'class="note"' not in svg:  # drawn whole: every position
        assert shown == t.level_sizes()
        assert len(found.get("values", [])) == t.nnz
    else:  # the first positions of each level, and a note for each level cut
        assert all(s <= n for s, n in zip(shown, t.level_sizes(), strict=True))
        assert svg.count('class="note"') == sum(
            s < n for s, n in zip(shown, t.level_sizes(), strict=True)
        )


def test_a_large_tensor_is_drawn_in_part_and_says_so():
    t = ucf.from_numpy(np.ones((300, 200)), "csr")
    root = ET.fromstring(t._repr_svg_())
    found = drawn(ET.tostring(root, encoding="unicode"))
    shown = [len(found[str(lvl)]) for lvl in range(2)]
    assert shown[1] <= fibertree.MAX_SLOTS and shown[0] >= 1
    notes = [e.text for e in root.iter(f"{SVG}text") if e.get("class") == "note"]
    assert f"level 0: the first {shown[0]} of 300 positions" in notes
    assert f"level 1: the first {shown[1]} of 60000 positions" in notes


def test_show_writes_svg_and_png_and_refuses_other_files(tmp_path):
    a = np.eye(3)
    svg = ucf.show(a, tmp_path / "eye.svg", format="csr", name="I")
    assert len(drawn(svg.read_text())["1"]) == 3
    png = ucf.show(a, tmp_path / "eye.png", format="csr")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ucf.OperandError, match="writes .svg or .png files, not 'eye.pdf'"):
        ucf.show(a, tmp_path / "eye.pdf")


def test_the_show_command_draws_a_file_or_random_data(tmp_path, capsys):
    import scipy.io
    import scipy.sparse as sp

    m = sp.random(5, 6, density=0.4, random_state=3, format="coo")
    scipy.io.mmwrite(tmp_path / "m.mtx", m)
    out = tmp_path / "m.svg"
    assert main(["show", str(tmp_path / "m.mtx"), "-f", "dcsr", "-o", str(out)]) == 0
    t = ucf.read(tmp_path / "m.mtx", "dcsr")
    assert len(drawn(out.read_text())["1"]) == t.level_sizes()[1]
    capsys.readouterr()
    assert main(["show", "--random", "3x4", "-f", "csr", "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("<svg") and "csr (UC), 3×4" in printed
    assert main(["show"]) == 1
    assert "give a FILE or --random SHAPE" in capsys.readouterr().err


DOCS = Path(__file__).resolve().parents[2] / "docs" / "img"
PICTURED = {
    "csr": "csr",
    "csc": "csc",
    "dcsr": "dcsr",
    "coo": "coo",
    "bcsr22": "bcsr(2,2)",
    "ell3": "ell(3)",
    "nm24": "nm(2,4)",
}


@pytest.mark.parametrize("name", sorted(PICTURED))
def test_the_pictures_in_the_docs_are_what_ucf_show_draws_today(name):
    """docs/formats.md shows these files; each is remade by the command it names."""
    a = np.load(DOCS / "example.npy")
    assert (DOCS / f"{name}.svg").read_text() == ucf.show(a, format=PICTURED[name], name="A")
