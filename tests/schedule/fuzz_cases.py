"""Random schedules over the classic sparse kernels, each case run in a worker subprocess.

One generator serves both ``tests/schedule/test_fuzz.py`` (a short,
derandomized hypothesis run) and ``bench/fuzz.py`` (the long run that writes
minimized repros).  It draws through a small ``Draw`` interface, so hypothesis
can shrink a failing case while the long run draws from a seeded
``random.Random``.

A case is plain data - kernel, formats, schedule text, target, extents,
densities and a data seed - so it crosses to a worker as JSON and prints as a
standalone repro.  The worker compiles and runs it and compares the result
with ``np.einsum`` on dense copies.  The parent turns a worker that dies into
a "crash" and one that stops answering into a "hang", restarts it, and goes
on, so a segfault is a failure with a repro rather than a dead run.

The statements are single products (or one element-wise sum) whose reduction
variables span the whole right-hand side, so the reference does not depend
on how ucf scopes sums inside larger expressions.

Allowed outcomes are the right answer or a ``ucf.UcfError`` that refuses the
case.  ``ucf.CompileError`` is a failure here: it means the backend rejected
code ucf generated.  A schedule that asserts ``IgnoreRaces`` on a loop over a
reduction variable is the user's promise, not ucf's: such a case runs on one
thread, and a wrong answer under a ``CPUVector`` promise is reported as
"racy", not as a failure.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- kernels


@dataclass
class FuzzKernel:
    """A statement, its operands' index variables, and which operands are sparse."""

    expr: str
    operands: dict[str, str]  # operand -> its index variables, one letter each
    output: tuple[str, str]  # (name, index variables)
    terms: tuple[tuple[str, ...], ...]  # the reference sums these products
    sparse: tuple[str, ...]  # operands that always get a sparse format
    sparse_output: float = 0.0  # how often the output gets a sparse format

    @property
    def variables(self) -> list[str]:
        out = self.output[1] + "".join(self.operands.values())
        return list(dict.fromkeys(out))

    @property
    def reductions(self) -> set[str]:
        return set(self.variables) - set(self.output[1])


KERNELS = {
    "SpMV": FuzzKernel(
        "y(i) = A(i,j) * x(j)", {"A": "ij", "x": "j"}, ("y", "i"), (("A", "x"),), ("A",)
    ),
    "SpMM": FuzzKernel(
        "C(i,k) = A(i,j) * B(j,k)", {"A": "ij", "B": "jk"}, ("C", "ik"), (("A", "B"),), ("A",)
    ),
    "SDDMM": FuzzKernel(
        "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
        {"B": "ij", "C": "ik", "D": "kj"},
        ("A", "ij"),
        (("B", "C", "D"),),
        ("B",),
        0.3,
    ),
    "TTV": FuzzKernel(
        "A(i,j) = B(i,j,k) * c(k)", {"B": "ijk", "c": "k"}, ("A", "ij"), (("B", "c"),), ("B",), 0.3
    ),
    "MTTKRP": FuzzKernel(
        "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)",
        {"B": "ikl", "C": "kj", "D": "lj"},
        ("A", "ij"),
        (("B", "C", "D"),),
        ("B",),
    ),
    "SpGEMM": FuzzKernel(
        "C(i,j) = A(i,k) * B(k,j)",
        {"A": "ik", "B": "kj"},
        ("C", "ij"),
        (("A", "B"),),
        ("A", "B"),
        0.7,
    ),
    "SpAdd": FuzzKernel(
        "C(i,j) = A(i,j) + B(i,j)",
        {"A": "ij", "B": "ij"},
        ("C", "ij"),
        (("A",), ("B",)),
        ("A",),
        0.5,
    ),
}

ALIASES = {1: (), 2: ("csr", "csc", "dcsr", "dcsc", "coo"), 3: ("csf", "coo")}
EXTENTS = (3, 1, 2, 4, 5, 6, 7, 9, 17)
#: Now and then a case is large enough that parallel loops really overlap.
LARGE_EXTENTS = (24, 40, 64)
DENSITIES = (0.3, 0.0, 0.6, 1.0)
#: How often an operand's last level is fixed-width (ELL-like, ``F<w>``).
FIXED_WIDTH = 0.15
FACTORS = (2, 3, 4, 1, 7, 8, 16)
STRATEGIES = ("NoRaces", "Atomics", "Temporary", "ParallelReduction", "IgnoreRaces")
#: Vector lanes cannot add atomically, a refusal tests/schedule/test_commands.py covers.
VECTOR_STRATEGIES = ("NoRaces", "ParallelReduction", "IgnoreRaces", "Temporary")
#: Command kinds, repeated to weight the draw; the first is what hypothesis shrinks to.
COMMANDS = (
    "split",
    "reorder",
    "split",
    "parallelize",
    "pos",
    "fuse",
    "divide",
    "bound",
    "unroll",
    "precompute",
)
MAX_COMMANDS = 6
WORKSPACES = ("w", "w2")  # up to two precomputes per schedule


# --------------------------------------------------------------------------- drawing


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


def cases(targets: Sequence[str] = ("llvm",), kernels: Sequence[str] = tuple(KERNELS)):
    """A hypothesis strategy of cases."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw):
        return draw_case(HypothesisDraw(draw), targets, kernels)

    return strategy()


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    kernel: str
    formats: dict[str, str]  # operands and output; a tensor not named is dense
    schedule: str
    target: str
    extents: dict[str, int]
    densities: dict[str, float]  # per sparse operand; dense operands are full
    seed: int
    races: list[str] = field(default_factory=list)  # units IgnoreRaces is asserted on

    @property
    def statement(self) -> str:
        return KERNELS[self.kernel].expr


def draw_case(d: Draw, targets: Sequence[str], kernels: Sequence[str] = tuple(KERNELS)) -> Case:
    name = d.choice(kernels)
    kernel = KERNELS[name]
    formats: dict[str, str] = {}
    densities: dict[str, float] = {}
    for op, idx in kernel.operands.items():
        if op in kernel.sparse or d.boolean(0.2):
            formats[op] = draw_format(d, len(idx), operand=True)
            densities[op] = d.choice(DENSITIES)
    out, out_idx = kernel.output
    if kernel.sparse_output and d.boolean(kernel.sparse_output):
        formats[out] = draw_format(d, len(out_idx))
    sizes = LARGE_EXTENTS if d.boolean(0.1) else EXTENTS
    extents = {v: d.choice(sizes) for v in kernel.variables}
    for op, text in formats.items():
        letters, _, modes = text.partition(":")
        if letters.endswith("F"):  # a width up to the extent of the mode it stores
            last = kernel.operands[op][int(modes.split(",")[-1])]
            formats[op] = f"{letters}{d.integer(1, extents[last])}:{modes}"
    target = d.choice(targets)
    seed = d.integer(0, 2**16)
    schedule, races = draw_schedule(d, kernel, formats, extents)
    return Case(name, formats, schedule, target, extents, densities, seed, races)


def draw_format(d: Draw, order: int, operand: bool = False) -> str:
    """An alias, or level letters (U, C, and S below C or S) with a mode ordering; an
    operand's last level may be fixed-width (``F``, its width drawn with the extents)."""
    if ALIASES[order] and d.boolean(0.4):
        return d.choice(ALIASES[order])
    letters = ""
    for lvl in range(order):
        kinds = "CUS" if lvl and letters[-1] in "CS" else "CU"
        letters += d.choice(kinds)
    if operand and d.boolean(FIXED_WIDTH):
        letters = letters[:-1] + "F"
    modes = permutation(d, list(range(order)))
    return f"{letters}:{','.join(map(str, modes))}"


def fit_width(a: np.ndarray, text: str) -> np.ndarray:
    """``a`` with each segment of a last, fixed-width level cut to its first w nonzeros."""
    import ucf

    fmt = ucf.parse_format(text, order=a.ndim)
    width = getattr(fmt.levels[-1], "width", 0) if fmt.levels else 0
    if not width:
        return a
    t = np.transpose(a, fmt.mode_order).copy()
    rows = t.reshape(-1, t.shape[-1])
    rows[np.cumsum(rows != 0, axis=1) > width] = 0
    return np.ascontiguousarray(np.transpose(t, np.argsort(fmt.mode_order)))


def permutation(d: Draw, items: list) -> list:
    rest = list(items)
    out = []
    while rest:
        out.append(rest.pop(d.integer(0, len(rest) - 1)))
    return out


class _Loops:
    """The loop variables as the schedule so far leaves them, with their origins."""

    def __init__(self, order: list[str]):
        self.loops = list(order)
        self.parents: dict[str, tuple[str, tuple[str, ...]]] = {}  # derived -> (kind, parents)
        self.used = set(order)

    def origins(self, v: str) -> list[str]:
        if v not in self.parents:
            return [v]
        out: list[str] = []
        for p in self.parents[v][1]:
            out += [o for o in self.origins(p) if o not in out]
        return out

    def kind(self, v: str) -> str:
        return self.parents[v][0] if v in self.parents else ""

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def replace(self, old: list[str], new: dict[str, str]) -> None:
        """Put the loops ``new`` (name -> how it derives from ``old``) in place of ``old``."""
        at = self.loops.index(old[0])
        self.loops[at : at + len(old)] = list(new)
        for v, kind in new.items():
            self.parents[v] = (kind, tuple(old))


def _levels(kernel: FuzzKernel, formats: dict[str, str]) -> dict[str, list[tuple[str, str]]]:
    """Each sparse tensor's (index variable, level letter) pairs, outer to inner."""
    import ucf

    tensors = dict(kernel.operands)
    tensors[kernel.output[0]] = kernel.output[1]
    levels = {}
    for name, text in formats.items():
        idx = tensors[name]
        fmt = ucf.parse_format(text, order=len(idx))
        if not fmt.is_dense:
            levels[name] = [
                (idx[m], k.letter) for m, k in zip(fmt.mode_order, fmt.levels, strict=True)
            ]
    return levels


def _initial_order(kernel: FuzzKernel, formats: dict[str, str]) -> list[str]:
    """ucf's own default loop order, so commands that need adjacency can be aimed."""
    import ucf
    from ucf.cin.concretize import concretize
    from ucf.lang.parser import parse_statement

    stmt = parse_statement(kernel.expr)
    tensors = dict(kernel.operands)
    fmts = {n: ucf.parse_format(formats.get(n, "dense"), order=len(i)) for n, i in tensors.items()}
    out, idx = kernel.output
    out_fmt = ucf.parse_format(formats.get(out, "dense"), order=len(idx))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an operand no order follows is converted
            return list(concretize(stmt, fmts, out_fmt).order)
    except ucf.UcfError:
        return kernel.variables


def _legal_order(d: Draw, nest: _Loops, levels: dict[str, list[tuple[str, str]]]) -> list[str]:
    """A random order of the current loops that walks every sparse tensor in level order."""
    before = {(a[0], b[0]) for lv in levels.values() for a, b in zip(lv, lv[1:], strict=False)}
    rest = list(nest.loops)
    out = []
    while rest:
        free = [
            v
            for v in rest
            if not any(
                (a, b) in before
                for u in rest
                if u != v
                for a in nest.origins(u)
                for b in nest.origins(v)
            )
        ]
        v = d.choice(free or rest)
        out.append(v)
        rest.remove(v)
    return out


#: How a derived loop relates to its parents, for the loops whose trip count is known.
BOUNDED = ("split-inner", "divide-outer", "bound")


def draw_schedule(
    d: Draw, kernel: FuzzKernel, formats: dict[str, str], extents: dict[str, int]
) -> tuple[str, list[str]]:
    """Schedule text aimed at the loops as each command leaves them, and the units on
    which it asserts IgnoreRaces over a reduction variable.

    Commands are aimed to be legal more often than not (pos at a compressed
    level, unroll of a bounded loop, orders that follow the sparse tensors),
    but every choice can also miss, so refusals are exercised too.
    """
    levels = _levels(kernel, formats)
    nest = _Loops(_initial_order(kernel, formats))
    commands: list[str] = []
    races: set[str] = set()
    precomputes = 0

    def positions(v: str) -> list[str]:
        """Operands with a compressed or singleton level for ``v``'s last origin."""
        origins = nest.origins(v)
        return [
            t
            for t, idx in kernel.operands.items()
            if set(origins) <= set(idx) and t in levels and (origins[-1], "U") not in levels[t]
        ]

    def pos(v: str) -> None:
        owners = positions(v)
        if d.boolean(0.05):
            owners = list(kernel.operands)
        if not owners:
            return
        tensor = d.choice(owners)
        vpos = nest.fresh(f"{v}p")
        nest.replace([v], {vpos: "pos"})
        commands.append(f"pos({v}, {vpos}, {tensor})")

    wanted = d.integer(1, MAX_COMMANDS)

    def parallelize() -> None:
        v = d.choice(nest.loops)
        unit = d.choice(("CPUThread", "CPUVector"))
        strategy = d.choice(STRATEGIES if unit == "CPUThread" else VECTOR_STRATEGIES)
        if strategy == "IgnoreRaces" and set(nest.origins(v)) & kernel.reductions:
            races.add(unit)
        commands.append(f"parallelize({v}, {unit}, {strategy})")

    for _ in range(3 * wanted):  # a draw that fits no loop adds nothing
        if len(commands) >= wanted:
            break
        kind = d.choice(COMMANDS)
        loops = nest.loops
        if kind == "reorder":
            order = _legal_order(d, nest, levels) if d.boolean(0.8) else permutation(d, loops)
            nest.loops = order
            commands.append(f"reorder({', '.join(order)})")
        elif kind in ("split", "divide"):
            v = d.choice(loops)
            factor = d.choice(FACTORS)
            outer, inner = nest.fresh(f"{v}0"), nest.fresh(f"{v}1")
            nest.replace([v], {outer: f"{kind}-outer", inner: f"{kind}-inner"})
            commands.append(f"{kind}({v}, {outer}, {inner}, {factor})")
        elif kind == "fuse" and len(loops) > 1:
            k = d.integer(0, len(loops) - 2)
            i, j = loops[k], loops[k + 1]
            f = nest.fresh("f")
            nest.replace([i, j], {f: "fuse"})
            commands.append(f"fuse({i}, {j}, {f})")
            if d.boolean(0.7):
                pos(f)
        elif kind == "pos":
            candidates = [v for v in loops if nest.kind(v) in ("", "fuse")]
            if candidates:
                pos(d.choice(candidates))
        elif kind == "bound":
            candidates = [v for v in loops if v not in nest.parents]
            if not candidates:
                continue
            v = d.choice(candidates)
            n = extents[v] + 1 if d.boolean(0.1) else extents[v]
            vb = nest.fresh(f"{v}b")
            nest.replace([v], {vb: "bound"})
            commands.append(f"bound({v}, {vb}, {n}, MaxExact)")
        elif kind == "unroll":
            bounded = [v for v in loops if nest.kind(v) in BOUNDED]
            if d.boolean(0.05):
                bounded = loops
            if not bounded:
                continue
            v = d.choice(bounded)
            commands.append(f"unroll({v}, {d.choice((2, 4, 3))})")
        elif kind == "precompute" and precomputes < len(WORKSPACES):
            precomputes += 1
            ops = list(kernel.operands)
            taken = [op for op in ops if d.boolean(0.6)] or ops[:1]
            used = {v for op in taken for v in kernel.operands[op]}
            candidates = [
                v for v in loops if len(nest.origins(v)) == 1 and nest.origins(v)[0] in used
            ]
            if not candidates:
                continue
            v = d.choice(candidates)
            vw = v
            if d.boolean(0.3):
                vw = nest.fresh(f"{v}w")
                nest.replace([v], {vw: "workspace"})
            expr = "*".join(f"{op}({','.join(kernel.operands[op])})" for op in taken)
            ws = WORKSPACES[precomputes - 1]
            commands.append(f"precompute({expr}, {v}, {vw}, {ws})")
        elif kind == "parallelize":
            parallelize()
    # Most parallelize commands come last, where they name loops of the final nest.
    if d.boolean(0.6):
        parallelize()
    return "; ".join(commands), sorted(races)


# --------------------------------------------------------------------------- running


def case_arrays(case: Case) -> dict[str, np.ndarray]:
    """The operands as dense arrays of small nonzero integers: every sum is exact."""
    from tests.helpers import rand_dense, rand_sparse

    rng = np.random.default_rng(case.seed)
    arrays = {}
    for op, idx in KERNELS[case.kernel].operands.items():
        shape = tuple(case.extents[v] for v in idx)
        if op in case.densities:
            a = rand_sparse(rng, shape, case.densities[op], empty_rows=0)
            arrays[op] = fit_width(a, case.formats[op])
        else:
            arrays[op] = rand_dense(rng, shape)
    return arrays


def reference(kernel: FuzzKernel, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The sum of the kernel's products, by np.einsum on dense copies."""
    out = kernel.output[1]
    total = None
    for term in kernel.terms:
        spec = ",".join(kernel.operands[op] for op in term) + "->" + out
        part = np.einsum(spec, *(arrays[op] for op in term), optimize=True)
        total = part if total is None else total + part
    return total


@dataclass
class Outcome:
    status: str  # ok, refused, racy | wrong, error, crash, hang
    detail: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in FAILURES


FAILURES = ("wrong", "error", "crash", "hang")


def run_case(case: Case) -> Outcome:
    """Compile and run one case in this process, and judge the result."""
    import ucf

    kernel = KERNELS[case.kernel]
    arrays = case_arrays(case)
    want = reference(kernel, arrays)
    if "CPUThread" in case.races:
        ucf.set_num_threads(1)
    try:
        k = ucf.compile(
            kernel.expr, formats=case.formats, schedule=case.schedule, target=case.target
        )
        ops = {
            n: ucf.from_numpy(a, format=case.formats[n]) if n in case.formats else a
            for n, a in arrays.items()
        }
        got = k(**ops)
        into = None
        if isinstance(got, np.ndarray) and got.ndim:
            # into a given output full of NaN: the kernel, or the call, must clear every
            # element it does not compute (ucf.lower.zeroing decides which of the two)
            into = np.full(got.shape, np.nan, got.dtype)
            k(**ops, out=into)
    except ucf.CompileError as e:
        return Outcome("error", f"CompileError: {e}")
    except ucf.UcfError as e:
        return Outcome("refused", f"{type(e).__name__}: {e}")
    except Exception:
        return Outcome("error", traceback.format_exc())
    finally:
        if "CPUThread" in case.races:
            ucf.set_num_threads(THREADS)
    if isinstance(got, ucf.Tensor):
        try:
            got.validate()  # a sparse output's pos/crd must be well formed, not just sum right
        except ucf.FormatError as e:
            return Outcome("wrong", f"the output's storage is malformed: {e}")
        got = got.to_numpy()
    got = np.asarray(got)
    status = "racy" if "CPUVector" in case.races else "wrong"
    if got.shape != want.shape or not np.allclose(got, want):
        return Outcome(status, f"got {got.tolist()}\nwant {want.tolist()}")
    if into is not None and not np.allclose(into, want):
        return Outcome(status, f"into out= full of NaN: got {into.tolist()}\nwant {want.tolist()}")
    return Outcome("ok")


THREADS = int(os.environ.get("OMP_NUM_THREADS", "2"))


def repro(case: Case, outcome: Outcome | None = None) -> str:
    """A standalone script that runs the case (data inline) and checks it against numpy."""
    kernel = KERNELS[case.kernel]
    arrays = case_arrays(case)
    lines = [f"# {case.kernel} on target {case.target}, data seed {case.seed}"]
    if outcome is not None:
        lines += [f"# outcome: {outcome.status}"]
        lines += [f"#   {line}" for line in outcome.detail.strip().splitlines()[-12:]]
    lines += ["import numpy as np", "", "import ucf", ""]
    if "CPUThread" in case.races:
        lines.append("ucf.set_num_threads(1)  # the schedule asserts IgnoreRaces over a reduction")
    lines.append("arrays = {")
    lines += [f"    {n!r}: np.array({a.tolist()!r})," for n, a in arrays.items()]
    lines += [
        "}",
        f"formats = {case.formats!r}",
        f"k = ucf.compile({kernel.expr!r}, formats=formats, schedule={case.schedule!r}, "
        f"target={case.target!r})",
        "ops = {n: ucf.from_numpy(a, format=formats[n]) if n in formats else a "
        "for n, a in arrays.items()}",
        "got = k(**ops).to_numpy()",
    ]
    out = kernel.output[1]
    parts = []
    for term in kernel.terms:
        spec = ",".join(kernel.operands[op] for op in term) + "->" + out
        parts.append(f"np.einsum({spec!r}, {', '.join(f'arrays[{op!r}]' for op in term)})")
    lines += [f"want = {' + '.join(parts)}", "assert np.allclose(got, want), (got, want)", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- workers


class _Worker:
    """One long-lived subprocess that runs cases sent as JSON lines."""

    def __init__(self, env: dict[str, str]):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
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
        self.case: Case | None = None

    def send(self, request: dict, case: Case | None, timeout: float) -> None:
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

    def run(self, case: Case) -> Outcome:
        return next(self.map([case]))[1]

    def probe(self, request: dict, timeout: float) -> Outcome:
        """Send a raw request (the machinery's own tests use ``crash`` and ``sleep``)."""
        w = self._worker()
        w.send(request, None, timeout)
        outcome = self._wait({w.proc.stdout.fileno(): w})[1]
        self._release(w, outcome)
        return outcome

    def map(self, cases: Iterable[Case]) -> Iterator[tuple[Case, Outcome]]:
        """Run cases on up to ``size`` workers; yield (case, outcome) as they finish."""
        pending = iter(cases)
        busy: dict[int, _Worker] = {}
        while True:
            while len(busy) < self.size:
                case = next(pending, None)
                if case is None:
                    break
                w = self._worker()
                w.send({"case": asdict(case)}, case, self.timeout)
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
        outcome = run_case(Case(**request["case"])) if "case" in request else Outcome("ok")
        proto.write(json.dumps({"status": outcome.status, "detail": outcome.detail}) + "\n")
        proto.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    serve()
