"""Sparse attention (``ucf.attention``, ``ucf.nn.SparseAttention``) against torch.

The reference is the definition in float64: scores ``q k^T * scale``, -inf where the
mask is False, softmax over each row (a row with no live key gives 0), times ``v``;
gradients come from torch's autograd through it. Masks are random element masks with
all-masked rows, mask functions (causal, Longformer), FlexAttention BlockMasks and
per-head masks, at compute tiles of 1 x 1, 16 x 16 and 64 x 64 (exactness at element
level whatever the tile), on the fused kernels (llvm, c) and the statements (llvm,
CUDA emulation).
"""

from __future__ import annotations

import pytest

import ucf
from tests.helpers import needs_cc

torch = pytest.importorskip("torch")


def reference(q, k, v, live, scale=None):
    """softmax over the live keys, rows with none 0; ``live`` broadcasts over (B,H,Sq,Sk)."""
    scale = 1 / q.shape[-1] ** 0.5 if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~live, float("-inf"))
    return (torch.softmax(s, -1).nan_to_num() @ v.double()).to(q.dtype)


def assert_grads_close(got, want, inputs, **tolerance):
    """The gradients of ``got`` and ``want`` in ``inputs`` agree, for one random ``dO``."""
    grad = torch.randn_like(got)
    mine = torch.autograd.grad(got, inputs, grad)
    theirs = torch.autograd.grad(want, inputs, grad)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, **tolerance)


def qkv(shape, dtype=torch.float32, seed=0, dv=None, grad=False):
    g = torch.Generator().manual_seed(seed)
    b, h, s, d = shape
    out = [torch.randn(b, h, s, d, generator=g, dtype=dtype) for _ in range(2)]
    out.append(torch.randn(b, h, s, dv or d, generator=g, dtype=dtype))
    return [t.requires_grad_(grad) for t in out]


def element_mask(s, density=0.3, seed=1, shape=None):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(*(shape or (s, s)), generator=g) < density
    m[..., 3, :] = False  # a query row with no live key
    return m


def dense_of(mask_mod, s):
    i = torch.arange(s)
    return mask_mod(torch.zeros(()), torch.zeros(()), i[:, None], i[None, :])


@pytest.mark.parametrize("granularity", [(1, 1), (16, 16), (64, 64)])
def test_element_masks_are_exact_whatever_the_tile(granularity):
    q, k, v = qkv((2, 3, 70, 16), dv=24)
    m = element_mask(70)
    got = ucf.attention(q, k, v, mask=m, granularity=granularity)
    torch.testing.assert_close(got, reference(q, k, v, m), atol=2e-6, rtol=1e-5)
    assert not got[:, :, 3].any()  # the all-masked row is 0, not NaN


@pytest.mark.parametrize(
    "name,mask_mod",
    [
        ("causal", ucf.nn.causal()),
        ("longformer", ucf.nn.longformer(5, [0, 40])),
        ("local", ucf.nn.local(3)),
    ],
)
def test_mask_functions(name, mask_mod):
    q, k, v = qkv((1, 2, 100, 32))
    got = ucf.attention(q, k, v, mask=mask_mod, granularity=(16, 16), scale=0.3)
    want = reference(q, k, v, dense_of(mask_mod, 100), 0.3)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_block_mask_and_per_head_masks():
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v = qkv((2, 2, 96, 64))
    keep = lambda b, h, qi, ki: (qi // 32 >= ki // 32) & ((qi + ki + h) % 5 != 0)  # noqa: E731
    bm = create_block_mask(keep, 2, 2, 96, 96, device="cpu", BLOCK_SIZE=16)
    i = torch.arange(96)
    live = keep(
        torch.arange(2)[:, None, None, None], torch.arange(2)[None, :, None, None], i[:, None], i
    )
    torch.testing.assert_close(
        ucf.attention(q, k, v, mask=bm), reference(q, k, v, live), atol=2e-6, rtol=1e-5
    )
    heads = element_mask(96, shape=(1, 2, 96, 96))  # shared by the batch, one per head
    got = ucf.attention(q, k, v, mask=heads, granularity=(64, 64))
    torch.testing.assert_close(got, reference(q, k, v, heads), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("target", ["llvm", pytest.param("c", marks=[needs_cc, pytest.mark.slow])])
def test_forward_and_backward_in_float32(target):
    """64-key tiles take the vector passes (exp, maxima) where no element is masked."""
    for mask in (None, element_mask(130, 0.5)):
        q, k, v = qkv((1, 2, 130, 64), grad=True)
        got = ucf.attention(q, k, v, mask=mask, target=target)
        live = torch.ones(130, 130, dtype=torch.bool) if mask is None else mask
        want = reference(q, k, v, live)
        torch.testing.assert_close(got, want, atol=3e-6, rtol=1e-5)
        assert_grads_close(got, want, (q, k, v), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("fused", [None, pytest.param(False, marks=pytest.mark.slow)])
def test_gradcheck_in_float64(fused):
    q, k, v = qkv((1, 2, 11, 4), torch.float64, grad=True)
    m = element_mask(11, 0.5)
    assert torch.autograd.gradcheck(
        lambda a, b, c: ucf.attention(a, b, c, mask=m, granularity=(4, 4), fused=fused),
        (q, k, v),
        fast_mode=True,
    )


def test_the_statements_under_the_cuda_emulator():
    q, k, v = qkv((1, 2, 12, 4), torch.float64)
    m = element_mask(12, 0.5)
    got = ucf.attention(q, k, v, mask=m, granularity=(4, 4), target="cuda", emulate=True)
    torch.testing.assert_close(got, reference(q, k, v, m))


@pytest.mark.slow
def test_the_backward_statements_under_the_cuda_emulator():
    q, k, v = qkv((1, 2, 12, 4), torch.float64, grad=True)
    m = element_mask(12, 0.5)
    got = ucf.attention(q, k, v, mask=m, granularity=(4, 4), target="cuda", emulate=True)
    assert_grads_close(got, reference(q, k, v, m), (q, k, v))


@pytest.mark.parametrize("fused", [None, pytest.param(False, marks=pytest.mark.slow)])
def test_lengths_against_each_sequence_alone(fused):
    """Zero-length, partial and full sequences of a padded batch."""
    q, k, v = qkv((3, 2, 40, 8), torch.float64, grad=True)
    lengths = torch.tensor([0, 17, 40])
    got = ucf.attention(
        q, k, v, mask=ucf.nn.causal(), granularity=(4, 4), lengths=lengths, fused=fused
    )
    want = torch.zeros_like(got)
    for b, n in enumerate(lengths.tolist()):
        if n:
            causal = dense_of(ucf.nn.causal(), n)
            want[b, :, :n] = reference(
                q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n], causal
            )[0]
    torch.testing.assert_close(got, want)
    assert_grads_close(got, want, (q, k, v))


def test_packed_linear_computes_the_valid_rows():
    torch.manual_seed(0)
    lin = ucf.nn.PackedLinear(24, 40)
    x = torch.randn(3, 12, 24)
    lengths = torch.tensor([0, 5, 12])
    valid = torch.arange(12)[None, :] < lengths[:, None]
    want = torch.nn.functional.linear(x, lin.weight, lin.bias) * valid[..., None]
    with torch.no_grad():
        torch.testing.assert_close(lin(x, lengths=lengths), want)  # the gathered kernel
        out = lin(ucf.nn.packed(x, lengths))
        assert isinstance(out, ucf.nn.Packed) and torch.equal(out.lengths, lengths)
        torch.testing.assert_close(out.data, want)
        full = torch.full((3,), 12)  # nothing padded: torch's dense product
        torch.testing.assert_close(lin(x, lengths=full), lin(x))
    y = lin(x, lengths=lengths)  # under autograd: torch's product, gradients flow
    y.sum().backward()
    assert lin.weight.grad is not None


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda q, k, v: ucf.attention(q, k, v, mask=torch.ones(5, 5)), "boolean mask"),
        (
            lambda q, k, v: ucf.attention(q, k, v, mask=torch.ones(4, 5, dtype=torch.bool)),
            "mask has shape",
        ),
        (lambda q, k, v: ucf.attention(q, k[:, :, :4], v), "must agree"),
        (lambda q, k, v: ucf.attention(q, k, v, granularity=(0, 4)), "granularity"),
        (lambda q, k, v: ucf.attention(q, k, v, lengths=[9]), "lengths must be"),
        (lambda q, k, v: ucf.attention(q, k, v, target="cuda", fused=True), "CPU targets"),
        (lambda q, k, v: ucf.attention(q, k, v, target="wasm"), "not 'wasm'"),
        (lambda q, k, v: ucf.attention(q.double(), k, v), "float32 or all float64"),
        (lambda q, k, v: ucf.attention(q, k, v, mask=lambda b, h, i, j: i), "not booleans"),
    ],
)
def test_bad_input_is_an_operand_error_naming_it(call, message):
    q, k, v = qkv((1, 1, 5, 4))
    with pytest.raises(ucf.UcfError, match=message):
        call(q, k, v)


def test_the_plan_shows_the_statements():
    plan = ucf.nn.SparseAttention(granularity=(32, 32)).cin
    assert "fused kernels over 32 x 32 tiles" in plan
    assert "scores: S(b,h,i,j) = M(i,j) + s * sum(d, Q(b,h,i,d) * K(b,h,j,d))" in plan
    assert "rowmax: m(b,h,i) = max(j, S(b,h,i,j))" in plan
    statements = ucf.nn.SparseAttention(fused=False).cin
    assert "forall(b, forall(h, forall(i, where(m(b, h, i) = max_j" in statements
