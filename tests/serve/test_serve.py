"""``ucf serve`` over HTTP: what the page's API answers, and what it refuses (foreign
Host and Origin, oversize requests, compiles past their limit, other addresses)."""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import socket
import subprocess
import sys
import time
import zipfile
from html.parser import HTMLParser

import pytest

import ucf
from tests.helpers import needs_cc
from tests.serve.support import request, running
from ucf.serve.limits import Limits

SPMV = {"statement": "y(i) = A(i,j) * x(j)", "formats": {"A": "csr"}}
#: A union of 15 sparse operands: its merge lattice takes seconds to build.
SLOW = {
    "statement": "Y(i,j) = " + " + ".join(f"{c}(i,j)" for c in "ABCDEFGHIJKLMNO"),
    "formats": {c: "CC" for c in "ABCDEFGHIJKLMNOY"},
}


@pytest.fixture(scope="module")
def server():
    with running(Limits(extent=5000, elements=1_000_000, compile_seconds=60)) as base:
        yield base


def post(base, path, body, **headers):
    status, head, data = request(base + path, body, headers)
    is_json = head.get("content-type", "").startswith("application/json")
    return status, json.loads(data) if is_json else data


# ------------------------------------------------------------------ what it answers


def test_compile_shows_the_cin_and_the_code_for_each_target(server):
    status, got = post(server, "/api/compile", SPMV)
    assert status == 200 and "error" not in got
    assert got["views"]["cin"] == ucf.compile(SPMV["statement"], SPMV["formats"]).cin
    assert "for (int64_t pA1 = ((int64_t)A1_pos[pA0])" in got["views"]["c"]
    assert 'define void @"kernel"(' in got["views"]["llvm"]
    assert [t["name"] for t in got["tensors"]] == ["y", "A", "x"]
    levels = [{"kind": "U", "stores": "0"}, {"kind": "C", "stores": "1"}]
    assert got["tensors"][1]["levels"] == levels
    assert set(got["pictures"]) == {"y", "A", "x"} and "<svg" in got["pictures"]["A"]["svg"]
    status, asm = post(server, "/api/asm", SPMV)
    assert status == 200 and re.search(r"^\s*(ret|retq)\b", asm["asm"], re.M)
    status, cuda = post(server, "/api/compile", {**SPMV, "target": "cuda"})
    assert status == 200 and "__global__" in cuda["views"]["cuda"] and "c" not in cuda["views"]


def test_an_error_points_at_the_offending_text(server):
    status, got = post(server, "/api/compile", {**SPMV, "statement": "y(i) = A(i,j) * x(j"})
    error = got["error"]
    assert status == 200 and error["kind"] == "ParseError" and error["where"] == "statement"
    lines = error["message"].splitlines()
    assert lines[1:] == ["  y(i) = A(i,j) * x(j", "  " + " " * 18 + "^"]
    schedule = "split(i, i0, i1, 4);\n  reorder(j, q)"
    status, got = post(server, "/api/compile", {**SPMV, "schedule": schedule})
    error = got["error"]
    assert error["kind"] == "ScheduleError" and error["where"] == "schedule"
    assert error["message"].startswith("reorder(j, q): unknown index variable 'q'")
    assert error["caret"] == "    reorder(j, q)\n    ^"
    status, got = post(server, "/api/compile", {**SPMV, "schedule": "frobnicate(i)"})
    assert got["error"]["caret"] == "  frobnicate(i)\n  ^"
    status, got = post(server, "/api/compile", {**SPMV, "formats": {"A": "ds"}})
    assert got["error"]["kind"] == "FormatError" and "ucf taco" in got["error"]["message"]
    assert [t["valid"] for t in got["tensors"]] == [True, False, True]  # rows stay


def test_a_run_is_checked_against_numpy_and_timed_against_scipy(server):
    status, got = post(server, "/api/run", {**SPMV, "size": 300, "density": 0.05})
    assert status == 200, got
    assert got["correct"] is True and got["reference"] == "scipy A @ x"
    assert got["shape"] == [300] and got["ucf_ms"] > 0 and got["reference_ms"] > 0
    relu = {"statement": "y(i) = relu(A(i,j) * x(j)) - 2 * b(i)", "formats": {"A": "dcsr"}}
    status, got = post(server, "/api/run", {**relu, "size": 50})
    assert got["correct"] is True and got["reference"] == "numpy on dense copies"


def test_a_run_on_an_uploaded_matrix_market_file(server):
    import scipy.io
    import scipy.sparse as sp

    m = sp.random(40, 30, density=0.1, random_state=4, format="coo")
    text = io.BytesIO()
    scipy.io.mmwrite(text, m)
    body = {**SPMV, "size": 7, "upload": {"tensor": "A", "text": text.getvalue().decode()}}
    status, got = post(server, "/api/run", body)
    assert status == 200 and got["correct"] is True and got["shape"] == [40]
    bad = {**SPMV, "upload": {"tensor": "A", "text": "not a matrix"}}
    status, got = post(server, "/api/run", bad)
    assert status == 400 and "not Matrix Market" in got["error"]["message"]


@needs_cc
def test_the_download_is_a_kernel_that_compiles(server, tmp_path):
    status, data = post(server, "/api/download", {**SPMV, "name": "spmv"})
    assert status == 200
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert sorted(z.namelist()) == ["spmv/spmv.c", "spmv/spmv.h", "spmv/ucf.h"]
        z.extractall(tmp_path)
    subprocess.run(["cc", "-c", "-Wall", "-Werror", "spmv.c"], cwd=tmp_path / "spmv", check=True)
    status, got = post(server, "/api/download", {**SPMV, "name": "../../etc/passwd"})
    assert status == 400 and "a C identifier" in got["error"]["message"]


class _Assets(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("src", "href"):
            if attrs.get(key) and not attrs[key].startswith("data:"):
                self.found.append(attrs[key])


def test_every_asset_is_served_by_the_server_itself(server):
    status, head, page = request(server + "/")
    assert status == 200
    assert "default-src 'self'" in head["content-security-policy"]
    parser = _Assets()
    parser.feed(page.decode())
    assert parser.found, "the page names its assets"
    for asset in parser.found:
        assert asset.startswith("/") and not asset.startswith("//"), asset
        status, _, body = request(server + asset)
        assert status == 200 and body, asset
        text = body.decode()
        assert not re.search(r"https?://", text.replace("http://www.w3.org", "")), asset


# ------------------------------------------------------------------ what it refuses


def test_a_foreign_host_or_origin_is_refused(server):
    port = server.rsplit(":", 1)[1]
    for headers in ({"host": "attacker.example"}, {"host": f"rebound.example:{port}"}):
        status, _, body = request(server + "/", headers=headers)
        assert status == 403 and b"DNS rebinding" in body
    status, _, body = request(server + "/api/compile", SPMV, {"origin": "http://attacker.example"})
    assert status == 403 and b"other sites' pages" in body
    status, _, body = request(server + "/api/run", SPMV, {"sec-fetch-site": "cross-site"})
    assert status == 403
    status, _, _ = request(server + "/api/compile", SPMV, {"origin": server})
    assert status == 200  # its own page


def test_oversize_statements_operands_and_bodies_are_refused(server):
    long = {**SPMV, "statement": "y(i) = " + " + ".join(["A(i,j) * x(j)"] * 100)}
    status, got = post(server, "/api/compile", long)
    assert status == 400 and "characters; ucf serve takes at most 1000" in got["error"]["message"]
    status, got = post(server, "/api/run", {**SPMV, "size": 2000})
    assert status == 400
    assert "A would have 4,000,000 elements (2000x2000)" in got["error"]["message"]
    status, got = post(server, "/api/run", {**SPMV, "size": 10**6})
    assert status == 400 and "size: an extent from 1 to 5000" in got["error"]["message"]
    host, port = server.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/api/compile")
    conn.putheader("content-length", str(11 * 2**20))  # refused before a byte is read
    conn.endheaders()
    answer = conn.getresponse()
    assert answer.status == 413 and b"larger than ucf serve's limit" in answer.read()
    conn.close()


def test_a_statement_that_compiles_too_long_is_stopped_at_its_limit():
    with running(Limits(compile_seconds=1.0)) as base:
        start = time.monotonic()
        status, got = post(base, "/api/compile", SLOW)
        took = time.monotonic() - start
        assert status == 400 and took < 20
        assert got["error"]["message"].startswith("compiling took longer than 1 s")
        status, got = post(base, "/api/compile", SPMV)  # a fresh worker serves the next
        assert status == 200 and "forall" in got["views"]["cin"]


def _outward_address() -> str | None:
    """This machine's address on its network (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only picks the interface
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def test_the_command_binds_loopback_only_by_default(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ucf", "serve", "--no-browser", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        match = re.match(r"ucf serve: http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        port = int(match.group(1))
        status, _, _ = request(f"http://127.0.0.1:{port}/")
        assert status == 200
        outward = _outward_address()
        if outward is None:
            pytest.skip("this machine has no non-loopback address to try")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((outward, port), timeout=5).close()
    finally:
        proc.terminate()
        proc.wait(15)
