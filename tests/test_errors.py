"""Every user mistake raises a specific ucf.UcfError subclass with a useful message."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ucf


def test_error_hierarchy():
    for cls in (
        ucf.ParseError,
        ucf.FormatError,
        ucf.ShapeError,
        ucf.OperandError,
        ucf.ScheduleError,
        ucf.UnsupportedError,
        ucf.CompileError,
    ):
        assert issubclass(cls, ucf.UcfError)


def test_parse_error_has_line_column_and_caret():
    with pytest.raises(ucf.ParseError) as ei:
        ucf.compile("A(i) = B(i) * * C(i)")
    err = ei.value
    assert err.line == 1
    assert err.column == 15
    msg = str(err)
    assert "line 1" in msg and "column 15" in msg
    lines = msg.splitlines()
    caret = next(ln for ln in lines if ln.strip() == "^")
    src = next(ln for ln in lines if "B(i) * * C(i)" in ln)
    assert src[caret.index("^")] == "*"


def test_parse_error_unterminated():
    with pytest.raises(ucf.ParseError) as ei:
        ucf.compile("A(i) = B(i")
    assert ei.value.line == 1
    assert ei.value.column == 10
    assert "^" in str(ei.value)


def test_parse_error_on_second_line():
    with pytest.raises(ucf.ParseError) as ei:
        ucf.compile("A(i) =\n  B(i) +")
    assert ei.value.line == 2
    assert "^" in str(ei.value)


def test_non_affine_index_is_parse_error():
    with pytest.raises(ucf.ParseError, match="not affine") as ei:
        ucf.compile("A(i) = B(p*r)")
    assert ei.value.line == 1
    assert ei.value.column == 10


@pytest.mark.parametrize(
    "expr,formats,shown",
    [
        ("y(i) = A(i,0)", {"A": "UC"}, "mode 1 is a constant"),
        ("y(i+1) = x(i)", {}, "output y\\(i \\+ 1\\).*plain index variable"),
        ("C(i) = A(i-k) * B(k)", {"A": "C"}, "decreases with k"),
    ],
)
def test_affine_index_unsupported(expr, formats, shown):
    with pytest.raises(ucf.UnsupportedError, match=shown):
        ucf.compile(expr, formats=formats, schedule="")


def test_schedule_error():
    with pytest.raises(ucf.ScheduleError, match="not a factor"):
        ucf.compile("y(i) = A(i,j) * x(j)", schedule="precompute(A(j,i), j, jw, w)")
    with pytest.raises(ucf.ScheduleError, match="stores i above j"):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule="reorder(j, i)")


def test_empty_schedule_is_fine():
    k = ucf.compile("y(i) = A(i,j) * x(j)", schedule="  ")
    np.testing.assert_array_equal(k(A=np.eye(2), x=np.ones(2)).to_numpy(), np.ones(2))


def test_missing_operand():
    k = ucf.compile("y(i) = A(i,j) * x(j)")
    with pytest.raises(ucf.OperandError, match="missing operand x"):
        k(A=np.ones((2, 3)))
    with pytest.raises(ucf.OperandError, match="missing operand"):
        ucf.einsum("y(i) = A(i,j) * x(j)", A=np.ones((2, 3)))


def test_unknown_operand():
    k = ucf.compile("y(i) = A(i,j) * x(j)")
    with pytest.raises(ucf.OperandError, match="unknown operand Q") as ei:
        k(A=np.ones((2, 3)), x=np.ones(3), Q=np.ones(3))
    assert "A" in str(ei.value) and "x" in str(ei.value)


def test_unknown_tensor_in_formats():
    with pytest.raises(ucf.OperandError, match="Z") as ei:
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"Z": "csr"})
    assert "does not use" in str(ei.value)


def test_output_on_rhs():
    with pytest.raises(ucf.OperandError, match="right-hand side"):
        ucf.compile("A(i) = A(i) + b(i)")


def test_index_variable_bound_to_two_extents():
    with pytest.raises(ucf.ShapeError) as ei:
        ucf.einsum("y(i) = A(i,j) * x(j)", A=np.ones((2, 3)), x=np.ones(4))
    msg = str(ei.value)
    assert "index variable j" in msg
    assert "3" in msg and "4" in msg


def test_index_variable_two_extents_same_tensor_family():
    with pytest.raises(ucf.ShapeError, match="index variable i") as ei:
        ucf.einsum("C(i,j) = A(i,j) + B(i,j)", A=np.ones((2, 3)), B=np.ones((5, 3)))
    assert "2" in str(ei.value) and "5" in str(ei.value)


def test_access_arity_differs_from_operand_order():
    k = ucf.compile("y(i) = A(i,j) * x(j)")
    with pytest.raises(ucf.ShapeError, match="order 3") as ei:
        k(A=np.ones((2, 3, 4)), x=np.ones(3))
    assert "2 indices" in str(ei.value)


@pytest.mark.parametrize("fmt", [None, "csr"])
def test_einsum_blames_the_operand_not_a_format_nobody_wrote(fmt):
    """A dense operand of the wrong order once failed on format 'U', inferred from it."""
    formats = {"A": fmt} if fmt else None
    with pytest.raises(ucf.ShapeError) as ei:
        ucf.einsum("y(i) = A(i,j) * x(j)", A=np.ones(3), x=np.ones(3), formats=formats)
    assert "operand A has order 1 (shape (3,))" in str(ei.value) and "format" not in str(ei.value)


def test_tensor_accessed_with_two_arities():
    with pytest.raises(ucf.ShapeError, match="B"):
        ucf.compile("A(i) = B(i) + B(i,j)")


def test_format_arity_mismatch():
    with pytest.raises(ucf.FormatError):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "UCC"})


@pytest.mark.parametrize("fmt", ["XY", "UZ", "UC:0,0", "UC:0,2", "UC:1", "csrr", ""])
def test_bad_format_string(fmt):
    with pytest.raises(ucf.FormatError) as ei:
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": fmt})
    assert str(ei.value)


def test_bad_format_to_from_numpy():
    with pytest.raises(ucf.FormatError):
        ucf.from_numpy(np.ones((2, 2)), format="UZ")


@pytest.mark.parametrize("dtype", [np.complex128, "complex64"])
def test_complex_dtype_is_operand_error(dtype):
    with pytest.raises(ucf.OperandError, match="complex"):
        ucf.compile("y(i) = A(i,j) * x(j)", dtype=dtype)


def test_complex_operand_is_operand_error():
    with pytest.raises(ucf.OperandError):
        ucf.einsum("y(i) = A(i,j) * x(j)", A=np.ones((2, 2), dtype=complex), x=np.ones(2))


def test_bad_index_dtype():
    with pytest.raises(ucf.OperandError, match="int32 or int64"):
        ucf.compile("y(i) = A(i,j) * x(j)", index_dtype=np.int16)


def test_unknown_target():
    with pytest.raises(ucf.UcfError, match="unknown target"):
        ucf.compile("y(i) = A(i,j) * x(j)", target="fortran")


def test_scipy_out_of_range_indices():
    m = sp.csr_matrix((np.array([1.0, 2.0]), np.array([0, 7]), np.array([0, 1, 2])), shape=(2, 3))
    with pytest.raises(ucf.FormatError) as ei:
        ucf.from_scipy(m)
    assert "7" in str(ei.value)
    with pytest.raises(ucf.FormatError):
        ucf.einsum("y(i) = A(i,j) * x(j)", A=m, x=np.ones(3))


def test_scipy_bad_indptr():
    m = sp.csr_matrix((np.array([1.0, 2.0]), np.array([0, 1]), np.array([0, 1, 2])), shape=(2, 3))
    m.indptr = np.array([0, 3, 2], dtype=m.indptr.dtype)
    with pytest.raises(ucf.FormatError):
        ucf.from_scipy(m)


def test_division_by_sparse_unsupported():
    with pytest.raises(ucf.UnsupportedError, match="division by sparse tensor B"):
        ucf.compile("A(i) = C(i) / B(i)", formats={"B": "C"})


def test_division_by_dense_ok():
    r = ucf.einsum(
        "A(i) = C(i) / B(i)", formats={"C": "C"}, C=np.array([0.0, 4.0]), B=np.array([1.0, 2.0])
    )
    np.testing.assert_array_equal(r, [0.0, 2.0])


def test_unknown_extent_needs_shapes():
    k = ucf.compile("A(i,j) = b(i)")
    with pytest.raises(ucf.ShapeError, match="extent of index variable j"):
        k(b=np.ones(3))
    r = k(b=np.arange(3.0), shapes={"j": 2})
    np.testing.assert_array_equal(r.to_numpy(), np.repeat(np.arange(3.0)[:, None], 2, 1))


def test_cache_is_used(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("UCF_CACHE_DIR", str(cache))
    expr = "y(i) = A(i,j) * x(j) + z(i)"
    k1 = ucf.compile(expr, formats={"A": "dcsr"}, dtype="float32")
    files = sorted(p.name for p in Path(cache).iterdir())
    assert files, "compiling should populate the cache directory"
    k2 = ucf.compile(expr, formats={"A": "dcsr"}, dtype="float32")
    A = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = np.ones(3, dtype=np.float32)
    z = np.ones(2, dtype=np.float32)
    np.testing.assert_array_equal(k1(A=A, x=x, z=z).to_numpy(), k2(A=A, x=x, z=z).to_numpy())
    np.testing.assert_array_equal(k2(A=A, x=x, z=z).to_numpy(), A @ x + z)
    assert os.path.isdir(cache)


@pytest.mark.parametrize(
    "dtype, values, shown",
    [
        ("int64", [1.5, 2.0], "1.5"),
        ("int64", [np.nan, 1.0], "nan"),
        ("int64", [np.inf, 1.0], "inf"),
        ("int64", [2.0**63, 1.0], "9.223372036854776e+18"),
        ("int32", [2.0**31, 1.0], "2147483648.0"),
        ("int32", np.array([2**40, 1], dtype=np.int64), "1099511627776"),
    ],
)
def test_values_an_integer_kernel_would_change_are_refused(dtype, values, shown):
    """Issue 19 item 6: floats into an int kernel were truncated without a word."""
    k = ucf.compile("y(i) = A(i,j) * x(j)", dtype=dtype)
    with pytest.raises(ucf.OperandError) as e:
        k(A=np.ones((2, 2), dtype=dtype), x=np.asarray(values))
    assert f"operand x: value {shown}" in str(e.value) and dtype in str(e.value)


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_integral_floats_into_an_integer_kernel_are_exact(dtype):
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, dtype=dtype)
    A = np.array([[1.0, 0.0], [-3.0, 4.0]])
    got = k(A=A, x=np.array([2.0, -1.0])).to_numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, [2, -10])


def test_letters_that_spell_an_alias_win_where_the_alias_cannot_fit():
    """Issue 19 item 4: 'CSC' for an order-3 tensor is compressed, singleton,
    compressed, not the matrix alias csc."""
    a = np.zeros((3, 2, 4))
    a[0, 1, 2], a[2, 0, 3] = 1.0, 2.0
    t = ucf.from_numpy(a, format="CSC")
    assert str(t.format) == "CSC"
    np.testing.assert_array_equal(t.to_numpy(), a)
    assert str(ucf.parse_format("CSC", order=2)) == "UC:1,0"  # a matrix: the alias


def test_a_misfit_alias_says_how_it_was_read():
    with pytest.raises(ucf.FormatError, match=r"format 'csc' \(read as 'UC:1,0'\) has 2 levels"):
        ucf.parse_format("csc", order=4)


@pytest.mark.parametrize(
    "expr, formats",
    [
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}),
        ("y(i) += A(i,j) * x(j)", {"A": "csr"}),
    ],
)
def test_an_output_that_overlaps_an_operand_is_refused(expr, formats):
    """The kernel zeroes and writes out= while it reads x: an aliased x gives a wrong
    answer, so it is refused; a separate array gives numpy's result."""
    k = ucf.compile(expr, formats=formats)
    a = sp.random(12, 12, density=0.3, format="csr", random_state=1).toarray()
    rows = np.random.default_rng(2).standard_normal((2, 12))
    with pytest.raises(ucf.OperandError, match="out= shares memory with operand x"):
        k(A=a, x=rows[0], out=rows[0])
    y = rows[1].copy()
    expected = a @ rows[0] + (rows[1] if "+=" in expr else 0)
    np.testing.assert_allclose(k(A=a, x=rows[0], out=y).to_numpy(), expected)


@pytest.mark.parametrize(
    "expr, formats, dynamic",
    [
        ("y(i) = A(i,j) * x(j)", {"A": "bcsr(4,4)"}, None),
        ("C(i,n) = A(i,k) * B(k,n)", None, {"A": (4, 1)}),  # gathered compute tiles
        ("C(i,n) = A(i,k) * B(k,n)", None, {"A": (3, 2)}),
    ],
)
def test_blocked_and_dynamic_kernels_refuse_an_output_they_cannot_write(expr, formats, dynamic):
    """One rule for every kind of kernel (a blocked one would compute right, a dynamic one
    wrong); a read-only output or a mask that is not a dict is named (numpy's "assignment
    destination is read-only" was an InternalError); a separate output gives numpy's result."""
    k = ucf.compile(expr, formats=formats, dynamic=dynamic)
    rng = np.random.default_rng(4)
    if dynamic is None:
        a = ucf.from_numpy(sp.random(10, 10, density=0.3, random_state=3).toarray(), "bcsr(4,4)")
        ops, read = {"A": a, "x": rng.standard_normal(10)}, "x"
        expected = a.to_numpy() @ ops["x"]
    else:
        ops = {"A": rng.standard_normal((10, 10)), "B": rng.standard_normal((10, 10))}
        ops["A"][rng.random((10, 10)) < 0.5] = 0
        read, expected = "B", ops["A"] @ ops["B"]
    for name in ops if dynamic else [read]:
        with pytest.raises(ucf.OperandError, match=f"shares memory with operand {name}"):
            k(**ops, out=ops[name])
    frozen = np.zeros_like(expected)
    frozen.flags.writeable = False
    with pytest.raises(ucf.OperandError, match="out= for (y|C) is read-only"):
        k(**ops, out=frozen)
    immutable = memoryview(bytes(expected.nbytes)).cast("d", expected.shape)
    with pytest.raises(ucf.OperandError, match="out= for (y|C) is read-only"):
        k(**ops, out=immutable)
    with pytest.raises(ucf.OperandError, match="a list would be copied and the result lost"):
        k(**ops, out=expected.tolist())
    out = np.zeros_like(expected)
    np.testing.assert_allclose(k(**ops, out=out).to_numpy(), expected, atol=1e-12)
    with pytest.raises(ucf.ArgumentError, match="passed by name"):
        k(*ops.values())
    with pytest.raises(ucf.ArgumentError, match="masks= takes a dict by name, got int"):
        k(**ops, masks=5)


def test_an_output_overlapping_a_dense_matrix_operand_is_refused():
    k = ucf.compile("C(i,j) = A(i,k) * B(k,j)", formats={"A": "csr"})
    b = np.ones((6, 6))
    with pytest.raises(ucf.OperandError, match="operand B"):
        k(A=np.eye(6), B=b, out=b)


def test_positional_operands_are_refused_with_the_names_to_use():
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    with pytest.raises(ucf.ArgumentError, match=r"by name, as in k\(A=\.\.\., x=\.\.\.\)"):
        k(np.eye(3), np.ones(3))


@pytest.mark.parametrize("keyword", ["shapes", "masks"])
def test_shapes_and_masks_that_are_not_dicts_are_argument_errors(keyword):
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    with pytest.raises(ucf.ArgumentError, match=f"{keyword}= takes a dict"):
        k(A=np.eye(3), x=np.ones(3), **{keyword: 5})


# ------------------------------------------------------------ a careless user (issue 32, F)


def test_a_misspelt_keyword_of_einsum_is_named():
    with pytest.raises(ucf.OperandError, match=r"unknown operand format: .* did you mean formats="):
        ucf.einsum("y(i) = A(i,j) * x(j)", A=np.eye(3), x=np.ones(3), format={"A": "csr"})
    k = ucf.compile("y(i) = A(i,j) * x(j)")
    with pytest.raises(ucf.OperandError, match=r"unknown operand shape: .* did you mean shapes="):
        k(A=np.eye(3), x=np.ones(3), shape={"i": 3})


def test_an_unknown_function_is_named_with_the_known_ones():
    with pytest.raises(ucf.ParseError) as e:
        ucf.compile("y(i) = frob(A(i,j)) * x(j)")
    message = str(e.value)
    assert "frob is not a function ucf knows" in message
    assert all(f in message for f in ("relu", "exp", "sigmoid", "max", "sum"))
    assert e.value.column == 13  # at A(i,j), where frob's argument is not an index


@pytest.mark.parametrize("expr", ["y(i) = relu(i) * x(i)", "y(i) = i * x(i)", "s = sum(j, j)"])
def test_an_index_variable_read_as_a_value_is_refused(expr):
    with pytest.raises(ucf.ParseError, match=r"is an index variable of this statement"):
        ucf.compile(expr)


def test_choose_stile_says_which_operands_it_needs():
    with pytest.raises(ucf.OperandError, match=r"needs operands= with B .* samples stand for A"):
        ucf.choose_stile([np.ones((4, 4), bool)], [(1, 32), (32, 1)])
    with pytest.raises(ucf.OperandError, match=r"operands= gives C, which is not an operand"):
        ucf.choose_stile([np.ones((4, 4), bool)], [(1, 1)], operands={"B": np.ones((4, 2)), "C": 1})


def test_an_operand_of_the_wrong_order_is_said_alike_everywhere():
    message = r"operand x has order 2 \(shape \(3, 3\)\) but is accessed with 1 index$"
    with pytest.raises(ucf.ShapeError, match=message):
        ucf.einsum("y(i) = A(i,j) * x(j)", A=np.eye(3), x=np.eye(3))
    with pytest.raises(ucf.ShapeError, match=message):
        ucf.compile("y(i) = A(i,j) * x(j)")(A=np.eye(3), x=np.eye(3))


def test_int64_indices_suggest_index_dtype():
    torch = pytest.importorskip("torch")
    t = torch.eye(3, dtype=torch.float64).to_sparse_csr()
    k = ucf.compile("y(i) = A(i,j) * x(j)", {"A": "csr"})
    with pytest.warns(ucf.ConversionWarning, match=r"compile with index_dtype='int64'"):
        k(A=t, x=np.ones(3))
