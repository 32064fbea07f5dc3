"""Formats whose levels store blocks of a mode (``0/b``) and places in a block (``0%b``):
parsing, packing, unpacking and conversion, against numpy and scipy's BSR."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import rand_sparse
from ucf.format.format import parse_format
from ucf.format.level_map import LevelMap

BCSR = "UCUU:0/{bh},1/{bw},0%{bh},1%{bw}"


@pytest.mark.parametrize("shape", [(6, 9), (7, 10), (1, 1), (5, 3)])
@pytest.mark.parametrize(
    "fmt",
    [
        BCSR.format(bh=2, bw=3),
        "CCUU:0/2,1/3,0%2,1%3",
        "UCUC:0/3,1/2,0%3,1%2",
        "UUUU:1/4,0/2,0%2,1%4",
        "CCCC:0/2,1/2,1%2,0%2",
        "UCC:0/4,1,0%4",
        # singletons below a blocked level: the run of a non-unique level counts levels,
        # not modes (a blocked COO kept one entry per block and dropped the rest)
        "CSS:0/2,1,0%2",
        "UCS:0/3,1,0%3",
        "CCSS:0/2,1/3,0%2,1%3",
        "UCSS:1/2,0/3,0%3,1%2",
    ],
)
def test_round_trip_through_numpy_and_coo(fmt, shape):
    rng = np.random.default_rng(sum(shape))
    a = rand_sparse(rng, shape, 0.35)
    t = ucf.from_numpy(a, format=fmt)
    t.validate()
    np.testing.assert_array_equal(t.to_numpy(), a)
    coords, vals = t.to_coo()
    assert np.all(coords < np.array(shape))  # the padding of partial blocks stays hidden
    dense = np.zeros(shape)
    np.add.at(dense, tuple(coords.T), vals)
    np.testing.assert_array_equal(dense, a)
    back = ucf.from_coo(coords, vals, shape, fmt)
    np.testing.assert_array_equal(back.to_numpy(), a)
    for other in ("csr", "csc", "dense", "coo"):
        np.testing.assert_array_equal(t.convert(other).to_numpy(), a)
        np.testing.assert_array_equal(ucf.from_numpy(a, other).convert(fmt).to_numpy(), a)


@pytest.mark.parametrize("bh, bw", [(2, 3), (1, 4), (3, 1), (4, 4)])
def test_bcsr_levels_are_scipy_bsr(bh, bw):
    """Independent reference: scipy's BSR stores block rows as indptr, block columns
    as indices and each block row-major, which is exactly U C U U."""
    rng = np.random.default_rng(bh * 10 + bw)
    a = rand_sparse(rng, (bh * 5, bw * 4), 0.2, empty_rows=bh)
    bsr = sp.bsr_array(a, blocksize=(bh, bw))
    bsr.sort_indices()
    t = ucf.from_scipy(sp.csr_array(a), format=BCSR.format(bh=bh, bw=bw))
    np.testing.assert_array_equal(t.levels[1]["pos"], bsr.indptr)
    np.testing.assert_array_equal(t.levels[1]["crd"], bsr.indices)
    np.testing.assert_array_equal(t.vals.reshape(-1, bh, bw), bsr.data)
    assert t.level_sizes() == [
        bh * 5 // bh,
        bsr.indices.size,
        bsr.indices.size * bh,
        bsr.indices.size * bh * bw,
    ]


def test_partial_blocks_are_padded_with_explicit_zeros():
    a = np.zeros((5, 5))
    a[4, 4] = 7.0
    t = ucf.from_numpy(a, format=BCSR.format(bh=2, bw=2))
    assert t.levels[0] == {} and list(t.levels[1]["crd"]) == [2]
    np.testing.assert_array_equal(t.vals, [7.0, 0.0, 0.0, 0.0])  # (4,4) (4,5) (5,4) (5,5)
    assert t.nnz == 4 and t.to_coo()[0].tolist() == [[4, 4]]


def test_duplicates_are_summed_across_a_block():
    t = ucf.from_coo([[1, 2], [1, 2], [0, 0]], [1.0, 2.0, 5.0], (4, 4), BCSR.format(bh=2, bw=2))
    want = np.zeros((4, 4))
    want[1, 2], want[0, 0] = 3.0, 5.0
    np.testing.assert_array_equal(t.to_numpy(), want)


def test_validation_names_the_blocked_level():
    t = ucf.from_numpy(np.eye(4), format=BCSR.format(bh=2, bw=2))
    bad = dict(t.levels[1], crd=np.array([0, 2], dtype=np.int32))  # 2 blocks of width 2
    with pytest.raises(ucf.FormatError, match=r"level 1 \(compressed, 1/2 of mode 1\)"):
        ucf.Tensor((4, 4), t.format, [{}, bad, {}, {}], t.vals)


def test_format_strings_round_trip():
    for text in [BCSR.format(bh=32, bw=32), "UUU:0/8,0/2%4,0%2", "UC:1,0", "UC"]:
        assert str(parse_format(text)) == text
    f = parse_format("UCUU:0/2,1/3,0%2,1%3")
    assert f.order == 2 and len(f.levels) == 4 and f.blocked
    assert f.maps[2] == LevelMap(0, 1, 2) and f.level_dims((5, 7)) == [3, 3, 2, 3]
    assert parse_format("UC:1,0") == parse_format("csc") and not parse_format("csc").blocked


@pytest.mark.parametrize(
    "text, words",
    [
        ("UU:0/2,1", ["mode 0 (0/2)", "do not split"]),
        ("UUU:0%2,0/2,1", ["mode 0 (0%2,0/2)"]),
        ("UU:0/2,0%3", ["mode 0 (0/2,0%3)"]),
        ("UUUU:0/4,0/3%2,0%3,1", ["mode 0"]),
        ("UU:0/a,1", ["'0/a'", "block index"]),
        ("UU:0/0,0%0", ["must be positive"]),
        ("UUU:0/2,0%2", ["3 levels but 2 entries"]),
        ("UUU:0/2,0%2,2", ["are not 0..1"]),
    ],
)
def test_bad_block_maps_are_format_errors(text, words):
    with pytest.raises(ucf.FormatError) as e:
        parse_format(text)
    for w in words:
        assert w in str(e.value)


def test_block_aliases_name_the_level_maps():
    assert parse_format("bcsr(2,3)") == parse_format(BCSR.format(bh=2, bw=3))
    assert parse_format(" BCSR( 2 , 3 ) ") == parse_format("bcsr(2,3)")
    assert str(parse_format("bcsc(2,3)")) == "UCUU:1/3,0/2,0%2,1%3"
    assert str(parse_format("bdcsr(4,4)")) == "CCUU:0/4,1/4,0%4,1%4"
    with pytest.raises(ucf.FormatError, match="unknown format .bsr."):
        parse_format("bsr(2,2)")
    with pytest.raises(ucf.FormatError, match="must be positive"):
        parse_format("bcsr(0,2)")


def test_a_blocked_operand_is_converted_to_the_kernels_format():
    rng = np.random.default_rng(5)
    a = rand_sparse(rng, (7, 5), 0.3)
    x = rng.random(5)
    A = ucf.from_numpy(a, format=BCSR.format(bh=2, bw=2))
    np.testing.assert_allclose(
        ucf.einsum("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, A=A, x=x), a @ x
    )


@pytest.mark.parametrize(
    "written, order, shown",
    [
        ("bcsr(4,4)", 2, "bcsr(4,4)"),
        ("UCUU:0/2,1/8,0%2,1%8", 2, "bcsr(2,8)"),
        ("bcsc(2,8)", 2, "bcsc(2,8)"),
        ("bdcsr(3,5)@qint8:1", 2, "bdcsr(3,5)@qint8:1"),
        ("UC", 2, "csr"),
        ("UC:1,0", 2, "csc"),
        ("ell(4)", 3, "ell(4)"),
        ("nm(2,4)", 2, "nm(2,4)"),
        ("UCUU:0/4,1/4,1%4,0%4", 2, "UCUU:0/4,1/4,1%4,0%4"),  # blocks stored column-major
        ("CU", 2, "CU"),
        ("UUU", 3, "dense"),
        ("CSS", 3, "coo"),
        ("CCC", 3, "csf"),
        ("CC", 2, "dcsr"),
        ("dense@float16", 2, "dense@float16"),
    ],
)
def test_a_format_is_named_as_users_spell_it(written, order, shown):
    """Messages name formats as users write them; a name is only used when it parses back
    to the same levels, maps and values."""
    fmt = parse_format(written, order=order)
    assert fmt.name == shown
    assert parse_format(fmt.name, order=order) == fmt


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("fmt", ["CS:0/2,0%2", "CS:0/3,0%3"])
def test_a_blocked_coo_vector_reads_every_entry(fmt, target):
    """A vector in blocks stored as COO (a non-unique block level, a singleton place in
    the block): its block level is not unique, so a block with two entries holds two
    positions, and kernels read both (the statement fuzzer's first singleton draws found
    ``X(i) = A(i) - (B(i) - C(i))`` wrong with C so stored: one entry a block)."""
    c = np.array([1.0, 0, 3, 4, 0, 0, 7, 8])
    stored = ucf.from_numpy(c, format=fmt)
    assert not stored.format.unique(0)
    a = np.arange(8.0)
    k = ucf.compile("X(i) = A(i) - C(i)", formats={"C": fmt}, target=target)
    np.testing.assert_array_equal(k(A=a, C=stored).to_numpy(), a - c)
