"""``import ucf`` loads none of the heavy dependencies; they arrive with the first compile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("sympy", "llvmlite", "lark", "scipy", "torch", "dask")

SCRIPT = f"""
import sys
import numpy as np
import ucf

heavy = [m for m in {HEAVY!r} if m in sys.modules]
assert not heavy, f"import ucf loaded {{heavy}}"
assert "Kernel" in dir(ucf) and "from_numpy" in dir(ucf)
from ucf import Tensor, UcfError, from_numpy  # noqa: F401

rng = np.random.default_rng(0)
A = rng.random((5, 4))
x = rng.random(4)
k = ucf.compile("y(i) = A(i,j) * x(j)")
assert isinstance(k, ucf.Kernel)
np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x)
print("ok")
"""


def test_import_is_light_and_compile_still_works(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), UCF_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_unknown_attribute_is_an_attribute_error():
    import ucf

    try:
        ucf.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("ucf.no_such_name did not raise")


def test_every_public_name_resolves_and_type_checkers_see_the_lazy_ones():
    import ast
    import inspect

    import ucf

    for name in ucf.__all__:
        assert getattr(ucf, name) is not None, name
    tree = ast.parse(inspect.getsource(ucf))
    guarded = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    seen = {alias.name for imp in guarded.body for alias in imp.names}
    assert seen == set(ucf._LAZY)
