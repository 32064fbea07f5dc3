"""One worker process that compiles and runs for ``ucf serve``, killed past a limit.

A statement can take arbitrarily long to compile (a union of many sparse
operands) and a kernel to run, and neither can be interrupted from inside a
thread. So jobs run in a separate process, one at a time, and a job that passes
its time limit has its process killed and a fresh one started; the caller gets a
:class:`LimitError` that says which limit it hit. The process is kept between jobs,
so the compiler's imports and the in-process kernels are paid for once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

from ucf.serve.limits import LimitError

#: How long a new worker may take to import the compiler and warm up.
STARTUP_SECONDS = 120


def _serve(incoming: Connection, outgoing: Connection) -> None:
    """The worker's loop: run each job it is sent and send back what came of it."""
    from ucf.errors import UcfError
    from ucf.serve import jobs

    jobs.warm()
    outgoing.send(("ready", None))
    while True:
        try:
            name, kwargs = incoming.recv()
        except EOFError:
            return
        try:
            outgoing.send(("ok", getattr(jobs, name)(**kwargs)))
        except UcfError as e:
            outgoing.send(("error", jobs.describe_error(e, kwargs)))
        except Exception as e:  # a bug in ucf: say so, keep serving
            message = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
            outgoing.send(("error", {"kind": "InternalError", "message": message}))


class Worker:
    """The process that runs jobs, started on first use and again after a kill.

    It is a fresh interpreter (``python -m ucf.serve.worker``) talking over two pipes,
    rather than a multiprocessing child: that would re-import whatever script started
    the server, and forking a threaded server is unsafe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None

    def start(self) -> None:
        """Start the process now (it warms up the compiler while the page loads)."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        to_child, from_parent = os.pipe()
        from_child, to_parent = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "ucf.serve.worker", str(to_child), str(to_parent)],
            pass_fds=(to_child, to_parent),
        )
        os.close(to_child)
        os.close(to_parent)
        self._send = Connection(from_parent, readable=False)
        self._recv = Connection(from_child, writable=False)
        # Starting (importing the compiler, one warm-up compile) is not a job's time.
        if not self._recv.poll(STARTUP_SECONDS) or self._recv.recv() != ("ready", None):
            self.stop()
            raise LimitError(f"the worker process did not start within {STARTUP_SECONDS} s")

    def call(self, job: str, limit: float, what: str, **kwargs: Any) -> tuple[str, Any]:
        """Run ``job`` with ``kwargs``: ``("ok", result)`` or ``("error", description)``.
        Past ``limit`` seconds the process is killed, and :class:`LimitError` says
        that ``what`` (``"compiling"``, ``"running"``) took too long."""
        with self._lock:
            self._ensure()
            self._send.send((job, kwargs))
            if self._recv.poll(limit):
                try:
                    return self._recv.recv()
                except EOFError:
                    pass  # the process died (a crash in native code): start another
                died = f"the worker stopped while {what} (exit status {self._process.wait()})"
                self._restart()
                raise LimitError(died)
            self._restart()
            raise LimitError(
                f"{what} took longer than {limit:g} s, ucf serve's limit; the worker was "
                "stopped (ucf serve --compile-limit and --run-limit change the limits)"
            )

    def _restart(self) -> None:
        self.stop()
        self._ensure()

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(5)
            self._send.close()
            self._recv.close()
            self._process = self._send = self._recv = None


if __name__ == "__main__":
    _serve(
        Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False)
    )
