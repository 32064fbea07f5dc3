"""The panels ``ucf.passes.registers`` packs the shared factor of a tile's rows into,
and the per-thread cache that packs each of them once per call.

When several groups of rows share the other factor's rows (a block's ``B(k_blk, k_in, j)``
is the same for every group of the block's rows), those rows are copied into a panel,
tile after tile, as BLAS packs its B panel: every group then reads its tile's rows from
consecutive addresses instead of rows one row stride apart (4 KB for a 1024-column B,
all in one L1 set), and the copy reads each row once, start to end. What is packed is
the largest part of the product that all groups read alike: a load, or a computation on
loads, such as a quantized block's ``(q - zero) * scale``, which then runs once per
block instead of once per group. Rows counted at the call (``t`` of ``X(t,d) * W(d,h)``)
are taken to make enough groups.

Where what is packed depends on nothing but the reduction's step, ``j`` and one
coordinate outside the nest that has an extent (``k_blk`` of bcsr SpMM: the block's
column), the panel of each coordinate is the same wherever it comes: every block row
whose blocks name that column reads the same ``B`` rows. Such panels go into a cache of
each thread, ``CACHE_BYTES`` at most, one slot per coordinate (``k_blk`` modulo the
slots), with a tag per slot saying which coordinate it holds: a panel is packed when a
block first names its coordinate, and read by every later block of the call that names
it. A ``B`` too large for the cache shares slots, and a panel evicted is packed again
when next named: memory stays bounded, and at worst each block packs its panel (the
plan without the cache). Packed values are the values the nest reads or computes, so
results are bit for bit those of the nest.

A cache of 2 MB or more takes transparent huge pages (``ir.Alloc.huge``): a call packs
its 4 MB of panels (bcsr(32,32) SpMM, 1024 columns of B) through 1024 small pages, and
each tile reads one page of a panel, so on small pages a call that finds its panels out
of the caches likely walks the page tables as well (the likely cause: this VM has no
counters to count the walks; the timing is the evidence). bcsr(32,32) SpMM 1024^3 float32, 90 % zero
blocks, one thread, process CPU time, main and this alternated in 4 pairs of processes
(Zen 4, load 9): right after a 64 MB sweep 0.94x the time, after torch's matmul 0.97x,
straight after itself 0.99x; 50 % zero blocks within noise. The first call takes about
0.6 ms more (the pages collapsed).
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import names, nodes, substitute
from ucf.passes.tiling import SIZES, Nest, TileState, trip_bound, trip_count, vector_of
from ucf.schedule import block_rows

#: Groups of rows that must share the other factor's rows before they are packed into a
#: panel for each block: the copy costs about one more pass over those rows. On bcsr(32,32)
#: SpMM with a 1024x1024 B (8 groups of 4 rows) packing measured 1.2x (90% of blocks zero)
#: to 1.4x (50%) faster on one thread, on bcsr(16,16) (4 groups) 1.4x; with B of 384 to
#: 2048 columns 1.1x to 2.3x. B rows of 1 KB or less (256 float32 columns) stay in L1
#: without it, and there packing measured 4 to 11% slower; choosing at run time would
#: take a second micro-kernel in the code (about 0.25 s more compile per kernel).
PACK_GROUPS = 4
#: ... of ``register_nests.WIDE_ROWS`` (half the loads of B per multiply-add): that block row
#: ran 200 GFLOP/s reading B in place, 145 packing its panel first (250 with it packed
#: already).
WIDE_PACK_GROUPS = 8

#: The smallest element packed: at the same number of columns, rows of bytes are a
#: quarter as long as rows of float32, and int8 x uint8 bcsr(32,32) SpMM with 1024
#: columns of B (1 KB rows) measured no faster packed (0.84x to 1.0x, noisy); with 4096
#: columns packing gained 1.06x to 1.22x, which this leaves aside.
PACK_ELEMENT = 4

#: The most a thread's cache of panels holds, in bytes (and one panel, if a panel is
#: larger): bcsr(32,32) SpMM with a 1024x1024 float32 B takes 32 panels of 128 KB, 4 MB
#: a thread; B up to 16 MB (2048x2048 float32) is packed once per thread and call.
CACHE_BYTES = 16 << 20
#: The most the cache a team of threads shares holds, in bytes: one slot per panel of
#: the call, so a slot is packed once and never evicted while another thread reads it.
#: Larger, each thread keeps a cache of its own (``CACHE_BYTES``) as on one thread.
TEAM_BYTES = 2 * CACHE_BYTES

#: Turns a thread waiting for a panel another thread of its team packs spins (a
#: ``pause`` each, about 65 cycles on Zen 5: some 15 µs) before it yields its core
#: each turn: packing a 128 KB panel takes a running thread a few µs, but one the OS
#: descheduled (another process holds its core) finishes only when it runs again,
#: which a spinning waiter would delay by its time slice (issue 34: a busy machine).
SPINS = 1024

#: A cache line, in bytes: the step of the prefetches of the next block's panel.
LINE = 64
#: The cache the next block's panel is prefetched into (``ir.Prefetch.level``: 2, the L2
#: and not the L1). bcsr(32,32) SpMM 1024^3 float32, 50 % zero blocks, ucf's C kernel in
#: bench/block_variants.py's harness, one Zen 4 thread, CPU time, medians of 15-21 (load
#: 9): 0.97-0.98x the time of prefetching into the L1 too, B evicted first or not; two
#: threads, the larger thread: 0.99-1.00x cold, 0.97x warm (bench/README.md, h91).
PANEL_LEVEL = 2


def packed(
    state: TileState,
    nest: Nest,
    tile: Var,
    count: ir.Expr,
    width: int,
    lanes: int,
    groups: int | None,
    wide: bool,
    chunk: Var,
    group: Var,
) -> tuple[
    dict[ir.Expr, tuple[ir.Array, ir.Expr]], list[ir.Stmt], int, list[ir.Stmt], ir.Expr | None
]:
    """The panels of the nest's factors that every group of rows shares: per factor
    (``_shared``), its panel and the place in it of the tile's row at the reduction
    loop's step; and the statements that fill them, to run before the loop over groups
    (declarations first, which the loop reads).
    Panels a cache of the call keeps (``cache_key``) for any number of groups; panels of
    one block for ``PACK_GROUPS`` groups (``WIDE_PACK_GROUPS`` for ``wide`` tiles;
    ``groups`` None: counted at the call, taken to be many).

    A panel holds, tile after tile, the tile's ``width`` values of each step of the
    reduction loop, for the tiles of one ``chunk`` of the ``j`` range: the last value
    returned is the tiles of a chunk, which bounds a panel to ``CACHE_BYTES`` (the
    caller loops over chunks around the groups of rows; one chunk unless ``j`` runs over
    some 100,000 float32 columns). Its length must be known where it is allocated (from
    the function's parameters). The last value is what each tile of a ``group`` of rows
    runs first: prefetches of the cached panel of the next block (``ahead``). The fifth
    is where the tiles read the factors in place instead (``block_rows.IN_PLACE_USES``;
    tested at the call, None where they never do): no panel is packed then."""
    j, red = nest.inner.var.name, nest.red
    span = ir.sub(nest.inner.end, nest.inner.start)
    if not names(span) <= state.params:
        return {}, [], 0, [], None
    steps = red_steps(nest)
    rowwise = {nest.rows.var.name} | {d.var.name for d in nest.row_decls}
    factors = _shared(nest.store.value, j, red.var.name, rowwise, steps)
    if not factors:
        return {}, [], 0, [], None
    cached = cache_key(state, factors, steps, {j, red.var.name}, red)
    least = WIDE_PACK_GROUPS if wide else PACK_GROUPS
    if cached is None and groups is not None and groups < least:
        return {}, [], 0, [], None
    depth = trip_bound(red)
    elem = max(SIZES.get(f.type, 8) for f in factors)
    per_chunk = max(1, CACHE_BYTES // (depth * width * elem))
    step, at = Var(state.fresh(red.var.name), I64), Var(state.fresh("j_tile"), I64)
    whole = ir.Bin("/", span, Const(width, I64))
    length = ir.mul(Const(depth * width, I64), ir.Bin("min", whole, Const(per_chunk, I64)))
    chunks = ir.Bin("/", ir.add(whole, Const(per_chunk - 1, I64)), Const(per_chunk, I64))
    lo = ir.mul(chunk, Const(per_chunk, I64))  # the chunk's first tile
    slot = base = fits = None
    decls: list[ir.Stmt] = []
    if cached is not None:
        coordinate, extent = cached
        key = ir.add(ir.mul(coordinate, chunks), chunk)
        every = ir.mul(extent, chunks)  # the panels of the call
        fits, slots = cache_slots(state, every, ir.mul(length, Const(elem, I64)))
        slot, base = Var(state.fresh("panel_slot"), I64), Var(state.fresh("panel_at"), I64)
        decls = [ir.Decl(slot, place(key, slots)), ir.Decl(base, ir.mul(slot, length))]
        panel_bytes = ir.mul(ir.mul(slots, length), Const(elem, I64))

    def row(t: ir.Expr, k: ir.Expr) -> ir.Expr:
        place = ir.mul(
            ir.add(ir.mul(t, Const(depth, I64)), ir.sub(k, red.start)), Const(width, I64)
        )
        return place if base is None else ir.add(base, place)

    stored = None if cached is None else _in_place(state, factors, nest, cached, groups)
    in_place = packs = None
    if stored is not None:
        # blocks per block column: each of the column's panels (one a chunk) serves them all
        near, many = (
            Const(block_rows.NEAR_BYTES, I64),
            ir.mul(Const(block_rows.IN_PLACE_USES, I64), extent),
        )
        in_place = ir.Logic("and", ir.Cmp(">", panel_bytes, near), ir.Cmp("<=", stored, many))
        packs = ir.Logic("or", ir.Cmp("<=", panel_bytes, near), ir.Cmp(">", stored, many))
    panels: dict[ir.Expr, tuple[ir.Array, ir.Expr]] = {}
    copies: list[ir.Stmt] = []
    first = ir.add(nest.inner.start, ir.mul(ir.add(lo, at), Const(width, I64)))
    for factor in factors:
        load = next(n for n in nodes(factor) if isinstance(n, ir.Load))
        size = length if slot is None else ir.mul(slots, length)
        if in_place is not None:  # no panel is written: one element for the allocation
            size = ir.Select(in_place, Const(1, I64), size)
        stem = f"{load.array.name.removesuffix('_vals')}_panel"
        # read only where filled (its block's, or tagged)
        panel = buffer(state, stem, factor.type, size, fits, zeroed=False)
        panels[factor] = (panel, row(ir.sub(tile, lo), red.var))
        source = substitute(substitute(factor, steps), {red.var.name: step})
        for v in range(0, width, lanes):
            value = vector_of(source, j, first, v, lanes, lambda e, name="": e, {})
            copies.append(ir.Store(panel, ir.add(row(at, step), Const(v, I64)), value))
    # Tile by tile, the panel written in order: the other order (a row of the factor
    # read in order, written a tile's rows apart, 4 KB for 32 steps of 32 floats) copied
    # a 1024x1024 float32 B at 18 GB/s against 41 (C micro-benchmark, one Zen 5 thread).
    held = ir.Bin("min", ir.sub(count, lo), Const(per_chunk, I64))
    tiles = ir.For(at, Const(0, I64), held, [ir.For(step, red.start, red.end, copies)])
    fill: list[ir.Stmt] = [tiles]
    copied = ", ".join(f"{named(x)} into {p.name}" for x, (p, _) in panels.items())
    loop = nest.rows.label or nest.rows.var.name
    if slot is None:
        counted = "" if groups is None else f"{groups} "
        state.notes.append(
            f"registers: {copied} packed before each {loop} loop, for its {counted}groups of rows"
        )
        return panels, fill, per_chunk, [], None
    team = fits is not None
    tags = tag_buffer(state, "panel_tags", slots, fits)
    mb = CACHE_BYTES >> 20
    where = (
        f"team for each {coordinate.name}, in one cache the team shares (where the panels "
        f"exceed {TEAM_BYTES >> 20} MB, a cache of {mb} MB a thread)"
        if team
        else f"thread for each {coordinate.name}, in a cache of {mb} MB a thread"
    )
    state.notes.append(
        f"registers: {copied} packed once per call and {where}, and read by every {loop} loop "
        f"of that {coordinate.name}"
    )
    guard = tagged(state, fill, key, tags, slot, slots, fits)
    if in_place is not None:
        state.notes.append(
            f"registers: {', '.join(named(x) for x in panels)} read in place, not packed, "
            f"where the call stores at most {block_rows.IN_PLACE_USES} blocks a "
            f"{coordinate.name} and the panels exceed {block_rows.NEAR_BYTES >> 20} MB"
        )
        guard = ir.If(packs, [guard])
    fetch: list[ir.Stmt] = []
    following = state.ahead(coordinate.name)
    lines = depth * width * elem // LINE
    if following is not None and groups and lines % groups == 0:
        # Each tile of each group of rows prefetches its share of the same tile of the
        # next block's panel (16 lines of 4 KB for 4 groups of 8 float32 rows): spread
        # over this block, the next one's panel is in L2 when it starts, instead of
        # coming from L3 (32 panels of 128 KB, a thread's 4 MB cache, exceed L2). Into
        # the L2 only (``PANEL_LEVEL``): 128 KB fetched into a 32 KB L1 evicts the lines
        # this block's tiles read.
        # A panel not yet packed is prefetched too: its lines are about to be written.
        # bcsr(32,32) SpMM 1024^3, one thread, each call after torch's matmul: 0.93 to
        # 0.98x the time at 90 % zero blocks, 0.91 to 0.98x at 50 %. Only where a thread's panels
        # exceed ``block_rows.NEAR_BYTES``: smaller ones (the TeSA plan's X panels, 512 KB for 128
        # tokens) stay in L2, and there the prefetches are instructions for nothing.
        ahead = Var(state.fresh("panel_next"), I64)
        near = ir.add(ir.mul(following, chunks), chunk)
        decls.append(ir.Decl(ahead, ir.mul(place(near, slots), length)))
        share = lines // groups * (LINE // elem)
        start = ir.add(
            ir.add(ahead, ir.mul(ir.sub(tile, lo), Const(depth * width, I64))),
            ir.mul(group, Const(share, I64)),
        )
        for p, _ in panels.values():
            fetch += [
                ir.Prefetch(p, ir.add(start, Const(o, I64)), PANEL_LEVEL)
                for o in range(0, share, LINE // elem)
            ]
        # A next panel not packed yet: its source rows instead, the group's share of the
        # tile's (8 rows of 128 bytes of B for 4 groups of 8 float32 rows), so the copy
        # that packs it reads the caches, not memory, while this block computes.
        # bcsr(32,32) SpMM 1024^3 float32, C micro-benchmark of the kernel's loops, B
        # evicted before each call, the larger thread's CPU time on a loaded 2-core
        # Zen 5: with the block row's next block (``ahead``) 0.94 to 0.95x the time at
        # 90 % zero blocks (1 and 2 threads) and 0.94x at 50 %; with the next stored
        # block, the next row's first at a row's end (``across``), 0.88 to 0.93x and
        # 0.93 to 0.97x. The same thread runs the next row unless a chunk of rows ends
        # there, and a prefetch for another thread's row costs only bandwidth.
        upcoming = Var(state.fresh("panel_coordinate"), I64)
        across = state.across(coordinate.name)
        sources = _source_fetches(
            factors, steps, nest, coordinate, upcoming, tile, group, groups, width
        )
        if sources:
            ready = Var(state.fresh("panel_ready"), I64)
            next_key = ir.add(ir.mul(upcoming, chunks), chunk)
            near_tag = ir.Load(tags, place(next_key, slots), acquire=team)
            published = ir.Cmp("==", near_tag, ir.add(next_key, Const(1, I64)))
            decls += [
                ir.Decl(upcoming, following if across is None else across),
                ir.Decl(ready, ir.Select(published, Const(1, I64), Const(0, I64))),
            ]
            fetch = [ir.If(ir.Cmp("!=", ready, Const(0, I64)), fetch, sources)]
        fetch = [ir.If(ir.Cmp(">", panel_bytes, Const(block_rows.NEAR_BYTES, I64)), fetch)]
    return panels, [*decls, guard], per_chunk, fetch, in_place


def _in_place(
    state: TileState,
    factors: list[ir.Expr],
    nest: Nest,
    cached: tuple[Var, ir.Expr],
    groups: int | None,
) -> ir.Expr | None:
    """The blocks stored over the call (``TileState.stored``) where the tiles may read
    the factors in place: each a load (read as the nest reads it), with the prefetch of
    the next block's rows they need (``_source_fetches``: the reduction's trip count
    whole in ``groups``), reaching across block rows (``TileState.across``); else None,
    and where ``block_rows.IN_PLACE_USES`` is 0. Without ``across`` a row's first block finds its
    rows of B cold: on the default's plan for two threads (dynamic chunks of one block
    row, whose next row no thread knows) in place measured 0.96-1.03x the time of
    packing (bench/README.md)."""
    if (
        block_rows.IN_PLACE_USES < 1
        or not groups
        or not all(isinstance(f, ir.Load) for f in factors)
    ):
        return None
    trip = trip_count(nest.red)
    coordinate, _ = cached
    if trip is None or trip % groups or state.across(coordinate.name) is None:
        return None
    return state.stored(coordinate.name)


def cache_slots(
    state: TileState, every: ir.Expr, nbytes: ir.Expr
) -> tuple[ir.Expr | None, ir.Expr]:
    """Whether the team shares the cache of ``every`` panels of ``nbytes`` each (a test
    at the call; None outside a parallel loop of threads, where each thread keeps its
    own), and its slots: as many as the panels of the call, as the cache holds
    (``CACHE_BYTES`` a thread; in the team's, ``TEAM_BYTES``, every panel), at least one."""
    nbytes = ir.Bin("max", nbytes, Const(1, I64))
    room = ir.Bin("/", Const(CACHE_BYTES, I64), nbytes)
    fits = None
    if state.in_team():  # one cache for the team where every panel has a slot
        fits = ir.Cmp("<=", ir.mul(every, nbytes), Const(TEAM_BYTES, I64))
        room = ir.Select(fits, every, room)
    return fits, ir.Bin("max", ir.Bin("min", every, room), Const(1, I64))


def tag_buffer(state: TileState, stem: str, slots: ir.Expr, fits: ir.Expr | None) -> ir.Array:
    """The tags of a cache of ``slots`` slots (see ``cache_slots``): one per slot, and in
    the team's cache after them a count of the threads that claimed each slot's panel."""
    size = ir.mul(slots, Const(1 if fits is None else 2, I64))
    return buffer(state, stem, "i64", size, fits)


def tagged(
    state: TileState,
    fill: list[ir.Stmt],
    key: ir.Expr,
    tags: ir.Array,
    slot: ir.Expr,
    slots: ir.Expr,
    fits: ir.Expr | None,
) -> ir.Stmt:
    """``fill`` (the packing of the panel of ``key`` into its ``slot``), run only where the
    slot's tag does not name the key yet, then the tag's store; in the team's cache
    (``fits`` not None) by the first thread to claim the slot, while any other waits
    for the tag (``_claimed``)."""
    team = fits is not None
    # a tag holds the key of the panel in its slot, plus one (0: empty); a key is not
    # negative, but one that were could not match an empty slot's 0
    tag = ir.add(key, Const(1, I64))
    stale = ir.Cmp("!=", ir.Load(tags, slot, acquire=team), tag)
    absent = ir.Logic("or", ir.Cmp("<", key, Const(0, I64)), stale)
    filled = [*fill, ir.Store(tags, slot, tag, release=team)]
    if team:
        filled = _claimed(state, fits, tags, slot, slots, filled)
    return ir.If(absent, filled)


def buffer(
    state: TileState, stem: str, elem: str, size: ir.Expr, fits: ir.Expr | None, zeroed=True
) -> ir.Array:
    """A cache's array of ``size`` elements: a thread's own (``fits`` None, or false at the
    call), or one the team shares (``fits`` true at the call), allocated before the
    parallel loop and chosen by each thread in its setup."""
    array = ir.Array(state.fresh(stem), elem)
    if not zeroed:
        state.unzeroed.add(array.name)
    if fits is None:
        state.panels.append(array)
        state.sizes.append(size)
        return array
    team, own = ir.Array(state.fresh(f"{stem}_team"), elem), ir.Array(state.fresh(stem), elem)
    if not zeroed:
        state.unzeroed |= {team.name, own.name}
    none = Const(0, I64)
    state.team.append((team, ir.Select(fits, size, none)))
    state.panels.append(own)
    state.sizes.append(ir.Select(fits, none, size))
    state.picks.append(ir.Pick(array, fits, team, own))
    return array


def _claimed(
    state: TileState,
    fits: ir.Expr,
    tags: ir.Array,
    slot: ir.Expr,
    slots: ir.Expr,
    filled: list[ir.Stmt],
) -> list[ir.Stmt]:
    """``filled`` (the packing of a panel, then its tag's release) run by the first
    thread of the team to claim the slot; any other waits until the tag is published.
    The two threads of a team otherwise each pack nearly every panel of B: bcsr(32,32)
    SpMM 1024^3 float32, ucf's C kernel in a harness, per-thread CPU time at load 8-11,
    packed once for the team the sum of both threads' time fell 7-8 % (90 % zero
    blocks) and 4-5 % (50 %); the llvm kernel's process CPU time 4 % at both
    (bench/README.md). A thread's own cache (``fits`` false) packs what it finds
    missing, as it always did.
    Each slot holds one panel for the call, so a published slot is never written again."""
    mine, old = Var(state.fresh("panel_mine"), I64), Var(state.fresh("panel_claims"), I64)
    one, zero = Const(1, I64), Const(0, I64)
    first = ir.Select(ir.Cmp("==", old, zero), one, zero)
    claim = [ir.FetchAdd(old, tags, ir.add(slots, slot), one), ir.Assign(mine, first)]
    # until the slot's claimant publishes it: its own panel, unless a coordinate out of
    # range (a C caller's unchecked input) shares the slot, which then must not hang.
    # Politely (``SPINS``): a pause each turn, and past the bound a yield each turn.
    spins = Var(state.fresh("panel_spins"), I64)
    turn = [
        ir.Pause(),
        ir.Assign(spins, ir.add(spins, one)),
        ir.If(ir.Cmp(">", spins, Const(SPINS, I64)), [ir.Yield()]),
    ]
    wait = [
        ir.Decl(spins, zero),
        ir.While(ir.Cmp("==", ir.Load(tags, slot, acquire=True), zero), turn),
    ]
    return [ir.Decl(mine, one), ir.If(fits, claim), ir.If(ir.Cmp("!=", mine, zero), filled, wait)]


def _source_fetches(
    factors: list[ir.Expr],
    steps: dict[str, ir.Expr],
    nest: Nest,
    coordinate: Var,
    upcoming: Var,
    tile: Var,
    group: Var,
    groups: int,
    width: int,
) -> list[ir.Stmt]:
    """Prefetches of the lines a ``group`` of rows' share of ``tile`` of the panel at
    coordinate ``upcoming`` is packed from: ``1 / groups`` of the reduction's steps, the
    tile's columns, of each factor's array; none unless each factor is a load (widened
    or not) and the reduction's trip count is constant and whole in ``groups``."""
    red, j = nest.red, nest.inner
    trip = trip_count(red)
    if trip is None or trip % groups:
        return []
    loads: list[ir.Load] = []
    for f in factors:
        while isinstance(f, ir.Cast):
            f = f.operand
        if not isinstance(f, ir.Load):
            return []
        loads.append(f)
    per = trip // groups
    out: list[ir.Stmt] = []
    for load in loads:
        index = substitute(load.index, steps)
        step = LINE // SIZES.get(load.array.elem, 8)
        for r in range(per):
            k = ir.add(red.start, ir.add(ir.mul(group, Const(per, I64)), Const(r, I64)))
            for c in range(0, width, step):
                col = ir.add(j.start, ir.add(ir.mul(tile, Const(width, I64)), Const(c, I64)))
                at = substitute(
                    index, {red.var.name: k, j.var.name: col, coordinate.name: upcoming}
                )
                out.append(ir.Prefetch(load.array, at))
    return out


def place(key: ir.Expr, slots: ir.Expr) -> ir.Expr:
    """The slot of the cache a panel's key names. A coordinate is not negative, but a
    slot must be a place in the cache whatever the key: ``((key % slots) + slots) %
    slots``."""
    return ir.Bin("%", ir.add(ir.Bin("%", key, slots), slots), slots)


def cache_key(
    state: TileState,
    factors: list[ir.Expr],
    steps: dict[str, ir.Expr],
    inner: set[str],
    red: ir.For,
) -> tuple[Var, ir.Expr] | None:
    """The coordinate the panels of ``factors`` depend on besides the nest's own loops
    (``inner``) and the function's parameters, and its extent (a parameter); None if
    they depend on more than one such variable, on none, on one without an extent, or
    read anything the kernel writes (a panel packed earlier would be stale). The
    reduction loop's bounds count as used: a panel is filled over the bounds of the
    block that packs it and read over those of every later block of its coordinate."""
    used = names(substitute(red.start, steps)) | names(substitute(red.end, steps))
    for f in factors:
        f = substitute(f, steps)
        if any(
            isinstance(n, ir.Load) and (n.array.output or n.array.name not in state.params)
            for n in nodes(f)
        ):
            return None
        used |= names(f)
    outside = used - inner - state.params
    if len(outside) != 1:
        return None
    (name,) = outside
    extent = state.extents.get(name)
    return None if extent is None else (Var(name, I64), Var(extent, I64))


def _shared(
    e: ir.Expr, j: str, red: str, rowwise: set[str], steps: dict[str, ir.Expr]
) -> list[ir.Expr]:
    """The largest parts of ``e`` that vary with ``j`` and the reduction variable ``red``
    but not with the row (``rowwise``; ``steps`` defines the reduction loop's
    declarations): what every group of rows reads alike. A part that only loads elements
    narrower than ``PACK_ELEMENT`` (and widens them) is left out; one that computes
    more (a dequantization, ``(q - zero) * scale``) is kept, and then runs once per
    panel instead of once per group."""
    used = names(substitute(e, steps))
    if j not in used:
        return []
    if red in used and not used & rowwise:
        inner = e
        while isinstance(inner, ir.Cast):
            inner = inner.operand
        if isinstance(inner, ir.Load) and SIZES.get(inner.array.elem, 1) < PACK_ELEMENT:
            return []
        return [e]
    if isinstance(e, ir.Bin):
        left = _shared(e.left, j, red, rowwise, steps)
        return left + [x for x in _shared(e.right, j, red, rowwise, steps) if x not in left]
    if isinstance(e, ir.Cast | ir.Neg):
        return _shared(e.operand, j, red, rowwise, steps)
    return []


def named(e: ir.Expr) -> str:
    """How the note names a packed factor: the array it loads, or the arrays of a
    computed one."""
    arrays = dict.fromkeys(n.array.name for n in nodes(e) if isinstance(n, ir.Load))
    return " ".join(arrays) if isinstance(e, ir.Load) else f"({', '.join(arrays)})"


def red_steps(nest: Nest) -> dict[str, ir.Expr]:
    """The reduction loop's declarations, each as an expression of what is known outside
    them: what a computation hoisted out of the loop reads in their place."""
    steps: dict[str, ir.Expr] = {}
    for d in nest.red_decls:
        steps[d.var.name] = substitute(d.init, steps)
    return steps
