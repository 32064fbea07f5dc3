"""A ``ucf serve`` server on a free loopback port, in a thread of the test process, and
plain HTTP requests to it (urllib: no client library between the test and the wire)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette", reason="ucf serve needs the [serve] extra")
pytest.importorskip("uvicorn", reason="ucf serve needs the [serve] extra")

import uvicorn  # noqa: E402

from ucf.serve.app import create_app  # noqa: E402
from ucf.serve.guard import allowed_hosts  # noqa: E402
from ucf.serve.limits import Limits  # noqa: E402


@contextlib.contextmanager
def running(limits: Limits | None = None) -> Iterator[str]:
    """The base URL of a server answering on 127.0.0.1 until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(allowed_hosts("127.0.0.1", port), limits)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def request(
    url: str, body: object = None, headers: dict | None = None, raw: bytes | None = None
) -> tuple[int, dict, bytes]:
    """Status, headers and body of a GET (no body) or a POST of ``body`` as JSON."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json",
                                                           **(headers or {})})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
