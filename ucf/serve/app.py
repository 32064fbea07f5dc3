"""The routes of ``ucf serve`` (Starlette): the page and its assets, and the JSON API
the page calls. Every request passes ``ucf.serve.guard`` first; every field is
checked by ``ucf.serve.limits``; every compile and run happens in the worker."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ucf.serve.guard import Guard
from ucf.serve.limits import NAME, LimitError, Limits, kernel_fields, run_fields
from ucf.serve.worker import Worker

STATIC = Path(__file__).resolve().parent / "static"


def create_app(hosts: frozenset[str], limits: Limits | None = None) -> Starlette:
    """The application, answering only for ``hosts`` (``guard.allowed_hosts``)."""
    limits = limits or Limits()
    worker = Worker()

    async def call(request: Request, job: str, seconds: float, what: str, extra) -> Any:
        try:
            data = json.loads(await request.body() or b"{}")
            fields = kernel_fields(data, limits)
            fields.update(extra(data))
            status, result = await run_in_threadpool(worker.call, job, seconds, what, **fields)
        except LimitError as e:
            return JSONResponse({"error": {"kind": "LimitError", "message": str(e)}}, 400)
        except json.JSONDecodeError:
            return JSONResponse({"error": {"kind": "LimitError", "message": "not JSON"}}, 400)
        if status == "error":
            return JSONResponse({"error": result}, 400)
        return result

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def info(request: Request) -> Response:
        from ucf._version import __version__

        return JSONResponse({"version": __version__, "limits": asdict(limits)})

    async def compile_(request: Request) -> Response:
        def extra(data: dict) -> dict:
            examples = data.get("examples") or {}
            if not isinstance(examples, dict) or not all(
                isinstance(v, str) for v in examples.values()
            ):
                raise LimitError("examples: text by tensor name")
            return {"examples": examples, "limits": limits}

        result = await call(request, "compile_views", limits.compile_seconds, "compiling", extra)
        return result if isinstance(result, Response) else JSONResponse(result)

    async def asm(request: Request) -> Response:
        result = await call(request, "assembly", limits.compile_seconds, "compiling", dict)
        return result if isinstance(result, Response) else JSONResponse(result)

    async def run(request: Request) -> Response:
        def extra(data: dict) -> dict:
            return {**run_fields(data, limits), "limits": limits}

        seconds = limits.compile_seconds + limits.run_seconds
        result = await call(request, "run", seconds, "compiling and running", extra)
        return result if isinstance(result, Response) else JSONResponse(result)

    async def download(request: Request) -> Response:
        def extra(data: dict) -> dict:
            name = data.get("name") or "kernel"
            if not isinstance(name, str) or not NAME.match(name):
                raise LimitError("name: a C identifier of at most 32 characters")
            return {"name": name}

        result = await call(request, "download", limits.compile_seconds, "compiling", extra)
        if isinstance(result, Response):
            return result
        disposition = f'attachment; filename="{result["filename"]}"'
        return Response(
            result["data"],
            media_type="application/zip",
            headers={"content-disposition": disposition},
        )

    routes = [
        Route("/", index),
        Route("/api/info", info),
        Route("/api/compile", compile_, methods=["POST"]),
        Route("/api/asm", asm, methods=["POST"]),
        Route("/api/run", run, methods=["POST"]),
        Route("/api/download", download, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        worker.start()  # the compiler warms up while the browser loads the page
        yield
        worker.stop()

    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, hosts=hosts, max_body=limits.body)],
        lifespan=lifespan,
    )
