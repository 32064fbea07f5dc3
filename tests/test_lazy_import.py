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


#: A process whose kernels are in the disk cache: compile, then call small and large
#: operands (a large call asks the default model, whose choice is kept in the cache too).
CACHED = """
import sys
import numpy as np
import scipy.sparse as sp
import ucf

rng = np.random.default_rng(3)
for n, density in ((40, 0.2), (20000, 1e-3)):
    A = sp.random(n, n, density=density, format="csr", random_state=rng)
    x = rng.random(n)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x)
front = ("sympy", "lark", "ucf.pipeline", "ucf.lower.lowerer", "ucf.codegen.llvm")
print(" ".join(m for m in front if m in sys.modules) or "none")
"""


def test_a_cached_kernel_runs_without_the_compiler(tmp_path):
    """Issue 34: once a kernel is in the disk cache, a fresh process that compiles and
    calls it imports neither sympy nor the parser, nor builds anything of the pipeline."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), UCF_CACHE_DIR=str(tmp_path))
    runs = [
        subprocess.run([sys.executable, "-c", CACHED], capture_output=True, text=True, env=env)
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert "ucf.pipeline" in runs[0].stdout  # the first process built the kernels
    assert runs[1].stdout.split() == ["none"]


def test_the_help_imports_no_compiler():
    script = "import sys; from ucf.cli import main\ntry:\n    main(['--help'])\n"
    script += "except SystemExit:\n    pass\nprint([m for m in sys.modules if m.split('.')[0] in "
    script += "('numpy', 'llvmlite', 'lark', 'sympy') or m.startswith('ucf.format')])"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
