"""Formats answer questions and are built by constructors (issue 33): what used to be
spelled as level letters outside ``ucf.format`` is a method, equal to what the letters
parse to."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ucf.errors import FormatError
from ucf.format.format import Format, parse_format
from ucf.format.values import VALUES


@pytest.mark.parametrize("order", [1, 2, 3])
def test_constructors_equal_the_formats_their_letters_spell(order):
    assert Format.dynamic(order) == parse_format("U" * (order - 1) + "Q")
    assert Format.dense(order) == parse_format("U" * order)
    assert Format.compressed(order) == parse_format("C" * order)
    assert Format.compressed(order, 1) == parse_format("U" + "C" * (order - 1))
    perm = tuple(reversed(range(order)))
    assert Format.dense(order, perm) == parse_format("U" * order + ":" + ",".join(map(str, perm)))
    assert parse_format("csr").with_mode_order((1, 0)) == parse_format("csc")
    assert parse_format("dense@float32", order=1).with_levels(Format.compressed(1).levels) == (
        parse_format("C@float32")
    )


@pytest.mark.parametrize("tile", [(32, 1), (1, 8), (4, 4), (1, 32, 1), (1, 1)])
def test_tiled_formats_are_the_blocked_maps(tile):
    maps = ",".join(f"{m}/{b},{m}%{b}" if b > 1 else str(m) for m, b in enumerate(tile))
    levels = "U" * sum(2 if b > 1 else 1 for b in tile)
    assert Format.tiled(tile) == parse_format(f"{levels}:{maps}", order=len(tile))
    held = replace(Format.tiled(tile), values=VALUES["uint8"])
    assert held == parse_format(f"{levels}:{maps}@uint8", order=len(tile))


@pytest.mark.parametrize("bh, bw", [(4, 4), (32, 64), (2, 3), (1, 4), (8, 1)])
def test_blocked_rows_are_bcsr_and_by_columns_the_same_matrix_column_by_column(bh, bw):
    assert Format.blocked_rows(bh, bw) == parse_format(f"bcsr({bh},{bw})")
    by_columns = Format.blocked_rows(bh, bw, columns=True)
    assert by_columns == parse_format(f"UCUU:1/{bw},0/{bh},1%{bw},0%{bh}")
    assert by_columns.blocked and by_columns.mode_order[0] == 1
    bcsc = Format.blocked_rows(bh, bw, columns=True, places_by_column=False)
    assert bcsc == parse_format(f"bcsc({bh},{bw})")


@pytest.mark.parametrize("order, width", [(1, 3), (2, 1), (2, 8), (3, 4)])
def test_ell_is_the_format_ell_spells(order, width):
    assert Format.ell(order, width) == parse_format(f"ell({width})", order=order)


def test_a_dense_format_in_mode_order_is_one_object_per_order():
    """The per-call check that an operand is dense compares objects (``is``)."""
    assert Format.dense(3) is Format.dense(3) and Format.dense(2) is not Format.dense(3)
    assert Format.dense(2, (1, 0)) == parse_format("UU:1,0") != Format.dense(2)


def test_formats_say_whether_they_are_blocked_or_fixed_width():
    assert parse_format("ell(4)").fixed_width and parse_format("nm(2,4)").fixed_width
    assert not parse_format("csr").fixed_width and not parse_format("bcsr(2,2)").fixed_width
    assert parse_format("bcsr(2,2)").blocked and not parse_format("ell(4)").blocked


def test_a_workspace_list_is_a_kind_no_tensor_is_stored_in():
    ws = Format.workspace_list()
    assert ws.levels[0].name == "workspace list" and not ws.levels[0].stored
    with pytest.raises(FormatError, match=r"level kind 'W' is not one of U, C, S, F, Q \("):
        parse_format("UW")
