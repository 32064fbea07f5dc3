"""The kernel cache survives damage: every run after flipped bits, truncation, swapped
entries or changed compiler flags gets the right answer, warns about what it could
not use, and repairs the cache. Each run is a fresh process, because the failures
this guards against were segfaults, SIGBUS and aborts."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from tests.helpers import HAVE_CC

REPO = Path(__file__).resolve().parents[2]

# Three kernels checked against scipy/numpy; prints how many CacheWarnings it saw.
CHILD = """
import json, warnings
import numpy as np, scipy.sparse as sp, ucf
from ucf.toolchain.cache import CacheWarning
T = {target!r}
A = sp.random(60, 40, density=0.1, format="csr", random_state=3)
B = sp.random(60, 40, density=0.1, format="csr", random_state=4)
x = np.linspace(0, 1, 40)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    y = ucf.compile("y(i) = A(i,j) * x(j)", formats={{"A": "csr"}}, target=T)(A=A, x=x)
    assert np.allclose(y.to_numpy(), A @ x), "SpMV"
    S = ucf.compile("S(i,j) = A(i,j) + B(i,j)", formats={{"A": "csr", "B": "csr", "S": "csr"}},
                    target=T)(A=A, B=B)
    assert np.allclose(S.to_numpy(), (A + B).toarray()), "SpAdd"
    z = ucf.compile("z(j) = A(i,j) * x(i)", formats={{"A": "csr"}}, target=T)(A=A, x=np.ones(60))
    assert np.allclose(z.to_numpy(), A.T @ np.ones(60)), "SpMV transposed"
print(json.dumps({{"warnings": [str(w.message) for w in seen if w.category is CacheWarning]}}))
"""


def run(cache: Path, target: str, **env) -> list[str]:
    """Run the child on ``cache``; it must succeed. Returns its cache warnings."""
    full = dict(os.environ, UCF_CACHE_DIR=str(cache), PYTHONPATH=str(REPO), **env)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(target=target)],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"status {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])["warnings"]


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.suffix in (".plan", ".so"))


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache filled once per target, copied for each test."""
    made = {}

    def get(target: str) -> Path:
        if target not in made:
            made[target] = tmp_path_factory.mktemp(f"filled-{target}")
            assert run(made[target], target) == []
        return made[target]

    return get


def flip_bits(path: Path, rng: random.Random, n: int = 3) -> None:
    data = bytearray(path.read_bytes())
    for _ in range(n):
        k = rng.randrange(len(data) * 8)
        data[k // 8] ^= 1 << (k % 8)
    path.write_bytes(bytes(data))


def truncate(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(len(data))])


def swap(a: Path, b: Path) -> None:
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


TARGETS = ["llvm", pytest.param("c", marks=pytest.mark.skipif(not HAVE_CC, reason="no cc"))]


def damaged_run(filled, tmp_path, target: str, damage) -> tuple[list[str], Path]:
    cache = tmp_path / "cache"
    shutil.copytree(filled(target), cache)
    damage(entries(cache))
    return run(cache, target), cache


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_flipped_bits_are_detected_and_repaired(filled, tmp_path, target, seed):
    rng = random.Random(seed)
    warned, cache = damaged_run(
        filled, tmp_path, target, lambda files: [flip_bits(f, rng) for f in files]
    )
    assert len(warned) == len(entries(filled(target)))
    assert all("recompiling" in w for w in warned)
    assert run(cache, target) == []  # repaired: the next process warns about nothing


@pytest.mark.parametrize("target", TARGETS)
def test_truncated_entries_are_detected(filled, tmp_path, target):
    rng = random.Random(7)
    warned, _ = damaged_run(
        filled, tmp_path, target, lambda files: [truncate(f, rng) for f in files]
    )
    assert len(warned) == len(entries(filled(target)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("suffix", [".plan", ".so"])
def test_swapped_entries_are_not_another_kernel(filled, tmp_path, target, suffix):
    def damage(files):
        pair = [f for f in files if f.suffix == suffix][:2]
        if len(pair) < 2:
            pytest.skip(f"target {target} keeps no {suffix} entries")
        swap(*pair)

    warned, _ = damaged_run(filled, tmp_path, target, damage)
    assert len(warned) == 2 and all("holds another kernel" in w for w in warned)


@pytest.mark.skipif(not HAVE_CC, reason="no cc")
def test_compiler_flags_are_part_of_the_key(filled, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(filled("c"), cache)
    before = {p.name for p in cache.glob("*.so")}
    flags = "-O1 -ffp-contract=off -fopenmp -fPIC -shared"
    assert run(cache, "c", UCF_CFLAGS=flags) == []
    assert len({p.name for p in cache.glob("*.so")} - before) == 3  # one new library each


@pytest.mark.skipif(not HAVE_CC, reason="no cc")
def test_the_host_cpu_is_part_of_the_key_under_march_native(monkeypatch):
    """-march=native code is for this CPU: a cache directory shared with another CPU must
    not hand it over. The key holds what the compiler makes of native here."""
    from ucf.toolchain import cc

    monkeypatch.delenv("UCF_CFLAGS", raising=False)
    here = cc.identity()
    assert any(t.startswith(("-march=", "-mavx", "-msse")) or "+" in t for t in here["native"])
    assert "-march=native" not in here["native"]
    monkeypatch.setenv("UCF_CFLAGS", "-O2 -ffp-contract=off -fopenmp -fPIC -shared")
    assert cc.identity()["native"] == []  # nothing host-specific without a native flag


def test_a_cache_directory_that_cannot_be_made_still_compiles(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    warned = run(blocker / "cache", "llvm")
    assert len(warned) == 1 and "cannot use" in warned[0]


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seed", range(2, 12))
def test_many_damages(filled, tmp_path, target, seed):
    rng = random.Random(seed)

    def damage(files):
        for f in files:
            rng.choice(
                [lambda p: flip_bits(p, rng, rng.randint(1, 8)), lambda p: truncate(p, rng)]
            )(f)

    warned, cache = damaged_run(filled, tmp_path, target, damage)
    assert len(warned) == len(entries(filled(target)))
    assert run(cache, target) == []


def test_the_cache_keeps_within_its_size_limit(tmp_path, monkeypatch):
    """Storing an entry evicts least recently used ones beyond UCF_CACHE_MAX_MB, and
    loading an entry counts as using it."""
    from ucf.exec.kernel import forget_loaded
    from ucf.toolchain import cache

    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    import ucf

    forget_loaded()
    # What a first compile in a fresh cache also stores (the runtime compiled once per
    # machine, ucf.toolchain.jit) goes in first, oldest of all: where another test of the
    # process had linked it already, it was not stored here, and the groups differed.
    ucf.compile("u(i) = A(i,j)", formats={"A": "csr"})
    first = sorted(cache.entries())
    for p in first:
        os.utime(p, (0, 0))
    statements = ["y(i) = A(i,j) * x(j)", "z(j) = A(i,j) * x(i)", "w(i) = A(i,j) * A(i,j)"]
    groups = []
    for when, text in enumerate(statements, start=1):
        before = set(cache.entries())
        ucf.compile(text, formats={"A": "csr"})  # its plan and its compute type (decisions)
        groups.append(sorted(set(cache.entries()) - before))
        for p in groups[-1]:
            os.utime(p, (when, when))
    a, b, c = groups
    forget_loaded()
    ucf.compile(statements[0], formats={"A": "csr"})  # a load: a is now the newest
    assert sorted(cache.entries()[-len(a) :]) == a
    kept = sum(p.stat().st_size for p in a + c)
    assert sorted(cache.evict(kept)) == sorted(first + b)
    monkeypatch.setenv("UCF_CACHE_MAX_MB", "0.000001")
    forget_loaded()
    k = ucf.compile("v(j) = A(i,j)", formats={"A": "csr"})  # over the limit at once
    assert cache.entries() == []
    A = sp.random(5, 4, density=0.5, format="csr", random_state=0)
    np.testing.assert_allclose(k(A=A).to_numpy(), A.toarray().sum(axis=0))


def test_cli_cache_info_and_clear(tmp_path, monkeypatch, capsys):
    from ucf.cli import main
    from ucf.exec.kernel import forget_loaded

    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    import ucf

    forget_loaded()
    ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    # the kernel's plan and its compute type (ucf.exec.decisions)
    assert f"directory: {tmp_path}" in out and "entries:   2" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.plan"))


def test_the_emulators_precompiled_header_is_used_and_a_damaged_one_replaced():
    """Emulated CUDA builds read ucf_cuda.cuh precompiled (half their compile time);
    a damaged .gch makes the build fall back to the text and is built anew."""
    import ucf
    from ucf.toolchain import cuda_build

    pch = cuda_build._precompiled()
    assert pch is not None and (pch / "ucf_cuda.cuh.gch").stat().st_size > 1_000_000
    gch = pch / "ucf_cuda.cuh.gch"
    gch.write_bytes(gch.read_bytes()[:100_000])  # a truncated file g++ cannot read
    k = ucf.compile("y(i) = A(i,j) * x(j) * 3", {"A": "csr"}, target="cuda", emulate=True)
    a = sp.random(9, 7, density=0.4, format="csr", random_state=4)
    x = np.arange(7.0)
    np.testing.assert_allclose(k(A=a, x=x).to_numpy(), 3 * (a @ x))
    assert not gch.exists() or gch.stat().st_size > 1_000_000  # removed, or built anew
    again = cuda_build._precompiled()
    assert again == pch and gch.stat().st_size > 1_000_000


def test_filling_the_cache_scans_it_once_per_batch_of_writes(tmp_path, monkeypatch):
    """Every write used to stat every entry (quadratic in the entries); the size limit
    still holds, checked on a count of the bytes written and a rescan now and then."""
    from ucf.toolchain import cache

    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    scans = []
    real = cache._scan
    monkeypatch.setattr(cache, "_scan", lambda: scans.append(1) or real())
    writes = 3 * cache.RESCAN_WRITES
    for n in range(writes):
        cache.store(f"e{n}.plan", {"n": n}, b"x" * 1000)
    assert 1 <= len(scans) <= writes // cache.RESCAN_WRITES + 1
    assert len(cache.entries()) == writes
    monkeypatch.setenv("UCF_CACHE_MAX_MB", str(20_000 / 2**20))
    cache.store("last.plan", {"n": -1}, b"x" * 1000)
    assert cache.size() <= 20_000 and cache.entries()[-1].name == "last.plan"


def test_the_parsers_tables_are_cached_and_a_damaged_file_is_rebuilt(tmp_path, monkeypatch):
    """lark keeps the LALR tables in the cache directory (50-100 ms per grammar and
    process); a damaged file is rebuilt, never an error, and `ucf cache clear` removes it."""
    from ucf.lang import parser
    from ucf.toolchain import cache

    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    parser._parser.cache_clear()
    try:
        parser.parse_statement.cache_clear()  # statements parsed before would not parse
        first = parser.parse_statement("y(i) = A(i,j) * x(j)")
        assert str(first) == "y(i) = sum(j, A(i, j) * x(j))"
        tables = tmp_path / "lark-einsum.lark.tables"
        assert tables.stat().st_size > 1000
        tables.write_bytes(b"damaged")
        parser._parser.cache_clear()
        parser.parse_statement.cache_clear()
        again = parser.parse_statement("z(j) = A(i,j) * x(i)")
        assert str(again) == "z(j) = sum(i, A(i, j) * x(i))"
        assert tables.stat().st_size > 1000
        cache.clear()
        assert not tables.exists()
    finally:
        parser._parser.cache_clear()
