"""The cache of packed panels (``ucf.passes.panels``): bcsr SpMM packs each block
column's rows of B once per call and thread, and every later block that names the
column reads them. Against numpy on llvm and c, and bit for bit alike with each other
and with the nest without register blocking (random floats, which round), over partial
panels (columns of B not a multiple of the tile), partial blocks, empty block rows, a
single block row, one and two threads (a cache each), and caches too small for every
panel (slots shared: panels evicted and packed again when next named). Every tile
prefetches a share of the next block's panel, or of the rows of B it is packed from
when it is not packed yet (here however small the panels), which changes no value."""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.helpers import needs_cc
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes
from ucf.passes import panels, register_nests, tiling
from ucf.schedule import block_rows, cpu_model

SPMM = "C(i,j) = A(i,k) * B(k,j)"
BLOCK = (16, 8)


def tile_width() -> int:
    """Columns of a register tile of float32 on this host."""
    wide = tiling.tile_bytes("f32") == tiling.WIDE_BYTES
    rows = register_nests.WIDE_ROWS if wide else register_nests.ROWS
    return register_nests.VECTORS[rows] * tiling.tile_bytes("f32") // 4


def operands(case: str):
    """A (bcsr(16,8)) and B with two whole tiles of columns and 5 more: ``spread`` has 5
    block rows (the last partial, the second empty) over 5 block columns (the last
    partial), most columns named by several rows; ``single`` one block row; ``empty``
    no block."""
    rng = np.random.default_rng(21)
    rows = {"spread": 75, "single": 16, "empty": 30}[case]
    shape = (rows, 37)
    grid = [-(-n // b) for n, b in zip(shape, BLOCK, strict=True)]
    live = rng.random(grid) < (0.0 if case == "empty" else 0.7)
    if case == "spread":
        live[1] = False
        live[0, 1] = live[2, 1] = live[3, 1] = True  # column 1 named three times
    mask = np.kron(live, np.ones(BLOCK))[: shape[0], : shape[1]]
    a = (mask * rng.standard_normal(shape)).astype(np.float32)
    b = rng.standard_normal((37, 2 * tile_width() + 5)).astype(np.float32)
    return a, b


def slots_of(n: int) -> int:
    """``CACHE_BYTES`` for ``n`` panels of ``operands``' B."""
    return n * BLOCK[1] * 2 * tile_width() * 4


# (case, panels the cache holds: None for the default, the team's cache, which holds
# them all; "own" for each thread's, which holds them all too; a number for each
# thread's holding that many; 0 for fewer bytes than a panel, whose tiles of columns
# are then packed and run one at a time; threads)
CASES = [
    ("spread", None, 2),
    ("spread", "own", 2),
    ("spread", 2, 1),
    ("spread", 1, 2),
    ("spread", 0, 1),
    ("single", None, 1),
    ("empty", None, 2),
]


@needs_cc
@pytest.mark.parametrize("case, held, threads", CASES)
def test_cached_panels_against_numpy(case, held, threads, monkeypatch, tmp_path):
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))  # CACHE_BYTES is not in the key
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 1 << 40)  # the plan parallel over i_blk
    monkeypatch.setattr(block_rows, "NEAR_BYTES", 0)  # prefetch the next panel however small
    if held is not None:  # a cache of each thread's own
        monkeypatch.setattr(panels, "TEAM_BYTES", 0)
    if isinstance(held, int):
        monkeypatch.setattr(panels, "CACHE_BYTES", max(1, slots_of(held)))
    a, b = operands(case)
    fmt = f"bcsr({BLOCK[0]},{BLOCK[1]})"
    t = ucf.from_numpy(a, format=fmt)
    ucf.set_num_threads(threads)
    got = {}
    for target in ("llvm", "c"):
        k = ucf.compile(SPMM, formats={"A": fmt}, dtype="float32", target=target)
        # the loop is parallel: the team's cache, or each thread's own at the call
        assert "packed once per call and team for each k_blk" in k.cin
        # each tile prefetches its share of the next block's panel (``ahead``), or
        # of the rows of B it is packed from when it is not packed yet
        # into the L2 only for the panel (``PANEL_LEVEL``), every level for B's rows
        fetched = {(n.array.name, n.level) for n in nodes(k.llir) if isinstance(n, ir.Prefetch)}
        assert fetched == {("B_panel0", panels.PANEL_LEVEL), ("B_vals", 1)}
        assert panels.PANEL_LEVEL == 2
        got[target] = k(A=t, B=b).to_numpy()
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    k = ucf.compile(SPMM, formats={"A": fmt}, dtype="float32")
    assert not any(isinstance(n, ir.Alloc) for n in nodes(k.llir))
    plain = k(A=t, B=b).to_numpy()
    np.testing.assert_array_equal(got["llvm"], got["c"])
    np.testing.assert_array_equal(got["llvm"], plain)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got["llvm"], want, rtol=1e-5, atol=1e-5)


def test_the_cache_is_bounded(monkeypatch, tmp_path):
    """A thread's panels: one per block column while they fit in ``CACHE_BYTES``; at
    most ``CACHE_BYTES`` for any B (a panel of all of j for 10^6 rows and columns of B
    would be 256 MB). In a parallel loop the team's cache holds every panel while they
    fit in ``TEAM_BYTES`` (and the threads' own none), beyond it none (and each
    thread's own as many as fit in ``CACHE_BYTES``)."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(block_rows, "IN_PLACE_USES", 0)  # the sizes of packed panels, no test of A
    small, huge = {"n_k_blk": 5}, {"n_k_blk": 10**6 // 8, "n_j": 10**6}
    for dtype, size in (("float32", 4), ("float64", 8)):
        width = tile_width() * 4 // size
        small["n_j"] = 2 * width + 5
        every = 5 * BLOCK[1] * 2 * width
        for schedule in (
            "reorder(i_blk,k_blk,i_in,k_in,j)",
            "parallelize(i_blk, CPUThread, NoRaces)",
        ):
            k = ucf.compile(SPMM, formats={"A": "bcsr(16,8)"}, dtype=dtype, schedule=schedule)
            allocs = {n.array.name: n for n in nodes(k.llir) if isinstance(n, ir.Alloc)}
            own = allocs["B_panel0" if schedule.startswith("reorder") else "B_panel1"]
            assert not own.zeroed  # every read follows the packing
            held = _evaluate(own.size, huge)
            assert panels.CACHE_BYTES // 2 < held * size <= panels.CACHE_BYTES
            if schedule.startswith("reorder"):
                assert "B_panel_team0" not in allocs
                assert _evaluate(own.size, small) == every
                continue
            team = allocs["B_panel_team0"]
            assert not team.zeroed
            assert (_evaluate(own.size, small), _evaluate(team.size, small)) == (0, every)
            assert _evaluate(team.size, huge) == 0


def _evaluate(e: ir.Expr, env: dict[str, int]) -> int:
    """An integer expression of the kernel's extents, as the generated code computes it."""
    if isinstance(e, ir.Const):
        return int(e.value)
    if isinstance(e, ir.Var):
        return env[e.name]
    if isinstance(e, ir.Select):
        chosen = e.if_true if _evaluate(e.cond, env) else e.if_false
        return _evaluate(chosen, env)
    ops = {
        "<=": lambda x, y: x <= y,
        "+": lambda x, y: x + y,
        "*": lambda x, y: x * y,
        "/": lambda x, y: x // y,
        "min": min,
        "max": max,
    }
    return ops[e.op](_evaluate(e.left, env), _evaluate(e.right, env))


def _block_loop(body: list[ir.Stmt], parallel: str | None = None) -> ir.For:
    """``for p in [pos[i], pos[i + 1])`` over ``body``: the loop over a block row's
    blocks."""
    pos = ir.Array("pos", "i32")
    i = ir.Var("i", "i64")
    start = ir.Cast(ir.Load(pos, i), "i64")
    end = ir.Cast(ir.Load(pos, ir.add(i, ir.Const(1, "i64"))), "i64")
    return ir.For(ir.Var("p", "i64"), start, end, body, parallel=parallel)


@pytest.mark.parametrize(
    "why",
    [None, "parallel", "moved end", "written array", "unknown variable"],
)
def test_the_next_blocks_coordinate(why):
    """``TileState.ahead``: ``k = crd[p]`` at the next block of the row, ``crd[min(p + 1,
    end - 1)]`` (never past the row); nothing where that step is not one the loop could
    take or the value not one known from the parameters."""
    p = ir.Var("p", "i64")
    crd = ir.Array("crd", "i32", output=why == "written array")
    at = ir.add(p, ir.Var("q", "i64")) if why == "unknown variable" else p
    init = ir.Cast(ir.Load(crd, at), "i64")
    body: list[ir.Stmt] = [ir.Decl(ir.Var("k", "i64"), init)]
    if why == "moved end":
        body.append(ir.Assign(ir.Var("i", "i64"), ir.Const(0, "i64")))
    loop = _block_loop(body, "CPUThread" if why == "parallel" else None)
    state = tiling.TileState(set(), {"pos", "crd", "i"})
    state.loops, state.defs = [loop], {"k": init}
    got = state.ahead("k")
    if why is not None:
        assert got is None
        return
    last = ir.sub(loop.end, ir.Const(1, "i64"))
    want = ir.Bin("min", ir.add(p, ir.Const(1, "i64")), last)
    assert got == ir.Cast(ir.Load(crd, want), "i64")
    assert state.ahead("nothing declared") is None


def _rows_of_blocks(why: str | None) -> tuple[tiling.TileState, ir.Var, ir.Array, ir.Array, ir.Var]:
    """The state of a block loop ``p`` over ``pos[i]`` to ``pos[i + 1]`` (``k`` declared
    from ``crd[p]``) inside rows ``i`` from 0 to ``n``, spoilt as ``why`` says (no loop
    around, gaps between the rows' ranges, an outer end that is not a parameter): the
    state, ``p``, ``crd``, ``pos`` and the rows' end."""
    p, i = ir.Var("p", "i64"), ir.Var("i", "i64")
    crd, pos = ir.Array("crd", "i32"), ir.Array("pos", "i32")
    init = ir.Cast(ir.Load(crd, p), "i64")
    loop = _block_loop([ir.Decl(ir.Var("k", "i64"), init)])
    if why == "gaps between rows":
        two = ir.mul(ir.Const(2, "i64"), i)
        loop.start = ir.Cast(ir.Load(pos, two), "i64")
        loop.end = ir.Cast(ir.Load(pos, ir.add(two, ir.Const(1, "i64"))), "i64")
    end = ir.Var("m" if why == "row extent" else "n", "i64")
    rows = ir.For(i, ir.Const(0, "i64"), end, [loop], parallel="CPUThread")
    state = tiling.TileState(set(), {"pos", "crd", "n"})
    state.loops = [loop] if why == "no loop around" else [rows, loop]
    state.defs = {"k": init}
    return state, p, crd, pos, end


@pytest.mark.parametrize("why", [None, "no loop around", "gaps between rows", "row extent"])
def test_the_next_stored_blocks_coordinate(why):
    """``TileState.across``: at a row's last block, the next row's first (``crd[min(p +
    1, pos[n] - 1)]``), where the block loop of row ``i + 1`` starts where row ``i``'s
    ends; nothing where there is no loop around it, the rows' ranges leave gaps
    (``pos[2 i]`` to ``pos[2 i + 1]``), or the outer loop's end is not a parameter."""
    state, p, crd, pos, end = _rows_of_blocks(why)
    got = state.across("k")
    if why is not None:
        assert got is None
        return
    last = ir.Cast(ir.Load(pos, ir.add(ir.sub(end, ir.Const(1, "i64")), ir.Const(1, "i64"))), "i64")
    want = ir.Bin("min", ir.add(p, ir.Const(1, "i64")), ir.sub(last, ir.Const(1, "i64")))
    assert got == ir.Cast(ir.Load(crd, want), "i64")


@pytest.mark.parametrize("why", [None, "no loop around", "gaps between rows", "row extent"])
def test_the_blocks_stored(why):
    """``TileState.stored``: the blocks of all rows, ``pos[n - 1 + 1] - pos[0]``, for the
    loop ``p`` from ``pos[i]`` to ``pos[i + 1]`` inside ``i`` from 0 to ``n``; nothing
    where ``across`` finds nothing (no loop around, gaps between the rows' ranges, an
    outer end that is not a parameter)."""
    state, p, crd, pos, end = _rows_of_blocks(why)
    got = state.stored("k")
    if why is not None:
        assert got is None
        return
    last = ir.add(ir.sub(end, ir.Const(1, "i64")), ir.Const(1, "i64"))
    want = ir.Cast(ir.Load(pos, last), "i64")
    assert got == ir.sub(want, ir.Cast(ir.Load(pos, ir.Const(0, "i64")), "i64"))
    assert state.stored("nothing declared") is None
