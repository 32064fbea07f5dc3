"""Every ```python snippet in README.md and docs/ runs.

The snippets of one file run in order in one namespace, as a reader would
type them, in a scratch directory. A snippet that stops working is a failing
test, so the docs cannot drift from the code.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.helpers import HAVE_CC

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def snippets(page: Path) -> list[tuple[int, str]]:
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in SNIPPET.finditer(text)]


@pytest.mark.parametrize(
    "page", [p for p in PAGES if snippets(p)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_snippets_run(page, tmp_path, monkeypatch):
    code = "".join(code for _, code in snippets(page))
    if not HAVE_CC and ("emulate=True" in code or 'target="c"' in code):
        pytest.skip("the page's snippets need a C compiler")
    if "import torch" in code and importlib.util.find_spec("torch") is None:
        pytest.skip("the page's snippets need PyTorch (pip install '.[torch]')")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"snippets_{page.stem}"}
    for line, code in snippets(page):
        exec(compile(code, f"{page.name}:{line}", "exec"), namespace)


def test_every_page_is_collected():
    assert len([p for p in PAGES if snippets(p)]) >= 4
