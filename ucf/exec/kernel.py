"""Kernels: compile once, then bind ucf.Tensor storage to the ABI and call.

Binding never copies an operand that already has the kernel's format and
dtypes; operands in other formats (or numpy/scipy objects) are packed first.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from ucf._version import __version__
from ucf.codegen import TARGETS
from ucf.codegen.kernel_plan import Plan
from ucf.errors import (
    OperandError,
    ScheduleError,
    UcfError,
    UnsupportedError,
    boundary,
    warn_user,
)
from ucf.exec import decisions, padded_conv
from ucf.exec.calling import Calling, cfunc
from ucf.exec.inspection import Inspection
from ucf.exec.replay import FlatReplay, Replay
from ucf.exec.static import Static, prepare
from ucf.format.format import Format, parse_formats
from ucf.format.tensor import Tensor
from ucf.ir import nodes as ir
from ucf.lang.ast import statement_orders
from ucf.schedule import Command, Schedule, cpu_model, stats
from ucf.schedule.candidates import Refused, first_passing
from ucf.schedule.text import as_commands, spelled
from ucf.toolchain import cache
from ucf.toolchain.jit import num_threads, openmp_runtime, team_counter
from ucf.toolchain.team import SOLO, TIMED, LoopStates

# Kernels already linked into this process, by cache key: einsum() in a loop
# then costs a dictionary lookup, not a trip to the disk cache.
_LOADED: dict[tuple[str, str], _Compiled] = {}


_LOAD_LOCK = threading.Lock()
#: What ``k.cin`` adds when a call runs the plan for one thread because the parallel
#: plan's team shrank to one (``Kernel._choose``).
SHRUNK = (
    "default: the plan for one thread for now: on this busy machine the parallel plan's "
    "loops lost to one thread, or the whole parallel plan lost a race against this one, "
    "until they try again (ucf.toolchain.team)"
)
SMALL = (
    "default: the plan compiled before any call, since this call's work is too small for a "
    "plan of its own to pay for its compile (ucf.schedule.cpu_model.REPLAN_WORK)"
)
#: ``schedule=TUNED`` takes the schedule ``ucf.tune`` stored for the operands' shape class.
TUNED = "tuned"


def forget_loaded() -> None:
    """Drop the in-process kernels, so the next compile goes to the disk cache."""
    _LOADED.clear()


@dataclass
class _Compiled:
    """A plan in this process, and its functions once something calls them: loading
    JIT-compiles (or builds the C library), so a plan that is only read for its
    ``cin`` or source, or saved, never pays for it."""

    plan: Plan
    key: str
    fields: dict
    object: bytes | None = None  # the llvm target's object code, from the disk cache
    functions: dict[str, Any] | None = None
    library: Any = None
    teams: LoopStates | None = None  # the llvm target's parallel loops' team states


class _Built(NamedTuple):
    """One plan of a kernel, and why the default model chose it."""

    compiled: _Compiled
    why: tuple[str, ...]
    flat: padded_conv.Flat | None = None  # the call runs on a padded, flattened input
    commands: list[Command] | None = None  # the schedule it was built with


class Kernel(Calling, Inspection):
    """A compiled statement; call it with operands as keyword arguments."""

    @boundary
    def __init__(
        self,
        expr: str,
        formats: dict[str, Any] | None = None,
        schedule: str | Schedule | Sequence[Command] | None = None,
        target: str = "llvm",
        dtype: Any = None,
        index_dtype: Any = "int32",
        emulate: bool = False,
        static: Mapping[str, Any] | None = None,
        blocks: Mapping[str, tuple[str, str, int]] | None = None,
    ):
        """``blocks`` (for ``ucf.stile.dynamic``, whose statement is already split into
        tiles): each place variable of the statement -> (the variable it was split from,
        its block variable, the block size), as ``CIN.blocks``; a call then passes the
        split variables' own extents as ``shapes=``, and the loops over a last, partial
        block stop at them."""
        if target not in TARGETS:
            raise UcfError(f"unknown target '{target}'; choose one of {', '.join(TARGETS)}")
        if emulate and target != "cuda":
            raise UcfError("emulate=True runs CUDA source on the CPU and needs target='cuda'")
        self.target = target
        self.emulate = emulate
        # Formats are parsed here, once: the compiler reads Format objects; the text as
        # given stays for the repr and messages.
        shown = {k: str(v) for k, v in (formats or {}).items()}
        self._formats, self.dtype = _front(expr, formats, shown, dtype)
        try:
            idt = np.dtype(index_dtype)
        except TypeError:
            raise OperandError(f"index dtype {index_dtype!r} is not a dtype") from None
        if idt not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise OperandError(f"index dtype {idt} cannot be used; choose int32 or int64")
        self.index_dtype = idt
        vt = ir.NUMPY_TO_IR[str(self.dtype)]
        it = ir.NUMPY_TO_IR[str(idt)]
        self._tuned = schedule == TUNED
        commands = None if self._tuned else as_commands(schedule)
        self.formats, self.commands = shown, commands
        self.schedule = TUNED if self._tuned else spelled(commands)
        self._warned: set[tuple[str, ...]] = set()
        fields = {
            "statement": "".join(expr.split()),  # whitespace never matters in the grammar
            "formats": sorted((n, str(f)) for n, f in self._formats.items()),
            "schedule": self.schedule,
            "dtype": vt,
            "index_dtype": it,
            "target": target,
            "emulate": emulate,
            "version": __version__,
        }
        if target == "llvm":
            from ucf.toolchain import jit

            fields["llvm"] = jit.identity()
        self._blocks = dict(blocks or {})
        if blocks:
            fields["blocks"] = sorted((k, list(v)) for k, v in self._blocks.items())
        self._statics: dict[str, Static] = {}
        if static:
            self._statics = prepare(static, expr, self._formats, commands, self.dtype, idt)
            fields["static"] = sorted((n, s.digest()) for n, s in self._statics.items())
        self._expr, self._vt, self._it, self._fields = expr, vt, it, fields
        # With no schedule the default model picks one per call from the operands'
        # statistics (ucf.schedule.cpu_model), and "tuned" takes what ucf.tune stored for
        # the operands' shape class; calls with the same statistics reuse the choice.
        self._static = self._compile(commands, default=False)
        self._adaptive = commands is None and target != "cuda"
        self._conv = None
        if schedule is None and not static:
            self._conv = padded_conv.find(self._static.compiled.plan.statement, self._formats)
        self._choices: dict[tuple, _Built] = {}
        # Per plan chosen for several threads: whether the plan for one thread differs
        # from it (then it runs while the plan's team is shrunk to one: see _choose).
        self._solo_differs: dict[int, bool] = {}
        self._local = _PerThread()
        if not self._adaptive:
            self._loaded()

    def _compile(
        self,
        commands: list[Command] | None,
        default: bool,
        why: tuple[str, ...] = (),
        flat: padded_conv.Flat | None = None,
    ) -> _Built:
        """The plan for ``commands`` (of ``flat``'s statement, if given): from this
        process, from the disk cache, or built now (other processes wait for one build)."""
        expr = self._expr if flat is None else flat.expr
        fields = {**self._fields, "schedule": spelled(commands)}
        if flat is not None:
            fields["statement"] = "".join(expr.split())
        if default:
            fields["default"] = True
        ck = cache.key(fields)
        memo = (str(cache.cache_dir()), ck)
        if memo not in _LOADED:
            entry = cache.load(f"{ck}.plan", fields)
            if entry is None:
                with cache.lock(f"{ck}.plan"):  # other processes wait, then load what it built
                    entry = cache.load(f"{ck}.plan", fields)
                    if entry is None:
                        entry = {"plan": self._build(commands, default, expr, flat)}
                        cache.store(f"{ck}.plan", fields, entry)
            _LOADED[memo] = _Compiled(entry["plan"], ck, fields, entry.get("object"))
        return _Built(_LOADED[memo], why, flat, commands)

    def _build(
        self,
        commands: list[Command] | None,
        default: bool,
        expr: str,
        flat: padded_conv.Flat | None = None,
    ) -> Plan:
        from ucf import pipeline

        openmp = self.target != "llvm" or openmp_runtime() is not None
        static = {n: s.tensor for n, s in self._statics.items()}
        formats = self._formats if flat is None else self._conv.formats(self._formats)
        return pipeline.plan(
            expr,
            formats,
            commands,
            self._vt,
            self._it,
            self.target,
            openmp,
            default,
            static,
            self.formats,
            self._blocks,
        )

    def _loaded(self) -> _Compiled:
        """The current plan with its functions loaded; the llvm target's object code
        joins the plan in the disk cache the first time."""
        c = self._built.compiled
        if c.functions is None:
            with _LOAD_LOCK:
                if c.functions is None:
                    entry = {"object": c.object} if c.object is not None else None
                    functions, c.library = self._load(c.plan, c.fields, entry)
                    if self.target == "llvm" and c.plan.cin.parallel:
                        names = [f.name for f in c.plan._functions]
                        address = c.library.engine.get_global_value_address
                        counters = team_counter("lost"), team_counter("fixed")
                        c.teams = LoopStates(address, names, *counters)
                    if self.target == "llvm" and c.object is None:
                        c.object = c.library.object_code
                        stored = {"plan": c.plan, "object": c.object}
                        cache.store(f"{c.key}.plan", c.fields, stored)
                    c.functions = functions
        return c

    def _choose(
        self, given: dict[str, Tensor], extents: dict[str, int], asked: int | None = None
    ) -> None:
        """Give this thread's call the kernel chosen for these operands: the tuned
        schedule stored for their shape class, else the default model's. ``asked``: the
        plan a remembered call already asked the team states for (a second ask would
        count the call twice, and could answer otherwise)."""
        threads = num_threads()
        st = stats.measure(given, extents, self._formats, self.dtype)
        built = self._chosen(st, threads)
        teams = self._watched(built, threads)
        plan = 0 if teams is None else teams.plan() if asked is None else asked
        if plan & SOLO:
            # Its team shrank to one thread, or it lost a race: the plan for one thread
            # runs meanwhile.
            alone = self._chosen(st, 1)
            self._solo_differs[id(built.compiled)] = alone.compiled is not built.compiled
            plan = teams.stepped(plan, built, alone)
            if plan & SOLO and alone.compiled is not built.compiled:
                threads, built = 1, alone._replace(why=(*alone.why, SHRUNK))
        self._local.stats = (st, threads)
        self._local.built = built
        # A raced call is timed from here to its result (``Calling.__call__``).
        self._local.raced = (teams, plan, time.perf_counter_ns()) if plan & TIMED else None

    def _watched(self, built: _Built | None, threads: int) -> LoopStates | None:
        """The team states that decide whether a call of ``built`` at ``threads`` runs
        the plan for one thread instead, or None when it keeps its plan: one thread
        asked for, a kernel with a schedule of its own, the plan compiled before any
        call (it serves every thread count), or a plan for one thread known to be the
        same. A remembered call keeps them (``Replay.teams``)."""
        if threads <= 1 or built is None:
            return None
        compiled = built.compiled
        if compiled is self._static.compiled or not self._solo_differs.get(id(compiled), True):
            return None
        return compiled.teams

    def _chosen(self, st: stats.Stats, threads: int) -> _Built:
        key = st.key(threads)
        built = self._choices.get(key)
        if built is None:
            built = self._tuned_kernel(st) if self._tuned else None
            built = built or self._default_kernel(st, threads)
            self._choices[key] = built
        return built

    def _tuned_kernel(self, st: stats.Stats) -> _Built | None:
        from ucf.exec import tuned

        shape = tuned.shape_class(st.extents, st.nnz)
        key = tuned.make_key(
            self._expr, self._formats, self.dtype, self.index_dtype, self.target, shape
        )
        text = tuned.lookup(key)
        if text is None:
            return None
        why = f"tuned: the schedule ucf.tune stored for shape class {shape}: {text}"
        try:
            return self._compile(as_commands(text), default=False, why=(why,))
        except UcfError as e:  # stored by another ucf version, say: advice, never a failure
            warn_user(
                f"ucf: the tuned schedule '{text}' no longer compiles ({e}); using the default",
                UserWarning,
            )
            return None

    def _default_kernel(self, st: stats.Stats, threads: int) -> _Built:
        """The default model's kernel for a call with statistics ``st``: the choice kept in
        the disk cache for them (``ucf.exec.decisions``), else the model's, then kept."""
        static = self._static.compiled.plan
        split = st
        if static.blocking is not None:
            split = replace(st, extents=static.blocking.split_extents(st.extents))
        if not cpu_model.pays(static.cin, split):
            return _Built(self._static.compiled, (SMALL,))
        flat = self._conv.at(st.extents) if self._conv and static.blocking is None else None
        fields = {**self._fields, "decision": "default", "stats": repr(st.key(threads))}
        hit = decisions.load(fields)
        if hit is not None:
            if hit[0] is None:
                return self._static
            commands, why, flattened = hit[0]
            try:
                return self._compile(commands, True, why, flat if flattened else None)
            except (ScheduleError, UnsupportedError):
                pass
        built = self._model(st, split, flat, threads)
        kept = (built.commands, built.why, built.flat is not None)
        decisions.store(fields, None if built is self._static else kept)
        return built

    def _model(
        self, st: stats.Stats, split: stats.Stats, flat: padded_conv.Flat | None, threads: int
    ) -> _Built:
        """The first of the default model's proposals that compiles (``ucf.pipeline``)."""
        from ucf import pipeline

        refused = Refused()
        if flat is not None:
            fst = replace(st, extents=flat.extents(st.extents))
            built = first_passing(
                pipeline.proposals(flat.expr, self._conv.formats(self._formats), fst, threads),
                lambda c: self._compile(c.commands, True, (flat.why, *refused, *c.why), flat),
                refused,
                shown=_text,
            )
            if built is not None:
                return built
        built = first_passing(
            pipeline.proposals(
                self._expr, self._formats, split, threads, self.formats, self._blocks
            ),
            lambda c: self._compile(c.commands, default=True, why=(*refused, *c.why)),
            refused,
            shown=_text,
        )
        return built or self._static

    @property
    def _built(self) -> _Built:
        return self._local.built or self._static

    @property
    def _plan(self) -> Plan:
        return self._built.compiled.plan

    @property
    def _functions(self) -> dict[str, Any]:
        return self._loaded().functions

    # -------------------------------------------------------------- building
    def _load(self, plan: Plan, fields: dict, entry: dict | None) -> tuple[dict[str, Any], Any]:
        """The plan's callable functions, and the library that keeps them alive."""
        names = [f for f in (plan.assemble, plan.compute) if f is not None]
        if self.target == "cuda":
            from ucf.toolchain import cuda_build

            launch = f"{plan.compute.name}_launch"
            if self.emulate:
                lib = cache.library(
                    {**fields, **cuda_build.emulation_identity()},
                    lambda: cuda_build.build_emulated(plan.cuda_source),
                )
                run = cuda_build.Emulated(lib, launch, plan.compute.params)
            else:
                run = cuda_build.Device(plan.cuda_source, fields, launch, plan.compute.params)
            return {plan.compute.name: run}, None
        if self.target == "llvm":
            from ucf.toolchain import jit

            if entry is not None and "object" in entry:
                library = jit.load_object(entry["object"])
            else:
                library = jit.compile_ir(plan.llvm_ir)
            addrs = {f.name: library.address(f.name) for f in names}
            return {f.name: cfunc(f, addrs[f.name]) for f in names}, library
        from ucf.toolchain import cc

        if plan.cin.parallel:
            openmp_runtime()  # applies UCF_NUM_THREADS to the libgomp the .so links
        library = cache.library({**fields, **cc.identity()}, lambda: cc.build_shared(plan.c_source))
        result = {}
        for f in names:
            fn = getattr(library, f.name)
            fn.argtypes = [ctypes.c_void_p if p.is_array else ctypes.c_int64 for p in f.params]
            fn.restype = None
            result[f.name] = fn
        return result, library


def _front(
    expr: str, formats: Mapping[str, Any] | None, shown: dict[str, str], dtype: Any
) -> tuple[dict[str, Format], np.dtype]:
    """The statement's formats, parsed (``parse_formats``), and its compute type
    (``ucf.pipeline.compute_dtype``). The tensors' orders and the compute type are kept in
    the disk cache (``ucf.exec.decisions``): finding them parses the statement, which a
    kernel in the cache need not do."""
    fields = {
        "decision": "front",
        "statement": "".join(expr.split()),
        "formats": sorted(shown.items()),
        "dtype": None if dtype is None else str(dtype),
        "version": __version__,
    }
    hit = decisions.load(fields)
    if hit is not None:
        orders, dt = hit[0]
        return parse_formats(formats, orders), dt
    from ucf import pipeline
    from ucf.lang.parser import parse_statement

    orders = statement_orders(parse_statement(expr))
    parsed = parse_formats(formats, orders)
    dt = pipeline.compute_dtype(expr, parsed, dtype)
    decisions.store(fields, (orders, dt))
    return parsed, dt


class _PerThread(threading.local):
    """A kernel's state per calling thread: the plan its last call ran, and what calls
    with the operands of one of the last few replay (``ucf.exec.replay``), newest first."""

    built: _Built | None = None
    stats: tuple | None = None  # the last call's operand statistics and thread count
    replays: tuple[Replay | FlatReplay, ...] = ()
    call: tuple | None = None  # the last call: function, arguments, output at, slots, rebuilt
    raced: tuple | None = None  # a raced call's team states, plan and start (ns)


def _text(choice: cpu_model.Choice) -> str:
    return choice.text
