"""The page of ``ucf serve`` in a real browser: Debian's chromium, driven by playwright.

These tests hold the page to its contract: the statement is the first text box;
the views follow the typing (and Enter); the concrete index notation shows without
a click; an error shows the text with a caret under the offending character in a
monospace block; everything the page loads comes from the server itself; and the
page's state lives in its URL. ``.ci/run`` installs chromium; elsewhere these tests
are skipped where it is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile

import pytest

from tests.helpers import needs_cc
from tests.serve.support import running

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if shutil.which(CHROMIUM) is None:
    pytest.skip(
        "no chromium (apt-get install chromium; .ci/run installs it)", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="the [test] extra's playwright")
expect = sync_api.expect
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT = 60_000  # ms: the first compile on a loaded machine


@pytest.fixture(scope="module")
def server():
    with running() as base:
        yield base


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(WAIT)
    page.requests = []
    page.problems = []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("console", lambda m: m.type == "error" and page.problems.append(m.text))
    page.on("pageerror", lambda e: page.problems.append(str(e)))
    page.goto(server + "/")
    expect(page.locator("#cin")).to_contain_text("forall")
    yield page
    assert not page.problems, page.problems  # no script error, no refused load
    assert all(url.startswith(server) for url in page.requests), page.requests
    context.close()


def format_row(page, tensor):
    return page.locator(f'.format[data-tensor="{tensor}"]')


def test_the_statement_is_the_first_text_box_and_the_cin_shows_unasked(page):
    first = page.locator("input[type=text], textarea").first
    expect(first).to_have_id("statement")
    expect(page.locator("#cin")).to_be_visible()
    expect(page.locator("#cin")).to_contain_text("forall(i, forall(j, y(i) += A(i, j) * x(j)))")


def test_spmv_in_csr_then_a_singleton_level_changes_the_code(page):
    statement = page.locator("#statement")
    statement.fill("")
    statement.press_sequentially("y(i) = B(i,j) * x(j)", delay=5)  # as a user types
    expect(format_row(page, "B")).to_be_visible()
    format_row(page, "B").locator(".format-text").fill("csr")
    expect(page.locator("#code")).to_contain_text("B1_pos[pB0]")
    expect(page.locator("#code")).to_contain_text("for (int64_t pB1 = ((int64_t)B1_pos[pB0])")
    kinds = format_row(page, "B").locator(".kind")
    kinds.nth(0).select_option("C")
    kinds.nth(1).select_option("S")  # COO: a compressed row level over singleton columns
    expect(format_row(page, "B").locator(".format-text")).to_have_value("CS")
    expect(page.locator("#code")).to_contain_text("B1_crd[pB1]")
    expect(page.locator("#code")).not_to_contain_text("B1_pos")
    expect(page.locator("#cin")).to_contain_text("y(i) += B(i, j) * x(j)")


def test_views_follow_typing_and_enter(page):
    statement = page.locator("#statement")
    statement.fill("C(i,k) = A(i,j) * B(j,k)")  # an input event, no Enter
    expect(page.locator("#cin")).to_contain_text("C(i, k) += A(i, j) * B(j, k)")
    statement.fill("y(i) = A(i,j) * x(j) + z(i)")
    statement.press("Enter")
    expect(page.locator("#cin")).to_contain_text("z(i)")


def caret_under(block_text: str, wanted: str) -> None:
    """The block's last line is a caret under the first character of ``wanted`` in the
    line above it, as the library prints parse errors."""
    *_, line, caret = block_text.rstrip("\n").splitlines()
    assert caret.strip() == "^", block_text
    assert caret.index("^") == line.index(wanted), block_text


def test_a_bad_schedule_command_shows_its_caret(page):
    page.locator("#add-command").click()
    page.locator("#commands input").last.fill("split(i, i0, i1, 8)")
    page.locator("#add-command").click()
    page.locator("#commands input").last.fill("reorder(j, q)")
    error = page.locator("#schedule-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("unknown index variable 'q'")
    caret_under(error.inner_text(), "reorder(j, q)")
    assert "monospace" in error.evaluate("e => getComputedStyle(e).fontFamily")
    assert error.evaluate("e => e.tagName") == "PRE"
    page.locator("#commands li").last.locator("button", has_text="remove").click()
    expect(error).to_be_hidden()
    expect(page.locator("#cin")).to_contain_text("split(i, 8)")


def test_a_statement_error_shows_its_caret(page):
    page.locator("#statement").fill("y(i) = A(i,j) * x(j))")
    error = page.locator("#statement-error")
    expect(error).to_be_visible()
    text = error.inner_text()
    assert "ParseError" in text and "y(i) = A(i,j) * x(j))" in text
    *_, line, caret = text.rstrip("\n").splitlines()
    assert line.strip() == "y(i) = A(i,j) * x(j))"
    assert caret.index("^") == line.rindex(")")


def test_run_says_correct_with_a_time(page):
    page.locator("#size").fill("500")
    page.locator("#run").click()
    result = page.locator("#run-result")
    expect(result).to_contain_text("correct:")
    text = result.inner_text()
    assert " ms" in text and "scipy A @ x" in text, text


@needs_cc
def test_the_downloaded_zip_compiles(page, tmp_path):
    page.locator("#name").fill("spmv")
    with page.expect_download() as got:
        page.locator("#download").click()
    path = tmp_path / got.value.suggested_filename
    got.value.save_as(path)
    assert path.name == "spmv.zip"
    with zipfile.ZipFile(path) as z:
        z.extractall(tmp_path)
    folder = tmp_path / "spmv"
    assert sorted(p.name for p in folder.iterdir()) == ["spmv.c", "spmv.h", "ucf.h"]
    subprocess.run(["cc", "-c", "-Wall", "-Werror", "spmv.c"], cwd=folder, check=True)


def test_a_shared_url_opens_the_same_state(page, browser, server):
    page.locator("#statement").fill("C(i,k) = A(i,j) * B(j,k)")
    expect(format_row(page, "B")).to_be_visible()
    format_row(page, "A").locator(".format-text").fill("dcsr")
    page.locator("#add-command").click()
    page.locator("#commands input").last.fill("split(i, i0, i1, 16)")
    page.locator("#target").select_option("c")
    expect(page.locator("#cin")).to_contain_text("split(i, 16)")
    cin = page.locator("#cin").inner_text()
    url = page.url
    assert "#s=" in url
    other = browser.new_page()
    other.set_default_timeout(WAIT)
    other.goto(url)
    expect(other.locator("#cin")).to_have_text(cin)
    expect(other.locator("#statement")).to_have_value("C(i,k) = A(i,j) * B(j,k)")
    expect(format_row(other, "A").locator(".format-text")).to_have_value("dcsr")
    expect(other.locator("#schedule")).to_have_value("split(i, i0, i1, 16)")
    expect(other.locator("#target")).to_have_value("c")
    other.close()


def test_the_pictures_follow_the_format_and_the_example(page):
    picture = page.locator('.picture[data-tensor="A"]')
    expect(picture.locator("svg")).to_have_count(1)
    picture.locator(".example").fill("1 0 2\n0 0 0")
    expect(picture.locator("svg .node")).to_have_count(2 + 2)  # csr: 2 rows, 2 stored
    expect(picture.locator("svg .value")).to_have_count(2)
    format_row(page, "A").locator(".format-text").fill("dcsr")
    expect(picture.locator("svg .node")).to_have_count(1 + 2)  # one stored row, two columns
