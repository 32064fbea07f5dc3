"""Convolutions with no schedule run on a zero-padded, flattened input (ucf.exec.padded_conv).

Every result is compared with the numpy reference of tests/lang/conv_reference.py
(sliding windows and einsum); which path a kernel took is read from ``k.cin``.
"""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS
from tests.lang.conv_reference import conv
from ucf.exec import padded_conv
from ucf.exec.replay import FlatReplay
from ucf.format.format import parse_format
from ucf.lang.parser import parse_statement
from ucf.schedule import cpu_model

FLAT = "zero-padded planes"


@pytest.fixture(autouse=True)
def _planned(monkeypatch):
    """Small inputs get plans of their own, as large ones do (``REPLAN_WORK``)."""
    ucf.set_num_threads(2)
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 0)


def sparse_filter(rng, shape, density):
    return (rng.standard_normal(shape) * (rng.random(shape) < density)).astype(np.float32)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "h, w, r, s, pad",
    [(7, 7, 3, 3, 1), (5, 11, 3, 3, 1), (9, 6, 5, 3, 2), (6, 8, 3, 5, 0), (4, 4, 1, 1, 0)],
)
def test_padded_convolutions_match_numpy(target, h, w, r, s, pad):
    """Odd sizes, non-square kernels, no padding and 1x1 against numpy's convolution."""
    rng = np.random.default_rng(h * 100 + w * 10 + r)
    x = rng.standard_normal((2, 5, h, w)).astype(np.float32)
    f = sparse_filter(rng, (7, 5, r, s), 0.3)
    ih = f"p+r-{pad}" if pad else "p+r"
    iw = f"q+s-{pad}" if pad else "q+s"
    stmt = f"O(n,m,p,q) = I(n,c,{ih},{iw}) * F(m,c,r,s)"
    k = ucf.compile(stmt, formats={"F": "UCCC"}, target=target, dtype="float32")
    ref = conv(x.astype(np.float64), f.astype(np.float64), padding=pad)
    got = k(I=x, F=ucf.from_numpy(f, "UCCC")).to_numpy()
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert FLAT in k.cin, k.cin


@pytest.mark.parametrize("target", TARGETS)
def test_output_given_and_padding_wider_than_the_inferred(target):
    """``out=`` receives the cropped result; ``shapes=`` asks for more rows and columns
    than the inferred extents, which read as zeros past the input."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 6, 5)).astype(np.float32)
    f = sparse_filter(rng, (4, 3, 3, 3), 0.5)
    k = ucf.compile("O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)", {"F": "UCCC"}, target=target)
    out = np.full((1, 4, 6, 5), np.nan)
    k(I=x, F=ucf.from_numpy(f, "UCCC"), out=out)
    np.testing.assert_allclose(out, conv(x, f, padding=1), rtol=1e-5, atol=1e-5)
    assert FLAT in k.cin
    wide = k(I=x, F=ucf.from_numpy(f, "UCCC"), shapes={"p": 8, "q": 7}).to_numpy()
    ref = conv(np.pad(x, ((0, 0), (0, 0), (0, 2), (0, 2))), f, padding=1)
    np.testing.assert_allclose(wide, ref, rtol=1e-5, atol=1e-5)


def test_repeated_calls_see_a_changed_input():
    """The padded copy is made on every call (a replay refills the buffer it keeps)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 4, 7, 7)).astype(np.float32)
    f = sparse_filter(rng, (8, 4, 3, 3), 0.2)
    ft = ucf.from_numpy(f, "UCCC")
    k = ucf.compile("O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)", {"F": "UCCC"}, dtype="float32")
    out = np.empty((1, 8, 7, 7), np.float32)
    for _ in range(3):
        x *= -2
        k(I=x, F=ft, out=out)
        np.testing.assert_allclose(out, conv(x, f, padding=1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_strided_convolution_keeps_the_direct_kernel(target):
    """Stride 2 is not flattened: the direct kernel runs, and is right."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 9, 8)).astype(np.float32)
    f = sparse_filter(rng, (6, 4, 3, 3), 0.4)
    k = ucf.compile(
        "O(n,m,p,q) = I(n,c,2*p+r-1,2*q+s-1) * F(m,c,r,s)", {"F": "UCCC"}, target=target
    )
    got = k(I=x, F=ucf.from_numpy(f, "UCCC")).to_numpy()
    np.testing.assert_allclose(got, conv(x, f, stride=2, padding=1), rtol=1e-5, atol=1e-5)
    assert FLAT not in k.cin


def test_a_dense_filter_and_a_dense_input_in_float64():
    """Any filter format, and the kernel's dtype: F dense, float64 throughout."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 3, 5, 6))
    f = rng.standard_normal((2, 3, 3, 3))
    k = ucf.compile("O(n,m,p,q) = F(m,c,r,s) * I(n,c,p+r-1,q+s-1)")
    np.testing.assert_allclose(k(I=x, F=f).to_numpy(), conv(x, f, padding=1))
    assert FLAT in k.cin


@pytest.mark.parametrize(
    "stmt, formats",
    [
        ("O(n,m,p,q) = I(n,c,2*p+r,q+s) * F(m,c,r,s)", {}),  # stride
        ("O(n,m,p,q) = I(n,c,p+2*r,q+s) * F(m,c,r,s)", {}),  # dilation
        ("O(n,p,q,m) = I(n,p+r,q+s,c) * F(r,s,c,m)", {}),  # NHWC: pixels not last
        ("O(n,m,p,q) = I(n,c,p+r,q+s) * F(m,c,r,s)", {"I": "UUUC"}),  # sparse input
        ("O(n,m,p,q) += I(n,c,p+r,q+s) * F(m,c,r,s)", {}),  # accumulates
        ("O(n,m,p,q) = I(n,c,p+r,q+s) * F(m,c,r,s) + I(n,c,p,q)", {}),  # not one product
    ],
)
def test_what_is_not_flattened(stmt, formats):
    fmts = {n: parse_format(f) for n, f in formats.items()}
    assert padded_conv.find(parse_statement(stmt), fmts) is None


def test_the_flattened_statement():
    stmt = parse_statement("O(n,m,p,q) = I(n,c,p+r-1,q+s+2) * F(m,c,r,s)")
    found = padded_conv.find(stmt, {"F": parse_format("UCCC")})
    flat = found.at({"p": 7, "q": 5, "r": 3, "s": 2})
    assert (flat.wp, flat.hp, flat.plane) == (6, 9, 9 * 6 + 1)
    assert flat.expr == "O(n, m, x) = I(n, c, 6*r + s + x) * F(m, c, r, s)"
    assert flat.extents({"n": 1, "m": 2, "c": 3, "p": 7, "q": 5, "r": 3, "s": 2})["x"] == 42
    assert found.at({"p": 0, "q": 5, "r": 3, "s": 2}) is None
    assert found.at({"p": 7, "q": padded_conv.MAX_WIDTH, "r": 3, "s": 2}) is None  # wide rows


def test_the_kernel_keeps_the_users_statement(tmp_path):
    """After a flattened call, ``k.statement`` and ``k.save`` are the user's convolution
    (the flattened kernel takes other operands), while ``k.cin`` shows what ran."""
    k = ucf.compile("O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)", {"F": "UCCC"})
    rng = np.random.default_rng(9)
    f = sparse_filter(rng, (3, 2, 3, 3), 0.5)
    k(I=rng.standard_normal((1, 2, 5, 5)), F=ucf.from_numpy(f, "UCCC"))
    assert FLAT in k.cin
    assert str(k.statement.lhs) == "O(n, m, p, q)" and "p + r - 1" in str(k.statement)
    c_file, _ = k.save(tmp_path / "conv")
    assert "p + r - 1" in c_file.read_text()


@pytest.mark.parametrize("target", TARGETS)
def test_repeated_calls_replay_the_flattened_kernel(target):
    """A call with the same input array (changed in place between calls), filter and
    output replays: the input is copied into the padded buffer of the first call, the
    flattened kernel runs again and is cropped into the output; every result is right,
    with and without ``out=``, and a new input object binds anew."""
    rng = np.random.default_rng(34)
    x = rng.standard_normal((1, 6, 9, 8)).astype(np.float32)
    f = sparse_filter(rng, (5, 6, 3, 3), 0.4)
    ft = ucf.from_numpy(f, "UCCC")
    stmt = "O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)"
    k = ucf.compile(stmt, {"F": "UCCC"}, target=target, dtype="float32")
    out = np.empty((1, 5, 9, 8), np.float32)
    for _ in range(4):
        x[...] = rng.standard_normal(x.shape)
        ref = conv(x.astype(np.float64), f.astype(np.float64), padding=1)
        k(I=x, F=ft, out=out)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(k(I=x, F=ft).to_numpy(), ref, rtol=1e-4, atol=1e-4)
        assert FLAT in k.cin
    assert any(isinstance(r, FlatReplay) for r in k._local.replays)
    other = rng.standard_normal((1, 6, 9, 8)).astype(np.float32)
    ref = conv(other.astype(np.float64), f.astype(np.float64), padding=1)
    np.testing.assert_allclose(
        k(I=other, F=ft, out=out).vals.reshape(out.shape), ref, rtol=1e-4, atol=1e-4
    )
