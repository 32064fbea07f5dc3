"""The house rules of issue 13: the compiler asks level kinds for properties only, a
new kind plugs in as one module, and the package has no import cycles."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.format.levels import KINDS
from ucf.format.levels.compressed import Compressed

ROOT = Path(ucf.__file__).parent
COMPILER = ["lower", "cin", "exec", "codegen"]
CONCRETE = re.compile(
    r"ucf\.format\.levels\.(dense|compressed|singleton)|\b(DENSE|COMPRESSED|SINGLETON)\b"
)
LETTER = re.compile(r"""\.letters?\b\s*[!=]=|[!=]=\s*["'][UCS]["']|KINDS\[""")


def compiler_sources():
    for package in COMPILER:
        yield from sorted((ROOT / package).glob("*.py"))


@pytest.mark.parametrize(
    "path", list(compiler_sources()), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_the_compiler_never_tests_which_kind_it_holds(path):
    text = path.read_text()
    assert not LETTER.findall(text), f"{path} compares level letters"
    assert not CONCRETE.findall(text), f"{path} names a concrete level kind"


def test_the_scan_finds_what_it_looks_for():
    assert LETTER.search('if kind.letter == "C":')
    assert LETTER.search("fmt.letters == 'UC'")
    assert CONCRETE.search("from ucf.format.levels.compressed import COMPRESSED")
    assert not LETTER.search("kind.output == 'append'")


def _imports(path: Path, lazy: bool = False) -> set[str]:
    """Modules of ucf this module imports when it is loaded (``lazy``: or inside
    functions)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree) if lazy else tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ucf"):
            found.add(node.module)
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ucf"))
    return found


def test_no_import_cycles():
    modules = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = path
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    seen, stack = set(), []

    def visit(m):
        if m in stack:
            raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(m) :], m]))
        if m in seen:
            return
        stack.append(m)
        for n in sorted(graph[m]):
            if n.startswith(m + "."):
                continue  # a package importing its own modules
            visit(n)
        stack.pop()
        seen.add(m)

    for m in sorted(graph):
        visit(m)


#: The pipeline's layers, top to bottom as docs/design.md draws them: a module
#: may import from its own layer and the layers before it, never after.
LAYERS = ["lang", "ir", "format", "cin", "schedule", "lower", "codegen", "pipeline", "exec"]
LAYERS += ["serve", "cli"]


def test_layers_only_import_upward():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        own = rel.parts[0]
        if own not in LAYERS:
            continue
        for name in _imports(path, lazy=True):
            parts = name.split(".")
            if parts[0] == "ucf" and len(parts) > 1 and parts[1] in LAYERS:
                assert LAYERS.index(parts[1]) <= LAYERS.index(own), (
                    f"{rel} ({own}) imports {name}, a later layer"
                )


# --------------------------------------------------- a kind plugged in from outside
UNORDERED = Compressed(
    "V", "unordered compressed", ("pos", "crd"), full=False, can_locate=False, ordered=False
)


@pytest.fixture
def unordered(monkeypatch, tmp_path):
    """The kind plugged in for one test, with kernels cached apart: a cached "UV"
    kernel must not outlive the kind that made the format valid."""
    from ucf.exec.kernel import forget_loaded

    monkeypatch.setitem(KINDS, "V", UNORDERED)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    forget_loaded()
    yield
    forget_loaded()


def _shuffled_csr(seed):
    """A CSR matrix whose rows keep their columns in a random order."""
    m = sp.random(30, 20, density=0.2, format="csr", random_state=seed)
    rng = np.random.default_rng(seed)
    indices, data = m.indices.copy(), m.data.copy()
    for r in range(m.shape[0]):
        a, b = m.indptr[r], m.indptr[r + 1]
        perm = rng.permutation(b - a) + a
        indices[a:b], data[a:b] = indices[perm], data[perm]
    return m, m.indptr.astype(np.int32), indices.astype(np.int32), data


def test_an_unordered_level_drives_a_loop_alone(unordered, target):
    m, pos, crd, vals = _shuffled_csr(1)
    A = ucf.Tensor(m.shape, "UV", [{}, {"pos": pos, "crd": crd}], vals)
    x = np.arange(1.0, 21.0)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "UV"}, target=target)
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), m @ x, rtol=1e-14)


def test_an_unordered_level_refuses_co_iteration(unordered):
    with pytest.raises(ucf.UnsupportedError, match=r"tensor A, level 1 \(unordered compressed\)"):
        ucf.compile("S(i,j) = A(i,j) + B(i,j)", formats={"A": "UV", "B": "UC"})
    with pytest.raises(ucf.UnsupportedError, match="tensor A, level 1"):
        ucf.compile("y(i) = A(i,j) * z(j)", formats={"A": "UV", "z": "C"})


def test_an_ordered_level_checks_its_order_and_an_unordered_one_does_not(unordered):
    m, pos, crd, vals = _shuffled_csr(2)
    ucf.Tensor(m.shape, "UV", [{}, {"pos": pos, "crd": crd}], vals)
    with pytest.raises(ucf.FormatError, match="crd not strictly sorted"):
        ucf.Tensor(m.shape, "UC", [{}, {"pos": pos, "crd": crd}], vals)


def test_one_walker_sees_every_block_gpu_nodes_included():
    """``ucf.ir.walk`` finds statements in every nested list a node declares (loop
    prologues, ``else`` branches, GPU scopes), and ``with_blocks`` rewrites each."""
    from ucf.ir import nodes as ir
    from ucf.ir.gpu import Scope
    from ucf.ir.walk import declared, statements, walk, with_blocks

    v = {n: ir.Var(n, "i64") for n in "abcdei"}
    decl = {n: ir.Decl(v[n], ir.Const(0, "i64")) for n in "abcde"}
    loop = ir.For(v["i"], ir.Const(0, "i64"), ir.Const(4, "i64"), [decl["a"]])
    loop.prologue, loop.epilogue = [decl["b"]], [decl["c"]]
    branch = ir.If(ir.Cmp("<", v["i"], v["a"]), [], [Scope([decl["d"]])])
    body = [loop, ir.While(ir.Cmp("<", v["e"], v["i"]), [branch]), decl["e"]]
    assert declared(body) == set("abcdei")
    assert [s for s in statements(body) if isinstance(s, ir.Decl)] == [decl[n] for n in "bacde"]
    assert dict((id(s), len(p)) for s, p in walk(body))[id(decl["d"])] == 3
    emptied = [with_blocks(s, lambda block: []) for s in body]
    assert declared(emptied) == {"i", "e"}


def test_every_package_ships_in_the_wheel():
    """setuptools installs only the packages pyproject lists; one left out works in
    an editable install and breaks ``pip install .`` (as ucf.format.levels once did)."""
    import tomllib

    repo = ROOT.parent
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapped = {name: repo / folder for name, folder in config["package-dir"].items()}
    on_disk = {
        ".".join(d.relative_to(repo).parts)
        for d in [ROOT, *ROOT.rglob("*")]
        if d.is_dir() and any(d.glob("*.py"))
    }
    assert on_disk | set(mapped) == listed
    for name, folder in mapped.items():
        assert (folder / "__init__.py").exists(), name
