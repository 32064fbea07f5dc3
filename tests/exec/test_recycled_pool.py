"""The pool of dropped outputs (``ucf.exec.recycled``) makes room for a new size by
giving up the sizes given back least recently, instead of refusing the new one."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from ucf.exec import recycled

MB = 1 << 20


@pytest.fixture
def pool(monkeypatch):
    idle: dict[int, list[np.ndarray]] = {}
    monkeypatch.setattr(recycled, "_idle", idle)
    monkeypatch.setattr(recycled, "IDLE_BYTES", 12 * MB)
    return idle


def _dropped(nbytes: int, count: int = 1) -> list[int]:
    """Take ``count`` outputs of ``nbytes`` at once, drop them; their addresses."""
    arrays = [recycled.uninitialized((nbytes // 8,), np.float64) for _ in range(count)]
    addresses = [a.ctypes.data for a in arrays]
    del arrays
    gc.collect()
    return addresses


def test_a_new_size_displaces_the_oldest(pool):
    small = _dropped(4 * MB, 2)
    assert sorted(pool) == [4 * MB]
    big = _dropped(8 * MB)  # 8 + 8 > 12: the 4 MB outputs go
    assert sorted(pool) == [8 * MB]
    again = recycled.uninitialized((MB,), np.float64)
    assert again.ctypes.data == big[0] and again.ctypes.data not in small


def test_the_size_used_last_stays(pool):
    _dropped(4 * MB)
    _dropped(6 * MB)
    _dropped(4 * MB)  # 4 MB given back last: the 6 MB output goes for the next new size
    _dropped(5 * MB)  # 4 + 6 + 5 > 12
    assert sorted(pool) == [4 * MB, 5 * MB]


def test_an_output_larger_than_the_pool_is_not_kept(pool):
    _dropped(4 * MB)
    _dropped(16 * MB)
    assert sorted(pool) == [4 * MB]
