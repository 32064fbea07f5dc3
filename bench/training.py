"""Sparse training (issue 35, Performance): one training step of a BERT feed-forward block.

Run from the repository root:

    python bench/training.py             # 768 -> 3072 -> 768, 32x128 and 8x128 tokens
    python bench/training.py --quick     # small sizes: seconds

One step is forward, backward and an Adam update of ``y = W2 gelu(W1 x + b1) + b2``
at 90 % sparsity, float32, 2 threads, with a new random mask every step at 32 x 64
and at 32 x 1 tiles of the weights (made before the clock starts; building the
index of each is part of ucf's step). Three blocks take turns on each step, and
each one's median over the timed steps is reported:

- ucf: ``ucf.nn.DynamicSparseLinear`` layers (SparDA's STile path);
- torch dense: ``torch.nn.Linear`` (no mask);
- torch sparse: the masked weight converted with ``to_sparse_csr`` every step, the
  products by ``torch.sparse.mm`` and the weight's gradient by
  ``torch.sparse.sampled_addmm`` (torch's CPU BSR takes square blocks only and has
  no transposed product, so CSR is the sparse layout that runs the whole step).

Also: the time to index a 768 x 3072 mask at 32 x 1 against the step (the number
of index builds a step makes times one build), and the peak memory of a
``SparseLinear`` weight gradient at 90 % against the dense gradient's size
(tracemalloc over the gradient's kernel). Every target row prints met or NOT met.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ucf  # noqa: E402
import ucf.nn  # noqa: E402

#: Index builds per ucf step: each layer's forward and weight gradient, and the input
#: gradient of the second layer (the block's input needs none).
BUILDS_PER_STEP = 5


class SparseCSR(torch.autograd.Function):
    """torch's own sparse path for a masked linear layer, the CSR of the mask's pattern
    (not of the weight's nonzeros, which pruned steps leave fewer) made every step."""

    @staticmethod
    def forward(ctx, x, weight, bias, mask):
        pattern = mask.to_sparse_csr()
        rows, cols = pattern.crow_indices(), pattern.col_indices()
        w = torch.sparse_csr_tensor(rows, cols, weight.detach()[mask], mask.shape)
        ctx.w, ctx.mask = w, mask
        ctx.save_for_backward(x)
        return torch.sparse.mm(w, x.t()).t() + bias

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        g = grad.t().contiguous()
        grad_x = torch.sparse.mm(ctx.w.t(), g).t() if ctx.needs_input_grad[0] else None
        pattern = ctx.w.detach().clone()
        grad_w = torch.sparse.sampled_addmm(pattern, g, x, beta=0.0).to_dense()
        return grad_x, grad_w, grad.sum(0), None


class Block(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int, kind: str, tile: tuple[int, int]):
        super().__init__()
        self.kind, self.tile = kind, tile
        if kind == "ucf":
            self.fc1 = ucf.nn.DynamicSparseLinear(hidden, ffn, granularity=tile)
            self.fc2 = ucf.nn.DynamicSparseLinear(ffn, hidden, granularity=tile)
        else:
            self.fc1, self.fc2 = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)
        self.masks = None

    def forward(self, x):
        if self.kind == "torch sparse":
            h = torch.nn.functional.gelu(
                SparseCSR.apply(x, self.fc1.weight, self.fc1.bias, self.masks[0])
            )
            return SparseCSR.apply(h, self.fc2.weight, self.fc2.bias, self.masks[1])
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    def set_masks(self, masks):
        self.masks = masks
        if self.kind == "ucf":
            self.fc1.mask, self.fc2.mask = masks


def random_masks(shape: tuple[int, int], tile: tuple[int, int], sparsity: float, g) -> torch.Tensor:
    grid = torch.rand(shape[0] // tile[0], shape[1] // tile[1], generator=g) >= sparsity
    return grid.repeat_interleave(tile[0], 0).repeat_interleave(tile[1], 1)


def step_times(args, tokens: int, tile: tuple[int, int]) -> dict[str, float]:
    """The median step time of each block, the blocks taking turns on every step."""
    g = torch.Generator().manual_seed(args.seed)
    blocks = {
        k: Block(args.hidden, args.ffn, k, tile) for k in ("ucf", "torch dense", "torch sparse")
    }
    opts = {k: torch.optim.Adam(b.parameters(), lr=1e-4) for k, b in blocks.items()}
    x = torch.randn(tokens, args.hidden, generator=g)
    target = torch.randn(tokens, args.hidden, generator=g)
    times = {k: [] for k in blocks}
    for step in range(args.warmup + args.steps):
        masks = [
            random_masks((args.ffn, args.hidden), tile, args.sparsity, g),
            random_masks((args.hidden, args.ffn), tile, args.sparsity, g),
        ]
        for k, block in blocks.items():
            t0 = time.perf_counter()
            block.set_masks(masks)
            loss = torch.nn.functional.mse_loss(block(x), target)
            opts[k].zero_grad(set_to_none=True)
            loss.backward()
            opts[k].step()
            if k != "torch dense":
                with torch.no_grad():
                    block.fc1.weight.mul_(masks[0])
                    block.fc2.weight.mul_(masks[1])
            if step >= args.warmup:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def index_time(args) -> float:
    """The median time to index a hidden x ffn mask at 32 x 1 (a new mask each call)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    masks = [
        random_masks((args.hidden, args.ffn), (32, 1), args.sparsity, g).numpy() for _ in range(7)
    ]
    ucf.stile_index(masks[0], (32, 1))
    times = []
    for m in masks:
        t0 = time.perf_counter()
        ucf.stile_index(m, (32, 1))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gradient_memory(args, tokens: int) -> tuple[int, int]:
    """Peak bytes ucf allocates while a 90 % SparseLinear computes its weight gradient
    (the kernel's output and what it works in; the layer's input needs no gradient), and
    the bytes of the dense gradient."""
    g = torch.Generator().manual_seed(args.seed + 2)
    mask = random_masks((args.ffn, args.hidden), (32, 64), args.sparsity, g)
    layer = ucf.nn.SparseLinear(args.hidden, args.ffn, bias=False, mask=mask, format="bcsr(32,64)")
    x = torch.randn(tokens, args.hidden, generator=g)
    y = layer(x)
    grad = torch.randn_like(y)
    y.backward(grad)  # compiles
    layer.values.grad = None
    y = layer(x)
    tracemalloc.start()
    tracemalloc.reset_peak()
    y.backward(grad)
    _, peak = tracemalloc.get_traced_memory()  # numpy's allocations (torch's are not traced)
    tracemalloc.stop()
    return peak, args.ffn * args.hidden * 4


def row(name: str, value: str, target: str, met: bool | None) -> None:
    verdict = "n/a" if met is None else ("met" if met else "NOT met")
    print(f"  {name:<58} {value:>16}   target {target:<18} {verdict}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batches", default="32,8", help="sequences per batch, comma-separated")
    p.add_argument("--sparsity", type=float, default=0.9)
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.ffn, args.seq, args.batches, args.steps = 128, 256, 16, "4", 2
    torch.set_num_threads(args.threads)
    ucf.set_num_threads(args.threads)
    print(
        f"FFN {args.hidden}->{args.ffn}->{args.hidden}, {args.sparsity:.0%} sparse, "
        f"float32, {args.threads} threads, Adam; median of {args.steps} steps"
    )
    first = None
    for batch in (int(b) for b in args.batches.split(",")):
        tokens = batch * args.seq
        print(f"\nbatch {batch}x{args.seq} ({tokens} tokens)")
        for tile, goal in (((32, 64), 2.0), ((32, 1), 1.5)):
            t = step_times(args, tokens, tile)
            name = f"{tile[0]}x{tile[1]}"
            ms = {k: f"{v * 1e3:.1f} ms" for k, v in t.items()}
            print(
                f"  {name}: ucf {ms['ucf']}, torch dense {ms['torch dense']}, "
                f"torch sparse (CSR) {ms['torch sparse']}"
            )
            speedup = t["torch dense"] / t["ucf"]
            row(f"{name} step vs torch dense", f"{speedup:.2f}x", f">= {goal}x", speedup >= goal)
            ahead = t["torch sparse"] / t["ucf"]
            row(f"{name} step vs torch sparse (CSR)", f"{ahead:.2f}x", "> 1x", ahead > 1)
            if first is None and tile == (32, 1):
                first = t["ucf"]
    build = index_time(args)
    share = BUILDS_PER_STEP * build / first
    row(
        f"index rebuild at 32x1, {args.hidden}x{args.ffn} ({BUILDS_PER_STEP} per step)",
        f"{share:.1%} of step",
        "<= 5%",
        share <= 0.05,
    )
    print(f"  (one build {build * 1e3:.2f} ms; step {first * 1e3:.1f} ms)")
    used, dense = gradient_memory(args, int(args.batches.split(",")[0]) * args.seq)
    share = used / dense
    row(
        "SparseLinear weight-gradient peak memory at 90% vs dense",
        f"{share:.1%}",
        "<= 15%",
        share <= 0.15,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
