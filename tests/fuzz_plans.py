"""Dynamic tiles and TeSA plans for the fuzzers, drawn and run the same way by both.

``tests/statement_fuzz.py`` (random statements) and ``tests/schedule/fuzz_cases.py`` (the
classic kernels under random schedules) each turn some of their cases into:

- a **dynamic** case: one dense operand read once is compiled with ``dynamic={name:
  tile}`` (tiles of extents 1 to 3 per mode) and passed with a random mask; the
  reference reads that operand times its mask. Statements a dynamic operand cannot
  serve (a compound variable) may be refused, with an ``UnsupportedError`` or a
  ``ScheduleError`` (``refusals``) and nothing else.
- a **TeSA** case: the statement as a ``ucf.program`` with random masks and widths on
  its matrices, optionally propagated, transformed under a random ``ucf.Policy`` and
  compiled. A plan that ``transform`` returns must compile, so nothing may be refused;
  the reference reads every input as ``plan.stored`` gives it (its parts quantized).

Specs are plain data (JSON), so a case crosses to a worker and prints as a repro.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def refusals() -> tuple[type, ...]:
    """How a dynamic case may be refused."""
    import ucf

    return (ucf.UnsupportedError, ucf.ScheduleError)


#: Block costs a policy may give (shape -> cost per block), as JSON-able lists.
BLOCKS = (
    [[[1, 1], 1.0]],
    [[[1, 1], 1.0], [[2, 2], 2.5]],
    [[[1, 1], 1.0], [[2, 1], 1.5], [[2, 2], 3.0]],
    [[[1, 1], 1.0], [[1, 2], 1.5], [[3, 3], 6.0]],
)
#: The widths a policy offers, and those an attribute gives its kept elements.
POLICY_BITS = ([32], [8, 32], [16, 32], [8, 16, 32], [4, 8, 32])
ATTR_BITS = ([32], [8, 32], [8], [16, 32], [4, 32])


def draw_tile(d: Any, order: int) -> list[int]:
    """A micro-tile shape with at least one extent over 1 when the draw allows it."""
    tile = [d.choice((1, 2, 3)) for _ in range(order)]
    if order and all(t == 1 for t in tile) and d.boolean(0.8):
        tile[d.integer(0, order - 1)] = d.choice((2, 3))
    return tile


def draw_tesa(d: Any, shapes: dict[str, tuple[int, ...]]) -> dict:
    """Attributes for some of the matrices in ``shapes``, a policy, and whether the
    attributes are propagated first."""
    attrs = {}
    for name, shape in shapes.items():
        if len(shape) == 2 and d.boolean(0.75):
            attrs[name] = {
                "density": d.choice((0.5, 0.2, 0.8, 1.0)),
                "block": d.choice((1, 2)),
                "bits": d.choice(ATTR_BITS),
            }
    policy = {
        "bits": d.choice(POLICY_BITS),
        "blocks": d.choice(BLOCKS),
        "min_sparsity": d.choice((0.0, 0.3, 0.5)),
    }
    return {"attrs": attrs, "policy": policy, "propagate": d.boolean(0.5)}


def make_attrs(spec: dict, shapes: dict[str, tuple[int, ...]], seed: int) -> dict:
    """The ``ucf.TeSA`` of each attribute spec: kept blocks of the given size (cut to
    the shape), each kept element given one of the spec's widths."""
    import ucf

    rng = np.random.default_rng(seed)
    out = {}
    for name, a in sorted(spec.items()):
        shape, b = shapes[name], a["block"]
        grid = [-(-n // b) for n in shape]
        kept = np.kron(rng.random(grid) < a["density"], np.ones((b, b), bool))
        kept = kept[: shape[0], : shape[1]]
        bits = rng.choice(a["bits"], size=shape)
        out[name] = ucf.TeSA(np.where(kept, bits, 0))
    return out


def make_policy(spec: dict) -> Any:
    import ucf

    blocks = {tuple(shape): cost for shape, cost in spec["blocks"]}
    return ucf.Policy(bits=set(spec["bits"]), blocks=blocks, min_sparsity=spec["min_sparsity"])


def run_tesa(
    expr: str, arrays: dict[str, np.ndarray], spec: dict, seed: int, target: str
) -> tuple[np.ndarray, dict[str, np.ndarray], str]:
    """The plan's result, the inputs as it computes with them (the reference's), and
    the plan's text (for a failure's report)."""
    import ucf

    shapes = {n: a.shape for n, a in arrays.items()}
    attrs = make_attrs(spec["attrs"], shapes, seed)
    program = ucf.program(expr, shapes=shapes, attrs=attrs)
    if spec["propagate"]:
        program.propagate()
    plan = program.transform(make_policy(spec["policy"]))
    run = plan.compile(target=target, dtype="float64")
    out = program.outputs[0]
    got = np.asarray(run(**arrays)[out])
    stored = {n: plan.stored(n, a, dtype=np.float64) for n, a in arrays.items()}
    return got, stored, str(plan)


def run_dynamic(
    expr: str,
    formats: dict[str, str],
    arrays: dict[str, np.ndarray],
    spec: dict,
    target: str,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The kernel's result with ``spec["name"]`` dynamic, and the operands the
    reference reads (that one times its mask)."""
    import ucf

    name = spec["name"]
    formats = {n: f for n, f in formats.items() if f}  # "" or absent: dense
    rng = np.random.default_rng(spec["mask"])
    mask = rng.random(arrays[name].shape) < spec["density"]
    k = ucf.compile(expr, formats=formats, target=target, dynamic={name: tuple(spec["tile"])})
    ops = {
        n: ucf.from_numpy(a, format=formats[n]) if formats.get(n) else a for n, a in arrays.items()
    }
    got = k(**ops, masks={name: mask}).to_numpy()
    return got, {**arrays, name: arrays[name] * mask}
