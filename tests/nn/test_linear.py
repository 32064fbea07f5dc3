"""ucf.nn's linear layers against torch: gradcheck in float64, torch's dense masked
layer in float32, the pattern of the weight's gradient, state_dict, and SparDA's
pruning loop (examples/sparse_training.py) against torch dense masked."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ucf
from ucf.format.tensor import held

torch = pytest.importorskip("torch")
from torch.autograd import gradcheck  # noqa: E402
from torch.func import functional_call  # noqa: E402

import ucf.nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def one_thread():
    """Parallel loops on one thread: two test workers share two cores, and threads that
    wait for each other on a busy machine make small kernels slow."""
    ucf.set_num_threads(1)


def dense_weight(layer: ucf.nn.SparseLinear) -> torch.Tensor:
    return layer.weight.clone().requires_grad_()


def test_ucf_nn_imports_with_and_without_import_ucf_first():
    script = (
        "import sys, ucf\n"
        "assert 'torch' not in sys.modules\n"
        "assert ucf.nn.SparseLinear.__name__ == 'SparseLinear'\n"
        "import ucf.nn\n"
        "print(ucf.nn.DynamicSparseLinear.__name__)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "DynamicSparseLinear"


@pytest.mark.parametrize("fmt", ["csr", "bcsr(4,8)", "nm(2,4)"])
def test_sparse_linear_gradcheck(fmt, one_thread):
    torch.manual_seed(0)
    mask = torch.rand(16, 24) < 0.4 if fmt == "csr" else None
    layer = ucf.nn.SparseLinear(24, 16, mask=mask, format=fmt, dtype=torch.float64)
    x = torch.randn(5, 24, dtype=torch.float64, requires_grad=True)
    values = layer.values.detach().clone().requires_grad_()
    bias = layer.bias.detach().clone().requires_grad_()

    def f(v, b, x):
        return functional_call(layer, {"values": v, "bias": b}, (x,))

    assert gradcheck(f, (values, bias, x))


@pytest.mark.parametrize("fmt", ["csr", "bcsr(8,8)", "nm(2,4)"])
def test_sparse_linear_against_torch_dense_masked(fmt, one_thread):
    torch.manual_seed(1)
    linear = torch.nn.Linear(32, 24)
    mask = (torch.rand(24, 32) < 0.3) if fmt == "csr" else None
    layer = ucf.nn.SparseLinear.from_dense(linear, mask=mask, format=fmt)
    kept = layer.weight != 0
    x = torch.randn(3, 7, 32, requires_grad=True)  # leading dimensions are kept
    y = layer(x)
    assert y.shape == (3, 7, 24) and y.dtype == torch.float32
    w, xr = dense_weight(layer), x.detach().clone().requires_grad_()
    want = torch.nn.functional.linear(xr, w, linear.bias)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(y)
    y.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    # The gradient has one entry per stored value, on the weight's own pattern.
    assert layer.values.grad.shape == layer.values.shape
    p = layer._pattern()
    got = ucf.Tensor(p.shape, p.format, p.levels, layer.values.grad.numpy()).to_numpy()
    torch.testing.assert_close(torch.from_numpy(got), w.grad * kept, rtol=1e-4, atol=1e-5)
    if mask is not None:
        assert layer.values.numel() == mask.sum()


def test_sparse_linear_keeps_its_pattern_and_state_dict(one_thread):
    torch.manual_seed(2)
    grid = torch.tensor([[True, False], [True, True]])
    mask = torch.kron(grid, torch.ones(32, 32, dtype=torch.bool))
    layer = ucf.nn.SparseLinear(64, 64, mask=mask)  # block-aligned: the Policy picks blocks
    assert str(layer.format) == str(ucf.parse_format("bcsr(32,32)", order=2))
    assert torch.equal(layer.weight != 0, mask)
    ucf_opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(6, 64)
    layer(x).square().sum().backward()
    ucf_opt.step()
    assert torch.equal(layer.weight != 0, mask)  # an update moves stored values only
    state = layer.state_dict()
    assert {"values", "bias"} <= set(state) and any(k.startswith("pattern_") for k in state)
    copy = ucf.nn.SparseLinear(64, 64, mask=mask)
    copy.load_state_dict(state)
    torch.testing.assert_close(copy(x), layer(x))
    scattered = ucf.nn.SparseLinear(32, 32, mask=torch.rand(32, 32) < 0.2)
    assert str(scattered.format) == "UC"


def test_sparse_linear_quantized_values(one_thread):
    """bits=8: the products read the values quantized with a scale per block (as
    ucf.quantize holds them), and the gradient passes straight through to the floats."""
    torch.manual_seed(3)
    linear = torch.nn.Linear(16, 16)
    layer = ucf.nn.SparseLinear.from_dense(linear, format="bcsr(4,4)", bits=8)
    p = layer._pattern()
    plain = ucf.Tensor(p.shape, p.format, p.levels, layer.values.detach().numpy())
    stored = held(plain, ucf.parse_format("bcsr(4,4)@qint8:1", order=2))
    wq = torch.from_numpy(ucf.Tensor(p.shape, p.format, p.levels, stored.numbers()).to_numpy())
    assert not torch.equal(wq, linear.weight.detach())  # quantized, close
    x = torch.randn(5, 16, requires_grad=True)
    y = layer(x)
    xr = x.detach().clone().requires_grad_()
    want = torch.nn.functional.linear(xr, wq, linear.bias)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(y)
    y.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    got = ucf.Tensor(p.shape, p.format, p.levels, layer.values.grad.numpy()).to_numpy()
    torch.testing.assert_close(torch.from_numpy(got), grad.T @ x.detach(), rtol=1e-4, atol=1e-5)


def test_sparse_linear_half_precision_values(one_thread):
    """bits=16: the products read the values in float16 (docs/training.md); this raised
    "int4 values must be integers" before."""
    torch.manual_seed(4)
    linear = torch.nn.Linear(16, 8)
    layer = ucf.nn.SparseLinear.from_dense(linear, mask=torch.rand(8, 16) < 0.4, bits=16)
    x = torch.randn(5, 16)
    half = layer.weight.to(torch.float16).to(torch.float32)
    assert not torch.equal(half, layer.weight)  # rounded, close
    want = torch.nn.functional.linear(x, half, linear.bias)
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)


def test_sparse_linear_refuses_what_it_cannot_build():
    with pytest.raises(ucf.OperandError, match="a mask, a format or both"):
        ucf.nn.SparseLinear(4, 4)
    with pytest.raises(ucf.OperandError, match="shape"):
        ucf.nn.SparseLinear(4, 4, mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ucf.FormatError):
        ucf.nn.SparseLinear(8, 4, mask=torch.ones(4, 8, dtype=torch.bool), format="nm(2,4)")


@pytest.mark.parametrize(
    "tile",
    [
        (1, 1),
        (32, 1),
        pytest.param((2, 3), marks=pytest.mark.slow),
        pytest.param((32, 8), marks=pytest.mark.slow),
    ],
)
def test_dynamic_sparse_linear_gradcheck(tile, one_thread):
    torch.manual_seed(4)
    out, inp = (64, 16) if tile[0] == 32 else (6, 9)
    layer = ucf.nn.DynamicSparseLinear(inp, out, granularity=tile, dtype=torch.float64)
    grid = torch.rand(-(-out // tile[0]), -(-inp // tile[1])) < 0.5
    layer.mask = grid
    x = torch.randn(4, inp, dtype=torch.float64, requires_grad=True)
    w = layer.weight.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_()

    def f(w, b, x):
        return functional_call(layer, {"weight": w, "bias": b}, (x,))

    assert gradcheck(f, (w, b, x), fast_mode=out > 8)
    f(w, b, x).sum().backward()
    assert not w.grad[~layer.mask].any()  # zero outside the live tiles and the mask
    wr = layer.weight.detach().clone().requires_grad_()
    torch.nn.functional.linear(x.detach(), wr * layer.mask, b.detach()).sum().backward()
    torch.testing.assert_close(w.grad, wr.grad)


def test_dynamic_sparse_linear_masks_per_call_and_chained_layers(one_thread):
    torch.manual_seed(5)
    fc1 = ucf.nn.DynamicSparseLinear(64, 96, granularity=(32, 8))
    fc2 = ucf.nn.DynamicSparseLinear(96, 64, granularity=(32, 8))
    x = torch.randn(20, 64, requires_grad=True)
    m1 = torch.rand(3, 8) < 0.5
    m2 = torch.rand(64, 96) < 0.3  # an element mask: the mask wins inside live tiles
    y = fc2(torch.nn.functional.gelu(fc1(x, mask=m1)), mask=m2)
    assert fc1.mask is None  # a mask given to one call is not kept
    w1 = fc1.weight.detach().clone().requires_grad_()
    w2 = fc2.weight.detach().clone().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    spread = m1.repeat_interleave(32, 0).repeat_interleave(8, 1)
    h = torch.nn.functional.gelu(torch.nn.functional.linear(xr, w1 * spread, fc1.bias))
    want = torch.nn.functional.linear(h, w2 * m2, fc2.bias)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(y)
    y.backward(grad)
    want.backward(grad)
    for got, ref in ((x.grad, xr.grad), (fc1.weight.grad, w1.grad), (fc2.weight.grad, w2.grad)):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ucf.OperandError, match="grid of 32x8 tiles"):
        fc1.mask = torch.ones(5, 5, dtype=torch.bool)


def _example():
    path = ROOT / "examples" / "sparse_training.py"
    spec = importlib.util.spec_from_file_location("ucf_example_sparse_training_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("tile", ["32x64", pytest.param("32x1", marks=pytest.mark.slow)])
def test_twenty_steps_of_pruning_match_torch_dense_masked(tile, one_thread):
    ex = _example()
    args = ex.argparse.Namespace(
        seed=0,
        steps=20,
        batch=2,
        seq=8,
        hidden=64,
        ffn=128,
        sparsity=0.9,
        optimizer="adam",
        lr=1e-3,
        prune=True,
        activation="gelu",
    )
    data = ex.synthetic(args)
    shape = tuple(int(k) for k in tile.split("x"))
    torch.manual_seed(0)
    ours = ex.Block(64, 128, shape, sparse=True, act="gelu")
    ref = ex.Block(64, 128, shape, sparse=False, act="gelu")
    ref.load_state_dict(ours.state_dict(), strict=False)
    losses, _, _, masks = ex.train(ours, data, args)
    want = ex.train(ref, data, args, given=masks)[0]
    np.testing.assert_allclose(losses, want, rtol=2e-5)
    final = masks[-1][0]
    assert final.sum() == max(1, round(0.1 * final.numel()))  # pruned to 90 % of the tiles
    spread = final.repeat_interleave(shape[0], 0).repeat_interleave(shape[1], 1)
    assert not ours.fc1.weight[~spread].any()  # pruned weights stay at zero
