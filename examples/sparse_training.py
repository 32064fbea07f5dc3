"""SparDA's sparse-training scenario at CPU scale: iterative magnitude pruning of a BERT
feed-forward block with a new mask every step.

    y = W2 gelu(W1 x + b1) + b2       768 -> 3072 -> 768, batches of 32 x 128 tokens

Both weights are ``ucf.nn.DynamicSparseLinear`` layers. Every step prunes them by
magnitude at a tile granularity (32 x 64 or 32 x 1 of the weight, rows x columns),
towards 90 % sparsity on a cubic schedule, gives the new masks to the layers, runs
forward and backward (each call indexes the mask's live tiles and computes over them
only, SparDA's STile path), and updates the weights with SGD or Adam, keeping pruned
weights at zero. The data is synthetic: a fixed random teacher block maps random
tokens to targets, and the loss is the mean squared error.

The script prints the time per step (forward, backward and update; the pruning
itself, the same for any model, is timed apart) for ucf and for torch's dense block
(``torch.nn.Linear``, no mask), and checks ucf's loss curve against torch computing
the same masked block densely (same initial weights, data and masks).

    python examples/sparse_training.py [--quick] [--granularity 32x1] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
import torch  # noqa: E402
from _common import ROOT  # noqa: E402, F401  (puts the checkout on sys.path)

import ucf.nn  # noqa: E402


def tile_mask(weight: torch.Tensor, tile: tuple[int, int], sparsity: float) -> torch.Tensor:
    """The grid of ``tile``-sized tiles of ``weight`` to keep: the ``1 - sparsity`` share
    of them with the largest sum of magnitudes."""
    rows, cols = weight.shape[0] // tile[0], weight.shape[1] // tile[1]
    norms = weight.detach().abs().reshape(rows, tile[0], cols, tile[1]).sum(dim=(1, 3))
    keep = max(1, round((1 - sparsity) * norms.numel()))
    threshold = norms.flatten().kthvalue(norms.numel() - keep + 1).values
    return norms >= threshold


def sparsity_at(step: int, steps: int, final: float) -> float:
    """A cubic ramp from 0 to ``final`` over the first two thirds of the steps (Zhu and
    Gupta's schedule), then ``final``."""
    ramp = max(1, (2 * steps) // 3)
    done = min(1.0, step / ramp)
    return final * (1 - (1 - done) ** 3)


class Block(torch.nn.Module):
    """The feed-forward block; ``sparse`` picks ucf's dynamic layers or torch's dense
    ones (whose weights are masked in the forward pass when given masks)."""

    def __init__(self, hidden: int, ffn: int, tile: tuple[int, int], sparse: bool, act: str):
        super().__init__()
        if sparse:
            self.fc1 = ucf.nn.DynamicSparseLinear(hidden, ffn, granularity=tile)
            self.fc2 = ucf.nn.DynamicSparseLinear(ffn, hidden, granularity=tile)
        else:
            self.fc1, self.fc2 = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)
        self.sparse, self.tile = sparse, tile
        self.act = torch.nn.GELU() if act == "gelu" else torch.nn.ReLU()
        self.masks: list[torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = (self.fc1, self.fc2)
        if self.sparse or self.masks is None:
            h = self.act(self.fc1(x))
            return self.fc2(h)
        w = [l.weight * _spread(m, self.tile) for l, m in zip(layers, self.masks, strict=True)]
        h = self.act(torch.nn.functional.linear(x, w[0], self.fc1.bias))
        return torch.nn.functional.linear(h, w[1], self.fc2.bias)

    def prune(self, masks: list[torch.Tensor]) -> None:
        """Give the layers their new tile masks and zero the pruned weights."""
        self.masks = masks
        for layer, m in zip((self.fc1, self.fc2), masks, strict=True):
            if self.sparse:
                layer.mask = m
            with torch.no_grad():
                layer.weight.mul_(_spread(m, self.tile))


def _spread(grid: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    return grid.repeat_interleave(tile[0], 0).repeat_interleave(tile[1], 1)


def train(
    model: Block,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    args: argparse.Namespace,
    given: list | None = None,
) -> tuple[list[float], list[float], list[float], list]:
    """Run the pruning loop: the losses, the time of each step and of each pruning, and
    the masks of each step. ``given`` gives the masks instead of pruning by magnitude."""
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses, steps, pruning, used = [], [], [], []
    for k, (x, target) in enumerate(data):
        start = time.perf_counter()
        if given is not None:
            masks = given[k]
        elif args.prune:
            s = sparsity_at(k + 1, len(data), args.sparsity)
            masks = [tile_mask(layer.weight, model.tile, s) for layer in (model.fc1, model.fc2)]
        else:
            masks = None
        if masks is not None:
            model.prune(masks)
        used.append(masks)
        middle = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if masks is not None:
            with torch.no_grad():  # the update keeps pruned weights at zero
                for layer, m in zip((model.fc1, model.fc2), masks, strict=True):
                    layer.weight.mul_(_spread(m, model.tile))
        end = time.perf_counter()
        losses.append(loss.item())
        steps.append(end - middle)
        pruning.append(middle - start)
    return losses, steps, pruning, used


def synthetic(args: argparse.Namespace) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of random tokens and a fixed random teacher block's outputs."""
    g = torch.Generator().manual_seed(args.seed)
    teacher = [torch.randn(args.ffn, args.hidden, generator=g) / args.hidden**0.5]
    teacher.append(torch.randn(args.hidden, args.ffn, generator=g) / args.ffn**0.5)
    tokens = args.batch * args.seq
    data = []
    for _ in range(args.steps):
        x = torch.randn(tokens, args.hidden, generator=g)
        data.append((x, torch.nn.functional.gelu(x @ teacher[0].T) @ teacher[1].T))
    return data


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (CI smoke test)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32, help="sequences per batch")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--granularity", default="32x64", help="tile of the weights, rows x cols")
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--activation", choices=("gelu", "relu"), default="gelu")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.ffn, args.batch, args.seq, args.steps = 64, 128, 2, 16, 8
    args.prune = True
    tile = tuple(int(k) for k in args.granularity.lower().split("x"))
    torch.set_num_threads(args.threads)
    ucf.set_num_threads(args.threads)
    data = synthetic(args)

    torch.manual_seed(args.seed)
    ours = Block(args.hidden, args.ffn, tile, sparse=True, act=args.activation)
    reference = Block(args.hidden, args.ffn, tile, sparse=False, act=args.activation)
    reference.load_state_dict(ours.state_dict(), strict=False)
    dense = Block(args.hidden, args.ffn, tile, sparse=False, act=args.activation)
    dense.load_state_dict(ours.state_dict(), strict=False)

    losses, steps, pruning, masks = train(ours, data, args)
    want = train(reference, data, args, given=masks)[0]
    args.prune = False
    dense_steps = train(dense, data, args)[1]

    warm = slice(min(2, len(steps) - 1), None)  # the first steps compile the kernels
    ucf_step, torch_step = statistics.median(steps[warm]), statistics.median(dense_steps[warm])
    prune = statistics.median(pruning) * 1e3
    print(f"FFN {args.hidden}->{args.ffn}->{args.hidden}, {args.batch}x{args.seq} tokens,")
    print(
        f"  {args.granularity} tiles to {args.sparsity:.0%}, {args.optimizer}, {args.steps} steps"
    )
    print(f"  ucf step      {ucf_step * 1e3:9.2f} ms  (pruning {prune:.2f} ms apart)")
    print(f"  torch dense   {torch_step * 1e3:9.2f} ms  ({torch_step / ucf_step:.2f}x ucf's time)")
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, want, strict=True))
    print(f"  loss {losses[0]:.5f} -> {losses[-1]:.5f}; torch dense masked {want[-1]:.5f}")
    print(f"  largest relative difference of the loss curves: {worst:.2e}")
    ok = worst < 1e-3
    print("loss curve matches torch dense masked" if ok else "MISMATCH against torch dense masked")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
