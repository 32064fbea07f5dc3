"""Attention masks: what ``ucf.attention`` takes, the helpers that make the usual ones,
and each call's index of live tiles.

A mask says which keys each query attends to, exactly, element by element. It comes
as a boolean tensor (``(S_q, S_k)``, broadcast over batch and heads as SDPA's
``attn_mask`` is, or ``(B or 1, H or 1, S_q, S_k)``), as a function of
``(b, h, q_idx, kv_idx)`` returning booleans (FlexAttention's ``mask_mod``; the
helpers below make them), or as FlexAttention's ``BlockMask``. Each call turns it
into an :class:`AttentionMask`: the STile index of the tiles (``granularity``, the
compute tile) that hold a live element, and the elements, read in place where the
compute needs them. The index is rebuilt every call (``ucf.stile``), so masks may
change from call to call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf.errors import OperandError
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.format.torch_layouts import need_torch
from ucf.stile.tile_index import build as stile_build

#: The format of a tile index over (B, H, query blocks, key blocks).
_TILES = Format.dynamic(4)
#: FlexAttention's ``mask_mod``: (b, h, q_idx, kv_idx) -> whether q_idx sees kv_idx.
MaskMod = Callable[[Any, Any, Any, Any], Any]


def causal() -> MaskMod:
    """Each query sees itself and the keys before it."""

    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return mask_mod


def local(window: int) -> MaskMod:
    """Each query sees the keys at most ``window`` positions away (a sliding window)."""
    _check_window(window)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= window

    return mask_mod


def longformer(window: int, global_tokens: Sequence[int] | Any = ()) -> MaskMod:
    """Longformer's pattern: a sliding window of ``window`` positions each side, plus
    global tokens (indices) that see every key and that every query sees."""
    torch = need_torch("ucf.nn.longformer")
    _check_window(window)
    idx = torch.as_tensor(global_tokens, dtype=torch.long).reshape(-1)
    if idx.numel() and int(idx.min()) < 0:
        raise OperandError(f"longformer: global token indices must be >= 0, got {idx.tolist()}")
    # A lookup table one longer than the largest index: positions past it are not global.
    table = torch.zeros(int(idx.max()) + 2 if idx.numel() else 1, dtype=torch.bool)
    table[idx] = True
    last = table.numel() - 1

    def mask_mod(b, h, q_idx, kv_idx):
        near = (q_idx - kv_idx).abs() <= window
        return near | table[q_idx.clamp(max=last)] | table[kv_idx.clamp(max=last)]

    return mask_mod


def _check_window(window: int) -> None:
    if not isinstance(window, int | np.integer) or isinstance(window, bool) or window < 0:
        raise OperandError(f"a window must be an int >= 0, got {window!r}")


@dataclass
class AttentionMask:
    """One call's mask over a ``(B, H, S_q, S_k)`` score tensor.

    ``tiles`` is the STile index (``U U U Q``) over ``(Bm, Hm, ceil(S_q/gq),
    ceil(S_k/gk))`` of the tiles holding a live element, where ``Bm``, ``Hm`` are 1
    for a mask shared by the batch or the heads; ``elements`` (bytes, nonzero where
    live, ``(Bm, Hm, S_q, S_k)``) says which elements of a live tile are live, or is
    None when every element of a live tile is (a block mask's full blocks)."""

    tiles: Tensor
    elements: np.ndarray | None
    granularity: tuple[int, int]
    shape: tuple[int, int, int, int]
    lengths: np.ndarray | None = None  # each batch's valid queries and keys (self-attention)

    def valid(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Each batch's valid queries and keys (int64): its length, else everything."""
        _, _, sq, sk = self.shape
        if self.lengths is not None:
            return self.lengths, self.lengths
        return np.full(b, sq, np.int64), np.full(b, sk, np.int64)

    @property
    def broadcast(self) -> tuple[int, int]:
        """The mask's batch and head extents (1 where it is shared)."""
        return self.tiles.shape[0], self.tiles.shape[1]

    def dense(self) -> np.ndarray:
        """Every element's liveness, ``(Bm, Hm, S_q, S_k)`` booleans (``Bm`` the batch's
        extent where lengths are given)."""
        gq, gk = self.granularity
        *_, sq, sk = self.shape
        if self.elements is not None:
            live = self.elements.view(np.bool_)
        else:
            tiles = np.zeros(self.tiles.shape, dtype=bool)
            coords, _ = self.tiles.to_coo()
            tiles[tuple(coords.T)] = True
            live = np.repeat(np.repeat(tiles, gq, axis=2), gk, axis=3)[:, :, :sq, :sk]
        if self.lengths is None:
            return live
        n = self.lengths[:, None, None, None]
        inside = (np.arange(sq)[:, None] < n) & (np.arange(sk)[None, :] < n)
        return live & inside


def resolve(
    mask: Any,
    shape: tuple[int, int, int, int],
    granularity: tuple[int, int],
    target: str = "llvm",
    emulate: bool = False,
    lengths: Any = None,
) -> AttentionMask:
    """The index of ``mask`` for scores of ``shape`` (B, H, S_q, S_k), in tiles of
    ``granularity``; a BlockMask brings its own tiles (its ``BLOCK_SIZE``). With
    ``lengths`` (one per batch; self-attention), queries and keys past a sequence's
    length are dead too: the kernels skip them, and without a mask the tiles come from
    the lengths alone."""
    valid = None if lengths is None else check_lengths(lengths, shape)
    if _is_block_mask(mask):
        found = _from_block_mask(mask, shape, target, emulate)
        found.lengths = valid
        return found
    if mask is None:
        elements = None
    elif callable(mask):
        elements = _evaluate(mask, shape)
    else:
        elements = _boolean(mask, shape)
    tiles_target = "cuda" if emulate else target
    if elements is None:
        tiles = (
            _all_tiles(shape, granularity)
            if valid is None
            else _length_tiles(valid, shape, granularity)
        )
        return AttentionMask(tiles, None, granularity, shape, valid)
    tiles = stile_build(elements, (1, 1, *granularity), tiles_target, emulate=emulate)
    return AttentionMask(tiles, elements, granularity, shape, valid)


def check_lengths(lengths: Any, shape: tuple[int, int, int, int]) -> np.ndarray:
    """``lengths`` as int64, one per batch, each from 0 to the sequence length."""
    b, _, sq, sk = shape
    torch = _torch_or_none()
    if torch is not None and isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    n = np.asarray(lengths)
    if sq != sk:
        raise OperandError(f"lengths are for self-attention: {sq} queries and {sk} keys differ")
    if n.shape != (b,) or n.dtype.kind not in "iu" or (n.size and (n.min() < 0 or n.max() > sq)):
        raise OperandError(
            f"lengths must be {b} integers (one per sequence of the batch) from 0 to {sq}, "
            f"got {n.tolist() if n.size < 40 else n.shape}"
        )
    return np.ascontiguousarray(n, dtype=np.int64)


def _grid(shape: tuple[int, int, int, int], granularity: tuple[int, int], b: int = 1):
    return (b, 1, -(-shape[2] // granularity[0]), -(-shape[3] // granularity[1]))


def _index(live: np.ndarray) -> Tensor:
    """Booleans over (B, H, query blocks, key blocks) as a ``UUUQ`` tile index."""
    rows = live.reshape(-1, live.shape[-1])
    pos = np.zeros(rows.shape[0] + 1, dtype=np.int32)
    np.cumsum(rows.sum(axis=1), out=pos[1:])
    crd = np.nonzero(rows)[1].astype(np.int32)
    levels = [{}, {}, {}, {"pos": pos, "crd": crd}]
    return Tensor(live.shape, _TILES, levels, np.ones(len(crd), np.float32), np.int32, check=False)


def _all_tiles(shape: tuple[int, int, int, int], granularity: tuple[int, int]) -> Tensor:
    return _index(np.ones(_grid(shape, granularity), dtype=bool))


def _length_tiles(lengths: np.ndarray, shape, granularity: tuple[int, int]) -> Tensor:
    """The tiles of each sequence's valid queries and keys, per batch."""
    _, _, nq, nk = grid = _grid(shape, granularity, len(lengths))
    gq, gk = granularity
    n = lengths[:, None, None, None]
    live = (np.arange(nq)[:, None] * gq < n) & (np.arange(nk)[None, :] * gk < n)
    return _index(np.broadcast_to(live, grid))


def _boolean(mask: Any, shape: tuple[int, int, int, int]) -> np.ndarray:
    """A boolean tensor or array as ``(Bm, Hm, S_q, S_k)`` bytes, read in place when it
    is contiguous."""
    b, h, sq, sk = shape
    torch = _torch_or_none()
    if torch is not None and isinstance(mask, torch.Tensor):
        if mask.device.type != "cpu":
            raise OperandError(f"the mask is on device {mask.device}; pass mask.cpu()")
        if mask.dtype != torch.bool:
            raise OperandError(
                f"the mask has dtype {mask.dtype}; ucf.attention takes a boolean mask "
                "(True where a query attends to a key), a mask function or a BlockMask"
            )
        mask = mask.detach().contiguous().numpy()
    a = np.asarray(mask)
    if a.dtype != np.bool_:
        raise OperandError(
            f"the mask has dtype {a.dtype}; ucf.attention takes a boolean mask (True where a "
            "query attends to a key), a mask function or a BlockMask"
        )
    if a.ndim == 2:
        a = a.reshape(1, 1, *a.shape)
    ok = a.ndim == 4 and a.shape[2:] == (sq, sk) and a.shape[0] in (1, b) and a.shape[1] in (1, h)
    if not ok:
        raise OperandError(
            f"the mask has shape {tuple(np.shape(mask))}; scores of {b} x {h} heads x {sq} "
            f"queries x {sk} keys take a mask of shape ({sq}, {sk}) or (B or 1, H or 1, "
            f"{sq}, {sk})"
        )
    return np.ascontiguousarray(a).view(np.uint8)


def _evaluate(mask_mod: MaskMod, shape: tuple[int, int, int, int]) -> np.ndarray:
    """A mask function on every element, broadcast: the result keeps only the batch and
    head modes the function depends on."""
    torch = need_torch("a mask function")
    b, h, sq, sk = shape
    args = (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(sq).view(1, 1, sq, 1),
        torch.arange(sk).view(1, 1, 1, sk),
    )
    try:
        out = mask_mod(*args)
    except Exception as e:  # the user's function: say which call failed
        raise OperandError(
            f"the mask function {getattr(mask_mod, '__name__', mask_mod)!r} failed on "
            f"broadcast index tensors (b, h, q_idx, kv_idx): {type(e).__name__}: {e}"
        ) from e
    out = torch.as_tensor(out)
    if out.dtype != torch.bool or out.dim() > 4:
        raise OperandError(
            f"the mask function returned {out.dtype} of shape {tuple(out.shape)}, not "
            "booleans over (b, h, q_idx, kv_idx)"
        )
    out = out.reshape((1,) * (4 - out.dim()) + tuple(out.shape))
    return _boolean(out.expand(out.shape[0], out.shape[1], sq, sk), shape)


def _is_block_mask(mask: Any) -> bool:
    return hasattr(mask, "kv_num_blocks") and hasattr(mask, "kv_indices")


def _from_block_mask(
    bm: Any, shape: tuple[int, int, int, int], target: str, emulate: bool
) -> AttentionMask:
    """FlexAttention's BlockMask: its live blocks (partial and full) are the tiles, of its
    BLOCK_SIZE; a partial block's elements come from its ``mask_mod``."""
    b, h, sq, sk = shape
    gq, gk = (int(x) for x in bm.BLOCK_SIZE)
    counts, indices = bm.kv_num_blocks, bm.kv_indices
    full_counts, full_indices = bm.full_kv_num_blocks, bm.full_kv_indices
    bm_b, bm_h, nqb = counts.shape
    nkb = -(-sk // gk)
    if nqb != -(-sq // gq) or bm_b not in (1, b) or bm_h not in (1, h):
        raise OperandError(
            f"the BlockMask has {bm_b} x {bm_h} x {nqb} query blocks of {gq}; scores of "
            f"{b} x {h} x {sq} queries need ({b} or 1) x ({h} or 1) x {-(-sq // gq)}"
        )
    live = _block_live(counts, indices, nkb)
    partial = bool(live.any())
    if full_counts is not None:
        live |= _block_live(full_counts, full_indices, nkb)
    tiles = _index(live)
    elements = None
    if partial:  # the elements of partial blocks come from the mask function
        elements = _evaluate(bm.mask_mod, (bm_b, bm_h, sq, sk))
        elements = elements & np.repeat(np.repeat(live, gq, 2), gk, 3)[:, :, :sq, :sk]
    return AttentionMask(tiles, elements, (gq, gk), shape)


def _block_live(counts: Any, indices: Any, nkb: int) -> np.ndarray:
    """A BlockMask's (count, indices) pair as booleans over (B, H, query block, key block)."""
    c = counts.cpu().numpy()
    idx = indices.cpu().numpy()
    live = np.zeros((*c.shape, nkb), dtype=bool)
    take = np.arange(idx.shape[-1]) < c[..., None]
    where = np.nonzero(take)
    live[(*where[:-1], idx[where])] = True
    return live


def _torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch
