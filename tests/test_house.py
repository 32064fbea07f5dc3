"""The house rules (issues 13 and 33): one layer per folder, arrows only upward and no
cycles (lazy imports included), no module over 600 lines, one name per module, and
only formats asking which level kind they hold: a new kind plugs in as one module."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import covered, pairwise, product_params
from ucf.format.levels import KINDS
from ucf.format.levels.compressed import Compressed

ROOT = Path(ucf.__file__).parent

#: The pipeline's layers, top to bottom as docs/design.md draws them: a module may
#: import from its own layer and the layers before it, never after. ``ucf`` itself
#: (ucf/__init__.py) is the API boundary, with the command line and the demo it runs.
LAYERS = [
    "_version",
    "errors",
    "resources",
    "lang",
    "ir",
    "format",
    "cin",
    "schedule",
    "lower",
    "passes",
    "codegen",
    "pipeline",
    "toolchain",
    "exec",
    "stile",
    "autodiff",
    "tesa",
    "tuning",
    "api",
    "dask",
    "torch",
    "nn",
    "demo",
    "serve",
    "cli",
    "__main__",
]
#: Modules of the API boundary, which may import ``ucf`` itself.
BOUNDARY = {"cli", "demo", "__main__"}
MAX_LINES = 600


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        found[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return found


MODULES = modules()


def _imports(path: Path) -> set[str]:
    """The modules of ucf this module imports, at load time or inside functions
    (a lazy import is an arrow as much as any other)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ucf"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "ucf")
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ucf"


def test_every_module_has_a_layer():
    assert {_layer(m) for m in MODULES} - {"ucf"} <= set(LAYERS)


def test_no_import_cycles_lazy_imports_included():
    graph = {m: {i for i in _imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}
    seen, stack = set(), []

    def visit(m):
        if m in stack:
            raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(m) :], m]))
        if m in seen:
            return
        stack.append(m)
        for n in sorted(graph[m]):
            if MODULES[m].name == "__init__.py" and n.startswith(m + "."):
                continue  # a package's __init__ importing its own modules
            visit(n)
        stack.pop()
        seen.add(m)

    for m in sorted(graph):
        visit(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layers_only_import_upward(module):
    own = _layer(module)
    if own == "ucf":
        return  # the package itself is the API: it may name anything, lazily
    for name in _imports(MODULES[module]):
        layer = _layer(name)
        if layer == "ucf":
            assert own in BOUNDARY, f"{module} imports ucf itself; import what it uses instead"
        elif layer in LAYERS:
            assert LAYERS.index(layer) <= LAYERS.index(own), (
                f"{module} ({own}) imports {name}, a later layer"
            )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_600_lines(module):
    lines = MODULES[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by what it holds"


def test_no_two_modules_share_a_name():
    names: dict[str, list[str]] = {}
    for m in MODULES:
        if MODULES[m].name != "__init__.py":
            names.setdefault(m.rsplit(".", 1)[-1], []).append(m)
    assert {n: ms for n, ms in names.items() if len(ms) > 1} == {}


# ------------------------------------------------- formats answer, nobody else asks
#: Level letters compared or spelled (``kind.letter == "C"``, ``"U" * n + "Q"``,
#: ``"F" in str(fmt)``), a kind looked up by letter.
LETTER = re.compile(
    r"""\.letters?\b\s*[!=]=|[!=]=\s*["'][UCSQF]["']|KINDS\[|["'][UCSQF]["']\s*\*"""
    r"""|["'][UCSQF]["']\s+(not\s+)?in\s+str\("""
)
#: A concrete level kind named or tested (``isinstance(k, FixedWidth)``), or a kind
#: made outside the registry.
LEVEL_CLASS = re.compile(
    r"ucf\.format\.levels\.(dense|compressed|singleton|fixed|unordered)"
    r"|\b(DENSE|COMPRESSED|SINGLETON|FIXED_WIDTH|UNORDERED)\b"
    r"|isinstance\([^)]*\b(Dense|Compressed|Singleton|FixedWidth|Unordered)\b"
    r"|\(LevelKind\)"
)
#: A level's storage tested by the names of its arrays (``"pos" in kind.arrays``).
ARRAY_NAME = re.compile(r"""\.arrays\s*[!=]=|["']\w+["']\s+(not\s+)?in\s+[\w.]*\.arrays\b""")
PATTERNS = {"letter": LETTER, "level class": LEVEL_CLASS, "array name": ARRAY_NAME}

#: What may still ask outside format/, by module and pattern (nothing: formats answer);
#: the test below fails as soon as an entry no longer asks, so the list only shrinks.
KNOWN: set[tuple[str, str]] = set()


def _code(path: Path) -> str:
    """A module's code without its docstrings and comments, which may name anything."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def _asking() -> set[tuple[str, str]]:
    found = set()
    for m, path in MODULES.items():
        if _layer(m) == "format":
            continue
        text = _code(path)
        found |= {(m, name) for name, pattern in PATTERNS.items() if pattern.search(text)}
    return found


def test_only_formats_ask_which_kind_they_hold():
    asking = _asking()
    assert asking - KNOWN == set(), "ask the format (a property or a capability) instead"
    assert KNOWN - asking == set(), "no longer asks: take it off KNOWN"


def test_the_scans_find_what_they_look_for():
    assert LETTER.search('if kind.letter == "C":')
    assert LETTER.search("fmt.letters == 'UC'")
    assert LETTER.search('"U" * (n - 1) + "Q"')
    assert LETTER.search('"F" in str(fmt)')
    assert not LETTER.search("kind.output == 'append'")
    assert LEVEL_CLASS.search("from ucf.format.levels.compressed import COMPRESSED")
    assert LEVEL_CLASS.search("isinstance(k, FixedWidth)")
    assert LEVEL_CLASS.search("class WorkspaceList(LevelKind):")
    assert not LEVEL_CLASS.search("isinstance(k, ir.Load)")
    assert ARRAY_NAME.search('elif "pos" in kind.arrays and "crd" in kind.arrays:')
    assert ARRAY_NAME.search('k.arrays != ("pos", "crd")')
    assert not ARRAY_NAME.search("for a in kind.arrays:")


# ------------------------------------------------ text is parsed where it enters
#: A call of a format or schedule parser (``parse_format``, ``parse_formats``,
#: ``parse_schedule``): text becoming objects.
PARSES = re.compile(r"\bparse_(format|formats|schedule)\(")
#: The API boundary, where text may enter: ``ucf.compile`` (exec.kernel, and
#: STile's DynamicKernel behind it), the entry points of the feature packages
#: (``ucf.tune``, ``SparseLinear``'s format), the command line, the server, and the
#: tuner's store of schedules found earlier.
PARSING = {
    "ucf.api",
    "ucf.dask",
    "ucf.exec.kernel",
    "ucf.exec.tuned",
    "ucf.stile.dynamic",
    "ucf.torch.ops",
    "ucf.torch.differentiable",
    "ucf.tuning.study",
    "ucf.nn.linear",
    "ucf.serve.jobs",
    "ucf.cli.run_command",
}
#: What still parses text inside the library (format text it was handed, or built):
#: the test fails as soon as one no longer does, so the list only shrinks.
PARSING_STILL: set[str] = set()


def test_text_is_parsed_where_it_enters():
    parsing = {
        m
        for m, path in MODULES.items()
        if _layer(m) != "format" and m != "ucf.schedule.text" and PARSES.search(_code(path))
    }
    assert parsing - PARSING - PARSING_STILL == set(), (
        "pass Format objects and commands inside the library; parse text only where it "
        "enters (docs/design.md)"
    )
    assert PARSING_STILL & PARSING == set()
    assert PARSING_STILL - parsing == set(), "no longer parses: take it off PARSING_STILL"
    assert PARSES.search("fmt = parse_format(text, order=2)")
    assert PARSES.search("commands = parse_schedule(text)")
    assert not PARSES.search("unparse_format(fmt)")


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
        ucf.compile("S(i,j) = A(i,j) * B(i,j)", formats={"A": "UV", "B": "UC"})


def test_an_unordered_level_times_a_gathered_sparse_vector(unordered):
    """The default gathers a compressed z into a dense workspace (``dense_gather``), so
    A's unordered rows drive their loops alone instead of merging with z."""
    m, pos, crd, vals = _shuffled_csr(3)
    A = ucf.Tensor(m.shape, "UV", [{}, {"pos": pos, "crd": crd}], vals)
    zd = np.where(np.arange(20) % 3 == 0, np.arange(1.0, 21.0), 0.0)
    k = ucf.compile("y(i) = A(i,j) * z(j)", formats={"A": "UV", "z": "C"})
    got = k(A=A, z=ucf.from_numpy(zd, format="C")).to_numpy()
    np.testing.assert_allclose(got, m @ zd, rtol=1e-14)


def test_an_ordered_level_checks_its_order_and_an_unordered_one_does_not(unordered):
    m, pos, crd, vals = _shuffled_csr(2)
    ucf.Tensor(m.shape, "UV", [{}, {"pos": pos, "crd": crd}], vals)
    with pytest.raises(ucf.FormatError, match="crd not strictly sorted"):
        ucf.Tensor(m.shape, "UC", [{}, {"pos": pos, "crd": crd}], vals)


def test_one_walker_sees_every_block_gpu_nodes_included():
    """``ucf.ir.walk`` finds statements in every nested list a node declares (loop
    prologues, ``else`` branches, GPU scopes), and ``with_blocks`` rewrites each."""
    from ucf.ir import nodes as ir
    from ucf.ir.gpu_nodes import Scope
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


#: Hypothesis settings a test file must leave to the profile (as keyword arguments).
RANDOMNESS = re.compile(r"\b(derandomize|database|deadline)=")


def test_the_suite_draws_the_same_hypothesis_examples_every_run(request):
    """One hypothesis profile for the whole suite (tests/helpers.py): derandomized and
    without a database unless ``--hypothesis-profile`` asks for another, and no test
    file sets randomness or timing of its own (the fills fuzz, drawn at random, once
    failed a CI run on a shape nobody had seen)."""
    from hypothesis import settings

    if not request.config.getoption("--hypothesis-profile"):
        assert settings.get_current_profile_name() == "ci"
        assert settings.default.derandomize and settings.default.database is None
    tests = ROOT.parent / "tests"
    own = [
        p for p in tests.rglob("*.py") if p.name != "helpers.py" and "hypothesis" in p.read_text()
    ]
    assert len(own) > 20  # the scan reads the files that use hypothesis
    setting = [p.name for p in own if RANDOMNESS.search(_code(p))]
    assert not setting


def test_the_c_target_runs_a_covering_array_of_a_format_product():
    """``product_params``: every row on llvm (unless told otherwise, then the same rows
    as c); on c in the default suite, rows that hold every pair of values two columns
    take together (``pairwise``), far fewer than all for three lists or more, and every
    row for one or two."""
    lists = ("ab", "xyz", "pq", ["csr", "UU"])
    rows = list(itertools.product(*lists))
    kept = pairwise(rows)

    def pairs(row):
        return {(a, row[a], b, row[b]) for a, b in itertools.combinations(range(len(row)), 2)}

    assert set().union(*map(pairs, kept)) == set().union(*map(pairs, rows))
    assert len(kept) < len(rows) // 2
    params = product_params(*lists)
    on_c = [p for p in params if p.values[0] == "c"]
    slow = [p for p in on_c if any(m.name == "slow" for m in p.marks)]
    assert len(params) == 2 * len(rows) and len(on_c) - len(slow) == len(kept)
    # without every llvm row, llvm's default rows are the covering array's too
    params = product_params(*lists, every_llvm_row=False)
    default = [p.values for p in params if not any(m.name == "slow" for m in p.marks)]
    assert default == [(t, *r) for r in kept for t in ("llvm", "c")]
    for lists in ((["csr", "coo", "UU"],), (["csr", "coo"], ["UU", "CC"])):  # every row
        rows = list(itertools.product(*lists))
        assert pairwise(rows) == rows
        assert not any(p.marks[1:] for p in product_params(*lists))  # none slow


def test_covered_rows_on_the_c_target_skip_without_a_c_compiler():
    """``covered`` over formats and the target (last, as a stacked ``TARGETS`` names
    it): the default rows hold every pair of values, and each row on c, and only
    those, carries the C compiler's skip."""
    lists = (["UU", "UC", "CC"], ["U", "C"], ["llvm", "c"])
    params = covered(*lists)
    assert [p.values for p in params] == list(itertools.product(*lists))
    default = [p.values for p in params if not any(m.name == "slow" for m in p.marks)]
    assert default == pairwise(list(itertools.product(*lists)))
    for p in params:
        assert any(m.name == "skipif" for m in p.marks) == (p.values[-1] == "c")
