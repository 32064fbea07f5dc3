"""Fixtures of the call path's tests."""

from __future__ import annotations

import pytest

from ucf.exec import replay as replay_module


@pytest.fixture
def replays(monkeypatch):
    """How many calls were replayed."""
    count = []
    run = replay_module.Replay.run

    def counting(self, out):
        count.append(1)
        return run(self, out)

    monkeypatch.setattr(replay_module.Replay, "run", counting)
    return count
