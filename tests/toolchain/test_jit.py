"""The JIT's optimization level: O3, and O2 for a module past ``jit.O3_LINES`` lines of
IR (O3 took minutes on a 54,700-line kernel the statement fuzzer drew, seed 45 case
32). The kernel is right at either level, against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.toolchain import jit


@pytest.mark.parametrize("limit,level", [(jit.O3_LINES, 3), (10, 2)])
def test_a_large_module_is_optimized_at_o2(monkeypatch, limit, level):
    levels = []
    make = jit.llvm.create_pipeline_tuning_options

    def spy(speed_level, **kw):
        levels.append(speed_level)
        return make(speed_level=speed_level, **kw)

    monkeypatch.setattr(jit, "O3_LINES", limit)
    monkeypatch.setattr(jit.llvm, "create_pipeline_tuning_options", spy)
    a = sp.random(9, 7, density=0.3, format="csr", random_state=3)
    x = np.arange(1.0, 8.0)
    k = ucf.compile("y(i) = A(i,j) * x(j)", {"A": "csr"})
    assert "define" in jit.optimized_ir(k.source)
    assert set(levels) == {level}
    np.testing.assert_allclose(k(A=a, x=x).to_numpy(), a @ x, rtol=1e-14)
