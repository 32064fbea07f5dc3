"""``ucf serve``: its options, and starting the server (uvicorn) and the browser.

The server framework is imported here only when the command runs, so ``ucf
--help`` and every other command stay as quick as before.
"""

from __future__ import annotations

import argparse
from typing import Any

EPILOG = """\
examples:
  ucf serve                      open the page on http://127.0.0.1:8000/
  ucf serve --port 9000 --no-browser

The page compiles and runs what it is sent, so the server binds the loopback
address, answers only requests for its own host and from its own page, bounds
the statement, operands, uploads, compile time and run time, and compiles and
runs in a worker process that is stopped past its limit. --host binds another
address (other machines can then use it: do so on a network you trust), and
--allow-host names the host names it may be reached by there.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="a local page to write, see and run kernels",
        description="Serve a page to write a statement, choose formats, a schedule and a "
        "target, read the concrete index notation and the generated code as you type, "
        "see each operand's fibertree, run the kernel against numpy/scipy and download it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (8000; 0 picks a free one)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to NAME (repeatable; with --host)",
    )
    p.add_argument(
        "--compile-limit", type=float, default=20.0, metavar="SECONDS", help="per compile (20)"
    )
    p.add_argument("--run-limit", type=float, default=30.0, metavar="SECONDS", help="per run (30)")


def run(args: argparse.Namespace) -> int:
    import socket
    import threading
    import webbrowser

    from ucf.errors import MissingDependencyError

    try:
        import uvicorn

        from ucf.serve.app import create_app
    except ImportError as e:
        raise MissingDependencyError(
            f"ucf serve needs starlette and uvicorn ({e}); pip install 'ucf[serve]' "
            "(in a checkout: pip install '.[serve]')"
        ) from None
    from ucf.serve.guard import allowed_hosts
    from ucf.serve.limits import Limits

    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))  # bound here, so --port 0 knows its port
    sock.listen(128)  # and listening before the address is printed
    port = sock.getsockname()[1]
    limits = Limits(compile_seconds=args.compile_limit, run_seconds=args.run_limit)
    app = create_app(allowed_hosts(args.host, port, args.allow_host), limits)
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}/"
    print(f"ucf serve: {url} (Ctrl-C stops it)", flush=True)
    if not args.no_browser:
        threading.Timer(0.5, webbrowser.open, (url,)).start()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
    return 0
