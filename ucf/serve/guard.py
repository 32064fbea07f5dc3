"""The requests ``ucf serve`` answers: its own Host, its own Origin, bounded bodies.

A page on any other site can make the browser send requests to 127.0.0.1, and a
DNS name that rebinds to 127.0.0.1 makes them look same-origin to the browser.
Both are stopped here, before any route runs: the Host header must name this
server (a rebound name does not), and a request that carries an Origin (every
cross-site POST does) must come from this server's own page. Every answer also
forbids the page to load anything from elsewhere (Content-Security-Policy).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def allowed_hosts(host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host header values this server answers: the loopback names at ``port``,
    the address it binds (unless it is every address), and ``extra`` names."""
    names = set(LOOPBACK) | set(extra)
    if host not in ("0.0.0.0", "::", ""):
        names.add(f"[{host}]" if ":" in host and not host.startswith("[") else host)
    return frozenset(f"{n}:{port}" for n in names)


class Guard:
    """ASGI middleware: refuse foreign Host and Origin headers and oversize bodies."""

    def __init__(self, app: Any, hosts: frozenset[str], max_body: int) -> None:
        self.app, self.hosts, self.max_body = app, hosts, max_body

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        origin = headers.get("origin")
        if host not in self.hosts:
            await _refuse(
                send,
                403,
                f"ucf serve answers requests for {_listed(self.hosts)}, "
                f"not for host '{host}' (a guard against DNS rebinding)",
            )
            return
        if origin is not None and origin.removeprefix("http://") not in self.hosts:
            await _refuse(
                send, 403, f"ucf serve refuses requests from other sites' pages (origin '{origin}')"
            )
            return
        if headers.get("sec-fetch-site") == "cross-site":
            await _refuse(send, 403, "ucf serve refuses cross-site requests")
            return
        length = headers.get("content-length")
        if scope["method"] == "POST" and not (length or "").isdigit():
            await _refuse(send, 411, "ucf serve takes requests with a Content-Length")
            return
        if int(length or 0) > self.max_body:
            await _refuse(
                send,
                413,
                f"the request is larger than ucf serve's limit of {self.max_body // 2**20} MB",
            )
            return

        async def secured(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (b"content-security-policy", POLICY.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                ]
            await send(message)

        await self.app(scope, receive, secured)


def _listed(hosts: frozenset[str]) -> str:
    return ", ".join(sorted(hosts))


async def _refuse(send: Any, status: int, message: str) -> None:
    body = message.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
