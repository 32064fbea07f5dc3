"""Kernels: compile once, then bind ucf.Tensor storage to the ABI and call.

Binding never copies an operand that already has the kernel's format and
dtypes; operands in other formats (or numpy/scipy objects) are packed first.
"""

from __future__ import annotations

import ctypes
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ucf import pipeline
from ucf._version import __version__
from ucf.errors import (
    ConversionWarning,
    OperandError,
    ScheduleError,
    UcfError,
    UnsupportedError,
    boundary,
    warn_user,
)
from ucf.exec import blocked, cache, padded, recycled, stats
from ucf.exec.binding import (
    arguments,
    binding,
    check_mappings,
    check_output,
    refuse_positional,
    same_format,
    unknown_operand,
)
from ucf.exec.export import beside, save_c
from ucf.exec.extents import bound_extents, check_orders, plain_extents
from ucf.exec.jit import apply_num_threads, num_threads, openmp_runtime
from ucf.exec.replay import REMEMBERED, Replay, replayable
from ucf.exec.static import Static, prepare
from ucf.format.format import dense_format
from ucf.format.interop import as_tensor
from ucf.format.quantize import check_sums, held_operand
from ucf.format.tensor import Tensor, trusted
from ucf.format.values import VALUE_DTYPES, check_lossless
from ucf.ir import nodes as ir
from ucf.lang.ast import Statement, accesses
from ucf.pipeline import TARGETS, Plan
from ucf.schedule import Schedule, model

# Kernels already linked into this process, by cache key: einsum() in a loop
# then costs a dictionary lookup, not a trip to the disk cache.
_LOADED: dict[tuple[str, str], _Compiled] = {}


_LOAD_LOCK = threading.Lock()
SMALL = (
    "default: the plan compiled before any call, since this call's work is too small for a "
    "plan of its own to pay for its compile (ucf.schedule.model.REPLAN_WORK)"
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


class _Built(NamedTuple):
    """One plan of a kernel, and why the default model chose it."""

    compiled: _Compiled
    why: tuple[str, ...]
    flat: padded.Flat | None = None  # the call runs on a padded, flattened input


class Kernel:
    """A compiled statement; call it with operands as keyword arguments."""

    @boundary
    def __init__(
        self,
        expr: str,
        formats: dict[str, Any] | None = None,
        schedule: str | Schedule | None = None,
        target: str = "llvm",
        dtype: Any = None,
        index_dtype: Any = "int32",
        emulate: bool = False,
        static: Mapping[str, Any] | None = None,
        blocks: Mapping[str, tuple[str, str, int]] | None = None,
    ):
        """``blocks`` (for ``ucf.exec.dynamic``, whose statement is already split into
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
        formats = {k: str(v) for k, v in (formats or {}).items()}
        self.dtype = pipeline.compute_dtype(expr, formats, dtype)
        try:
            idt = np.dtype(index_dtype)
        except TypeError:
            raise OperandError(f"index dtype {index_dtype!r} is not a dtype") from None
        if idt not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise OperandError(f"index dtype {idt} cannot be used; choose int32 or int64")
        self.index_dtype = idt
        vt = ir.NUMPY_TO_IR[str(self.dtype)]
        it = ir.NUMPY_TO_IR[str(idt)]
        if isinstance(schedule, Schedule):
            schedule = str(schedule)
        self.formats, self.schedule = formats, schedule
        self._warned: set[tuple[str, ...]] = set()
        fields = {
            "statement": "".join(expr.split()),  # whitespace never matters in the grammar
            "formats": sorted(formats.items()),
            "schedule": schedule,
            "dtype": vt,
            "index_dtype": it,
            "target": target,
            "emulate": emulate,
            "version": __version__,
        }
        if target == "llvm":
            from ucf.exec import jit

            fields["llvm"] = jit.identity()
        self._blocks = dict(blocks or {})
        if blocks:
            fields["blocks"] = sorted((k, list(v)) for k, v in self._blocks.items())
        self._statics: dict[str, Static] = {}
        if static:
            self._statics = prepare(static, expr, formats, schedule, self.dtype, idt)
            fields["static"] = sorted((n, s.digest()) for n, s in self._statics.items())
        self._expr, self._vt, self._it, self._fields = expr, vt, it, fields
        # With no schedule the default model picks one per call from the operands'
        # statistics (ucf.schedule.model), and "tuned" takes what ucf.tune stored for
        # the operands' shape class; calls with the same statistics reuse the choice.
        self._tuned = schedule == TUNED
        self._static = self._compile(None if self._tuned else schedule, default=False)
        self._adaptive = (schedule is None or self._tuned) and target != "cuda"
        self._conv = padded.find(expr, formats) if schedule is None and not static else None
        self._choices: dict[tuple, _Built] = {}
        self._local = _PerThread()
        if not self._adaptive:
            self._loaded()

    def _compile(
        self,
        schedule: str | None,
        default: bool,
        why: tuple[str, ...] = (),
        flat: padded.Flat | None = None,
    ) -> _Built:
        """The plan for ``schedule`` (of ``flat``'s statement, if given): from this
        process, from the disk cache, or built now (other processes wait for one build)."""
        expr = self._expr if flat is None else flat.expr
        fields = {**self._fields, "schedule": schedule}
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
                        entry = {"plan": self._build(schedule, default, expr)}
                        cache.store(f"{ck}.plan", fields, entry)
            _LOADED[memo] = _Compiled(entry["plan"], ck, fields, entry.get("object"))
        return _Built(_LOADED[memo], why, flat)

    def _build(self, schedule: str | None, default: bool, expr: str) -> Plan:
        openmp = self.target != "llvm" or openmp_runtime() is not None
        static = {n: s.tensor for n, s in self._statics.items()}
        return pipeline.plan(
            expr,
            self.formats,
            schedule,
            self._vt,
            self._it,
            self.target,
            openmp,
            default,
            static,
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
                    if self.target == "llvm" and c.object is None:
                        c.object = c.library.object_code
                        stored = {"plan": c.plan, "object": c.object}
                        cache.store(f"{c.key}.plan", c.fields, stored)
                    c.functions = functions
        return c

    def _choose(self, given: dict[str, Tensor], extents: dict[str, int]) -> None:
        """Give this thread's call the kernel chosen for these operands: the tuned
        schedule stored for their shape class, else the default model's."""
        threads = num_threads()
        st = stats.measure(given, extents)
        key = st.key(threads)
        built = self._choices.get(key)
        if built is None:
            built = self._tuned_kernel(st) if self._tuned else None
            built = built or self._default_kernel(st, threads)
            self._choices[key] = built
        self._local.built = built

    def _tuned_kernel(self, st: stats.Stats) -> _Built | None:
        from ucf.exec import tuned

        shape = tuned.shape_class(st.extents, st.nnz)
        key = tuned.make_key(
            self._expr, self.formats, self.dtype, self.index_dtype, self.target, shape
        )
        text = tuned.lookup(key)
        if text is None:
            return None
        why = f"tuned: the schedule ucf.tune stored for shape class {shape}: {text}"
        try:
            return self._compile(text, default=False, why=(why,))
        except UcfError as e:  # stored by another ucf version, say: advice, never a failure
            warn_user(
                f"ucf: the tuned schedule '{text}' no longer compiles ({e}); using the default",
                UserWarning,
            )
            return None

    def _default_kernel(self, st: stats.Stats, threads: int) -> _Built:
        static = self._static.compiled.plan
        split = st
        if static.blocking is not None:
            split = replace(st, extents=static.blocking.split_extents(st.extents))
        if not model.pays(static.cin, split):
            return _Built(self._static.compiled, (SMALL,))
        flat = self._conv.at(st.extents) if self._conv and static.blocking is None else None
        if flat is not None:
            fst = replace(st, extents=flat.extents(st.extents))
            for choice in pipeline.proposals(flat.expr, self.formats, fst, threads):
                try:
                    return self._compile(choice.text, True, (flat.why, *choice.why), flat)
                except (ScheduleError, UnsupportedError):
                    continue
        for choice in pipeline.proposals(self._expr, self.formats, split, threads, self._blocks):
            try:
                return self._compile(choice.text, default=True, why=tuple(choice.why))
            except (ScheduleError, UnsupportedError):
                continue
        return self._static

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
            from ucf.exec import cuda_build

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
            from ucf.exec import jit

            if entry is not None and "object" in entry:
                library = jit.load_object(entry["object"])
            else:
                library = jit.compile_ir(plan.llvm_ir)
            addrs = {f.name: library.address(f.name) for f in names}
            return {f.name: _cfunc(f, addrs[f.name]) for f in names}, library
        from ucf.exec import cc

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

    # ------------------------------------------------------------ inspection
    @property
    def cin(self) -> str:
        """The kernel's loop nest and every decision made for it: with no schedule
        given, those of the kernel the last call in this thread ran."""
        return "\n".join([str(self._plan.cin), *(f"  # {w}" for w in self._built.why)])

    @property
    def source(self) -> str:
        if self.target == "cuda":
            return self._plan.cuda_source
        return self._plan.llvm_ir if self.target == "llvm" else self._plan.c_source

    @property
    def c_source(self) -> str:
        return self._plan.c_source

    @property
    def asm(self) -> str:
        """The host machine code of the kernel, as assembly: what the JIT runs (llvm),
        or what the C compiler emits with the kernel's flags (c). Reading it shows
        whether a loop vectorized, or used an instruction such as AVX-512 VNNI's."""
        if self.target == "llvm":
            from ucf.exec import jit

            return jit.assembly(self._plan.llvm_ir)
        if self.target == "c":
            from ucf.exec import cc

            return cc.assembly(self._plan.c_source)
        raise UcfError("target cuda has no host assembly; read k.source (nvcc compiles it)")

    @property
    def llir(self) -> list[ir.Function]:
        return [f for f in (self._plan.assemble, self._plan.compute) if f is not None]

    @property
    def statement(self) -> Statement:
        return self._user_plan.statement

    @property
    def _user_plan(self) -> Plan:
        """The plan of the user's statement: the last call's, unless that ran a
        flattened convolution (``ucf.exec.padded``), whose operands differ."""
        return self._plan if self._built.flat is None else self._static.compiled.plan

    @boundary
    def save(
        self,
        prefix: str | Path,
        name: str | None = None,
        lib: str | None = None,
        abi: str = "ucf",
    ) -> tuple[Path, ...]:
        """Write ``prefix.c`` and ``prefix.h``, and copy ``ucf.h`` beside them:
        standalone, the header documents the ABI (docs/abi.md). Returns the
        paths of the .c and .h files (and of the library, with ``lib``).

        The exported functions are called ``name``, ``name_assemble`` and
        ``name_check`` (``name`` defaults to the prefix's file name made a C
        identifier), so several kernels link into one program. ``lib`` "static"
        or "shared" also builds ``libNAME.a`` or ``libNAME.so`` beside them with
        the system C compiler (``UCF_CC``). ``abi="taco"`` writes the kernel
        behind TACO's ``compute``/``assemble`` on ``taco_tensor_t`` instead.
        Target cuda writes ``prefix.cu`` instead of ``prefix.c``, and copies the
        runtime headers it includes next to it."""
        prefix = Path(prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        name = export_name(name or beside(prefix, "").name)
        if self.target == "cuda":
            from ucf.exec.cuda_build import save_cuda

            if abi != "ucf" or lib is not None:
                raise UcfError("target cuda exports .cu source only: no abi='taco' and no lib")
            return save_cuda(self._plan, prefix, name)
        return save_c(self._user_plan, prefix, name, abi, lib)

    # --------------------------------------------------------------- calling
    @boundary
    def __call__(
        self,
        *positional: Any,
        out: Any = None,
        shapes: Mapping[str, Any] | None = None,
        masks: Mapping[str, Any] | None = None,
        **operands: Any,
    ) -> Tensor:
        local = self._local
        if local.built is not None and local.built.flat is not None:
            local.built = None  # the user's statement binds the operands; _choose comes back
        if local.replays and shapes is None and masks is None and not positional:
            threads = num_threads()
            for replay in local.replays:
                if replay.matches(operands, out, threads):
                    local.built = replay.built
                    apply_num_threads()
                    return replay.run(out)
        refuse_positional(self._plan.statement, positional)
        check_mappings(shapes=shapes, masks=masks)
        if masks:  # only a kernel compiled with dynamic= takes masks (ucf.exec.dynamic)
            raise OperandError(
                f"masks= gives a mask for {next(iter(masks))}, which is not a dynamic operand "
                "of this kernel; compile with dynamic={name: micro-tile shape}"
            )
        plan = self._plan
        stmt = plan.statement
        names = {a.tensor for a in accesses(stmt.rhs)}
        unknown = sorted(set(operands) - names)
        if unknown:
            raise OperandError(unknown_operand(unknown[0], stmt, ("out", "shapes", "masks")))
        missing = sorted(names - set(operands))
        if missing:
            raise OperandError(f"missing operand {missing[0]} for {stmt}")
        given = {n: self._as_operand(operands[n], n) for n in names}
        if out is not None:
            check_output(out, given, stmt.lhs.tensor)
        check_orders(plan.orders, given)
        for n, st in self._statics.items():
            st.check(given[n], self.index_dtype)
        extents = self._extents(given, out, shapes)
        if self._adaptive:
            self._choose(given, extents)
            plan = self._plan
        if plan.blocking is not None:
            result = blocked.run(self._run, plan, given, extents, out, self.dtype)
        elif self._built.flat is not None:
            return self._run_flat(self._built.flat, given, extents, out)
        else:
            result = self._run(given, extents, out)
        call, local.call = local.call, None  # held no longer than this call
        if (
            call is not None
            and shapes is None
            and not self._statics  # each call compares a static operand with the compiled one
            and not plan.integer_sums  # each call bounds the sums by the zero points' values
            and (out is None or isinstance(out, np.ndarray))
            and replayable(operands, call[3], out, result, call[1][call[2]])
        ):
            built = local.built
            new = Replay(operands, out, call[:3], num_threads(), built, result, plan.call_zeroes)
            local.replays = (new, *local.replays[: REMEMBERED - 1])
        return result

    def _run(self, given: dict[str, Tensor], extents: dict[str, int], out: Any) -> Tensor:
        """Convert the operands to the kernel's formats, call it, and finish the output
        (in the split shapes of a blocked statement: see ``ucf.exec.blocked``)."""
        plan = self._plan
        stmt = plan.blocking.statement if plan.blocking else plan.statement
        if plan.cin.diagonals:  # the offsets of repeated variables (ucf.cin.diagonals)
            extents = {**extents, **dict.fromkeys(plan.cin.diagonals, 1)}
        for bound in plan.cin.bounds.values():
            bound.check(extents)
        slots: dict[str, Tensor] = {}
        b = binding(plan)
        for slot, fmt, dense, own, held in b.slots:
            t = given[slot.tensor]
            if slot.format.values is not None and not slot.format.values.plain:
                slots[slot.name] = held_operand(
                    t, slot.format, self.index_dtype, slot.tensor, self._warned
                )
                continue
            held = held or self.dtype
            if (
                own
                and t.vals.dtype == held
                and same_format(t.format.structure, fmt)
                and (dense or t.index_dtype == self.index_dtype)
            ):
                slots[slot.name] = t  # already the kernel's format and dtypes
                continue
            check_lossless(t.vals, held, slot.tensor)
            self._warn_conversion(slot, t, held)
            slots[slot.name] = t.convert(slot.format, index_dtype=self.index_dtype, dtype=held)
        check_sums(plan.integer_sums, extents, slots)
        out_shape = tuple([extents[v] for v in b.out_vars])
        outname = stmt.lhs.tensor
        if b.dense_output:
            result = self._dense_output(out, out_shape)
            fn, args = self._invoke(plan.compute, extents, slots, result)
            if self.target != "cuda":  # replayable: see __call__
                self._local.call = (fn, args, b.out_vals_at, slots)
            return result
        if out is not None or stmt.op == "+=":
            raise OperandError(
                f"output {outname} is sparse ('{plan.output_format}'); '+=' into a given "
                "sparse output is not supported, write the sum as an expression instead"
            )
        counts = np.zeros(plan.computed_format.order, dtype=np.int64)
        if plan.local_level is None:
            self._invoke(plan.assemble, extents, slots, None, counts=counts)
            result = self._allocate_sparse(out_shape, counts)
        else:
            # The assemble pass turns its per-segment counts into the level's pos.
            counted = self._allocate_sparse(out_shape, counts)
            self._invoke(plan.assemble, extents, slots, counted, counts=counts)
            pos = counted.levels[plan.local_level]["pos"]
            result = self._allocate_sparse(out_shape, counts)
            result.levels[plan.local_level]["pos"] = pos
        self._invoke(plan.compute, extents, slots, result, counts=counts)
        result = _trimmed(result)
        if plan.output_format != plan.computed_format:
            result = result.convert(plan.output_format)
        return result

    def _run_flat(
        self, flat: padded.Flat, given: dict[str, Tensor], extents: dict[str, int], out: Any
    ) -> Tensor:
        """The call on the padded, flattened input (``ucf.exec.padded``), cropped into
        the user's output. Never replayed: the padded copy must be made each call."""
        name = flat.conv.inp
        x = given[name]
        check_lossless(x.vals, self.dtype, name)
        buf = flat.pad(np.asarray(x), self.dtype)
        operands = {
            **given,
            name: trusted(buf.shape, dense_format(buf.ndim), [{}] * buf.ndim, buf.reshape(-1)),
        }
        computed = self._run(operands, flat.extents(extents), None)
        self._local.call = None
        shape = tuple(extents[i.single_variable] for i in flat.conv.stmt.lhs.indices)
        result = self._dense_output(out, shape, self._static.compiled.plan)
        result.vals.reshape(shape)[...] = flat.crop(computed.vals, computed.shape, extents)
        return result

    def _warn_conversion(self, slot: Any, t: Tensor, held: np.dtype) -> None:
        """Say once per kernel that an operand is converted on every call (no loop
        order follows its format, or its format or index dtype differs from the
        kernel's), or rounded (a narrower value dtype)."""
        name, fmt = slot.tensor, slot.format
        reasons, fixes = [], []
        convert = (
            f"convert it once beforehand, e.g. with ucf.from_numpy(..., format='{fmt.name}') "
            f"or .convert('{fmt.name}')"
        )
        if slot.name != slot.tensor:
            reasons.append(f"is read as '{fmt.name}', since no loop order follows its format")
            fixes.append(convert)
        elif t.format.structure != fmt.structure:
            reasons.append(f"is stored as '{t.format.name}' but the kernel reads '{fmt.name}'")
            fixes.append(convert)
        elif not fmt.is_dense and t.index_dtype != self.index_dtype:
            reasons.append(f"has {t.index_dtype} indices but the kernel reads {self.index_dtype}")
            fixes.append(
                f"compile with index_dtype='{t.index_dtype}' to read them in place, or convert "
                f"once with .convert(index_dtype='{self.index_dtype}')"
            )
        if not np.can_cast(t.dtype, held, "safe"):
            reasons.append(f"has {t.dtype} values, rounded to the {held} the kernel reads")
            fixes.append(f"pass {held} values, or compile with dtype='{t.dtype}'")
        key = (name, *reasons)
        if reasons and key not in self._warned:
            self._warned.add(key)
            warn_user(
                f"ucf: operand {name} {' and '.join(reasons)}; it is converted on every "
                f"call (to avoid the cost: {'; '.join(fixes)})",
                ConversionWarning,
            )

    def _as_operand(self, value: Any, name: str) -> Tensor:
        """Wrap a ready numpy array without validation: dense storage has no invariants.
        A Tensor is taken as it is (``as_tensor`` would return it unchanged, slower). An
        array of another value dtype than the kernel's (uint8 activations of an int32
        kernel) is wrapped so too: ``as_tensor`` would keep its dtype as well."""
        if isinstance(value, Tensor):
            return value
        if (
            isinstance(value, np.ndarray)
            and (value.dtype == self.dtype or value.dtype in VALUE_DTYPES)
            and value.flags.c_contiguous
            and value.ndim > 0
        ):
            shape = value.shape
            vals = value if len(shape) == 1 else value.reshape(-1)
            return trusted(shape, dense_format(len(shape)), [{} for _ in shape], vals)
        return as_tensor(value, name=name)

    def _extents(self, given: dict[str, Tensor], out: Any, shapes: Mapping[str, Any] | None):
        plan = self._plan
        if shapes is None:
            found = plain_extents(binding(plan), given, out)
            if found is not None:
                return found
        return bound_extents(plan.statement, plan.variables, given, out, shapes)

    def _dense_output(self, out: Any, shape: tuple[int, ...], plan: Plan | None = None) -> Tensor:
        plan = plan or self._plan
        fmt = plan.computed_format
        size = math.prod(shape)
        if out is None:
            if plan.statement.op == "+=":
                raise OperandError(f"'+=' needs the output: pass out= for {plan.statement.lhs}")
            # a scalar's empty shape has size 1
            if plan.call_zeroes:
                vals = np.zeros(size, dtype=self.dtype)
            else:
                vals = recycled.uninitialized((size,), self.dtype)
            return trusted(shape, fmt, [{} for _ in shape], vals)
        if isinstance(out, Tensor):
            t = out
        else:
            arr = np.asarray(out)
            if (
                arr.dtype != self.dtype
                or not arr.flags.c_contiguous
                or not same_format(fmt.structure, dense_format(arr.ndim))
            ):
                raise OperandError(
                    f"out must be a C-contiguous {self.dtype} numpy array (or a ucf.Tensor in "
                    f"format '{fmt}'), got {arr.dtype}"
                )
            t = trusted(shape, fmt, [{} for _ in shape], arr.reshape(-1))
        if not same_format(t.format.structure, fmt.structure) or t.dtype != self.dtype:
            raise OperandError(f"out must have format '{fmt}' and dtype {self.dtype}")
        if plan.call_zeroes:
            t.vals[:] = 0
        return t

    def _allocate_sparse(self, shape: tuple[int, ...], counts: np.ndarray) -> Tensor:
        fmt = self._plan.computed_format
        levels = []
        parent = 1
        top = np.iinfo(self.index_dtype).max
        for lvl, kind in enumerate(fmt.levels):
            dim = shape[fmt.mode_order[lvl]]
            count = int(counts[lvl])
            if not 0 <= count <= top:  # the assemble pass counted past its index type
                raise OperandError(
                    f"output {self._plan.statement.lhs.tensor} has more entries at level "
                    f"{lvl} than {self.index_dtype} positions hold (at least {top}); compile "
                    "with index_dtype='int64'"
                )
            arrays, parent = kind.allocate(parent, count, dim, self.index_dtype)
            levels.append(arrays)
        return Tensor(
            shape,
            fmt,
            levels,
            np.zeros(parent, dtype=self.dtype),
            index_dtype=self.index_dtype,
            check=False,
        )

    def _invoke(
        self,
        fn: ir.Function,
        extents: dict[str, int],
        slots: dict[str, Tensor],
        output: Tensor | None,
        counts: np.ndarray | None = None,
    ) -> tuple[Any, list[Any]]:
        """Call ``fn``; the callable and the arguments it got."""
        tensors = dict(slots)
        if output is not None:
            tensors[self._plan.statement.lhs.tensor] = output
        specs = binding(self._plan).params[fn.name]
        cpu = self.target != "cuda"
        args = arguments(specs, extents, tensors, counts, addresses=cpu)
        if cpu:
            apply_num_threads()
        call = self._functions[fn.name]
        call(*args)
        return call, args


class _PerThread(threading.local):
    """A kernel's state per calling thread: the plan its last call ran, and what calls
    with the operands of one of the last few replay (``ucf.exec.replay``), newest first."""

    built: _Built | None = None
    replays: tuple[Replay, ...] = ()
    call: tuple | None = None  # the last dense call: function, arguments, output at, slots


def _cfunc(fn: ir.Function, address: int):
    types = [ctypes.c_void_p if p.is_array else ctypes.c_int64 for p in fn.params]
    return ctypes.CFUNCTYPE(None, *types)(address)


def _trimmed(t: Tensor) -> Tensor:
    """The output with its arrays cut to the sizes the compute pass finished with:
    dropping entries whose segments below stayed empty leaves room at the ends."""
    levels, count = [], 1
    for kind, arrays, m in zip(t.format.levels, t.levels, t.format.mode_order, strict=True):
        arrays = kind.trimmed(arrays, count)
        count = kind.size(arrays, count, t.shape[m])
        levels.append(arrays)
    return Tensor(t.shape, t.format, levels, t.vals[:count], index_dtype=t.index_dtype, check=False)


def export_name(text: str) -> str:
    """``text`` as a C identifier for exported functions: other characters become
    ``_``, and a leading digit gets a ``k`` in front."""
    ident = re.sub(r"\W", "_", text, flags=re.ASCII) or "kernel"
    return "k" + ident if ident[0].isdigit() else ident
