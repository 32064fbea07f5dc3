"""What the fuzzers share: drawing through one interface, judging an outcome, and
running cases in worker subprocesses.

``tests/schedule/fuzz_cases.py`` (random schedules over the classic kernels) and
``tests/statement_fuzz.py`` (random statements) draw through ``Draw``: hypothesis in
the test suite (``HypothesisDraw``, which shrinks a failure), a seeded
``random.Random`` in the long runs (``RandomDraw``, ``bench/fuzz.py``). A case is
plain data; a ``WorkerPool`` sends it as JSON to a worker subprocess, which runs it
with its module's ``run_case`` and answers an ``Outcome``. The parent turns a worker
that dies into a "crash" and one that stops answering into a "hang", restarts it,
and goes on, so a segfault (or an AddressSanitizer report) is a failure with a repro
rather than a dead run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import faulthandler
import importlib
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class Draw(Protocol):
    """The choices a generator makes; shrinking moves each toward its first option."""

    def choice(self, options: Sequence[Any]) -> Any: ...

    def integer(self, low: int, high: int) -> int: ...

    def boolean(self, p: float) -> bool: ...


class RandomDraw:
    """Draws from a seeded ``random.Random`` (the long run)."""

    def __init__(self, seed: int | str):
        self.rng = random.Random(seed)

    def choice(self, options: Sequence[Any]) -> Any:
        return self.rng.choice(list(options))

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def boolean(self, p: float) -> bool:
        return self.rng.random() < p


class HypothesisDraw:
    """Draws through hypothesis, which can then shrink a failing case."""

    def __init__(self, draw: Callable):
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(self.st.sampled_from(list(options)))

    def integer(self, low: int, high: int) -> int:
        return self.draw(self.st.integers(low, high))

    def boolean(self, p: float) -> bool:
        # 0 (what hypothesis shrinks to) means False.
        return self.draw(self.st.integers(0, 99)) >= round(100 * (1 - p))


def permutation(d: Draw, items: list) -> list:
    rest = list(items)
    out = []
    while rest:
        out.append(rest.pop(d.integer(0, len(rest) - 1)))
    return out


def fit_nm(fmt: str, a: np.ndarray) -> np.ndarray:
    """``a`` pruned to what ``nm(n,m)`` stores: the first n nonzeros of each group of m
    along the last mode (``a`` itself for any other format)."""
    if not fmt.startswith("nm(") or not a.size:
        return a
    n, m = (int(x) for x in fmt[3:-1].split(","))
    a = a.copy()
    rows = a.reshape(-1, a.shape[-1])
    for g in range(0, a.shape[-1], m):
        block = rows[:, g : g + m]
        block[np.cumsum(block != 0, axis=1) > n] = 0
    return a


@dataclass
class Outcome:
    status: str  # ok, refused, racy | wrong, error, crash, hang
    detail: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in FAILURES


FAILURES = ("wrong", "error", "crash", "hang")


class _Worker:
    """One long-lived subprocess that runs cases sent as JSON lines."""

    def __init__(self, env: dict[str, str]):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz_common", "--worker"],  # ROOT on its path
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )
        self.buffer = b""
        self.served = 0
        self.log_at = 0
        self.deadline = 0.0
        self.case: Any = None

    def send(self, request: dict, case: Any, timeout: float) -> None:
        self.log_at = self.log.tell()
        self.case = case
        self.deadline = time.monotonic() + timeout
        self.started = time.monotonic()
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def read(self) -> Outcome | None:
        """The reply if one is complete, a crash outcome at end of file, else None."""
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not chunk:
            self.proc.wait()
            code = self.proc.returncode
            why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            return Outcome("crash", f"worker died ({why})\n{self.stderr()}", self.elapsed())
        self.buffer += chunk
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        self.served += 1
        reply = json.loads(line)
        return Outcome(reply["status"], reply["detail"], self.elapsed())

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def stderr(self) -> str:
        self.log.seek(self.log_at)
        text = self.log.read().decode(errors="replace")
        self.log.seek(0, os.SEEK_END)
        return text[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.log.close()


class WorkerPool:
    """Worker subprocesses that run cases; one that dies or hangs is replaced.

    Each worker gets ``threads`` OpenMP threads and, unless given, a kernel
    cache directory of its own.  A worker is also replaced after ``recycle``
    cases, which bounds the memory its JIT-compiled kernels hold.

    Where glibc ships its malloc debugger, workers run with it (``MALLOC_CHECK_=3``):
    a kernel that writes past an array it was given usually leaves the right answer,
    and without the check the heap it damaged only fails cases later, in an innocent
    one; with it the free at the end of the guilty case aborts (seed 44's case 663).
    """

    def __init__(self, size: int = 1, timeout: float = 120.0, threads: int = 2, recycle: int = 150):
        self.size = size
        self.timeout = timeout
        self.recycle = recycle
        self.cache = tempfile.TemporaryDirectory(prefix="ucf-fuzz-cache-")
        self.env = dict(os.environ)
        self.env["OMP_NUM_THREADS"] = str(threads)
        self.env.pop("UCF_NUM_THREADS", None)
        self.env["UCF_CACHE_DIR"] = self.cache.name
        debugger = ctypes.util.find_library("c_malloc_debug")
        if debugger and "LD_PRELOAD" not in self.env:
            self.env |= {"LD_PRELOAD": debugger, "MALLOC_CHECK_": "3"}
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.idle: list[_Worker] = []

    def _worker(self) -> _Worker:
        return self.idle.pop() if self.idle else _Worker(self.env)

    def _release(self, w: _Worker, outcome: Outcome) -> None:
        if outcome.status in ("crash", "hang") or w.served >= self.recycle:
            w.kill()
        else:
            self.idle.append(w)

    def run(self, case: Any) -> Outcome:
        return next(self.map([case]))[1]

    def probe(self, request: dict, timeout: float) -> Outcome:
        """Send a raw request (the machinery's own tests use ``crash`` and ``sleep``)."""
        w = self._worker()
        w.send(request, None, timeout)
        outcome = self._wait({w.proc.stdout.fileno(): w})[1]
        self._release(w, outcome)
        return outcome

    def map(self, cases: Iterable[Any]) -> Iterator[tuple[Any, Outcome]]:
        """Run cases on up to ``size`` workers; yield (case, outcome) as they finish."""
        pending = iter(cases)
        busy: dict[int, _Worker] = {}
        while True:
            while len(busy) < self.size:
                case = next(pending, None)
                if case is None:
                    break
                w = self._worker()
                request = {"case": asdict(case), "module": type(case).__module__}
                w.send(request, case, self.timeout)
                busy[w.proc.stdout.fileno()] = w
            if not busy:
                return
            w, outcome = self._wait(busy)
            self._release(w, outcome)
            yield w.case, outcome

    def _wait(self, busy: dict[int, _Worker]) -> tuple[_Worker, Outcome]:
        """Block until one busy worker answers, dies or runs out of time; free it."""
        with selectors.DefaultSelector() as sel:
            for fd in busy:
                sel.register(fd, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                late = [fd for fd, w in busy.items() if w.deadline <= now]
                if late:
                    w = busy.pop(late[0])
                    w.kill()
                    return w, Outcome("hang", f"no answer within {self.timeout:g} s", w.elapsed())
                wait = min(w.deadline for w in busy.values()) - now
                for key, _ in sel.select(wait):
                    outcome = busy[key.fd].read()
                    if outcome is not None:
                        return busy.pop(key.fd), outcome

    def close(self) -> None:
        for w in self.idle:
            w.kill()
        self.idle = []
        self.cache.cleanup()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve() -> None:
    """The worker's loop: one JSON request per line in, one outcome per line out."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed to stdout goes to the log, not into the replies
    faulthandler.enable()
    for line in sys.stdin:
        request = json.loads(line)
        if "crash" in request:
            os.kill(os.getpid(), signal.SIGSEGV)
        if "sleep" in request:
            time.sleep(request["sleep"])
        if "overrun" in request:  # what a wrong kernel does: write past an array it was given
            # Blocks past numpy's cache of small ones, so freed by free(). The debugger finds
            # its check byte past the block by a chain of skip lengths from the chunk's end,
            # which ends in the block when the write lands on the check byte: zeroed blocks
            # stop the chain there (garbage left by earlier cases could lead it to a byte
            # equal to the check byte: the test failed one CI-like run in a worker with a
            # history), and two blocks with different bytes written miss only if both their
            # check bytes (set by the address) equal what was written.
            blocks = [np.zeros(1000), np.zeros(1000)]
            for block, byte in zip(blocks, (0x55, 0xAA), strict=True):
                ctypes.memset(block.ctypes.data + block.nbytes, byte, 8)
            del blocks, block
        outcome = Outcome("ok")
        if "case" in request:  # a case of this module's or of another fuzzer's (its module)
            fuzzer = importlib.import_module(request.get("module", "tests.schedule.fuzz_cases"))
            outcome = fuzzer.run_case(fuzzer.Case(**request["case"]))
        proto.write(json.dumps({"status": outcome.status, "detail": outcome.detail}) + "\n")
        proto.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    serve()
