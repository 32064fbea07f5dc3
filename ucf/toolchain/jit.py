"""In-process JIT with llvmlite: LLVM IR text to callable addresses.

The object code MCJIT produces is what the disk cache keeps, so a warm
process with a cache hit skips LLVM's optimizer and code generator entirely.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import threading
import warnings
from collections.abc import Callable
from functools import cache

import llvmlite.binding as llvm

from ucf.toolchain import team

_lock = threading.RLock()


@cache
def _target_machine() -> llvm.TargetMachine:
    """The machine used for optimizing and emitting; never handed to an engine."""
    return _new_target_machine()


def _new_target_machine() -> llvm.TargetMachine:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    features = llvm.get_host_cpu_features().flatten()
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=features, opt=3, reloc="pic", codemodel="jitdefault"
    )


@cache
def identity() -> dict[str, object]:
    """What decides the object code this process emits, for the cache key: it is
    built for the host CPU, so another CPU or LLVM must not reuse it."""
    import llvmlite

    _target_machine()
    return {
        "llvmlite": llvmlite.__version__,
        "triple": llvm.get_process_triple(),
        "cpu": llvm.get_host_cpu_name(),
        "features": llvm.get_host_cpu_features().flatten(),
    }


class JitLibrary:
    """Owns an execution engine; function addresses stay valid while it lives."""

    def __init__(self, engine: llvm.ExecutionEngine, object_code: bytes):
        self.engine = engine
        self.object_code = object_code

    def address(self, name: str) -> int:
        return self.engine.get_function_address(name)


@cache
def openmp_runtime() -> ctypes.CDLL | None:
    """libgomp, loaded so JIT-compiled parallel loops can call it; None when absent.

    The C target's shared objects link the same libgomp, so one
    ``omp_set_num_threads`` governs both targets. It is loaded with a bounded spin
    and the thread count follows the cores this process may use, unless the user
    chose otherwise (``ucf.toolchain.team``); ``ucf_parallel``, which the llvm
    target's parallel loops call, is linked in beside it.
    """
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    setting = team.spin_setting()
    os.environ.update(setting)  # libgomp reads its environment once, as it loads
    try:
        lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        llvm.load_library_permanently(name)
    except (OSError, RuntimeError):
        warnings.warn(
            "ucf: libgomp could not be loaded; parallel loops on the llvm target run serially",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    finally:
        for key in setting:
            os.environ.pop(key, None)
    threads = os.environ.get("UCF_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        _threads["requested"] = int(threads)
    elif "OMP_NUM_THREADS" not in os.environ:
        cores = team.available_cores()
        if cores < int(lib.omp_get_max_threads()):
            _threads["requested"] = cores
    _team_runtime()
    return lib


def _team_runtime() -> JitLibrary:
    """``ucf_parallel`` (``ucf.codegen.llvm_team``) compiled and made the symbol every
    kernel's object code links to: its object code comes from the disk cache after the
    first process, like a kernel's."""
    from ucf.codegen import llvm_team

    library = runtime_module(llvm_team.ENTRY, llvm_team.runtime_ir)
    _RUNTIME.append(library)  # the engine must outlive every kernel that calls into it
    llvm.add_symbol(llvm_team.ENTRY, library.address(llvm_team.ENTRY))
    if os.environ.get("UCF_ADAPTIVE_TEAM", "").strip() == "0":
        fixed = library.engine.get_global_value_address(llvm_team.FIXED)
        ctypes.c_int64.from_address(fixed).value = 1
    return library


_RUNTIME: list[JitLibrary] = []


def runtime_module(label: str, ir_text: Callable[[], str]) -> JitLibrary:
    """A module of ucf's own compiled functions (not a kernel), named ``label`` in the
    disk cache: its object code comes from there after the first process, like a
    kernel's, so only the first process pays LLVM for it. The caller keeps the
    library for as long as it calls into it."""
    from ucf.toolchain import cache

    # the IR's digest in the key: a changed module never links a stale object
    text = ir_text()
    ir = hashlib.sha256(text.encode()).hexdigest()
    fields = {"runtime": label, "llvm": identity(), "ir": ir}
    name = f"{cache.key(fields)}.plan"
    entry = cache.load(name, fields)
    if isinstance(entry, dict) and isinstance(entry.get("object"), bytes):
        return _link(entry["object"])
    library = _link(_emit(text))
    cache.store(name, fields, {"object": library.object_code})
    return library


def set_whole_team(on: bool) -> bool:
    """Run every parallel region on the whole team, as plain OpenMP does, leaving the
    loops' team states as they are (``UCF_ADAPTIVE_TEAM=0`` from the start), or adapt
    again; the setting it replaces. For benchmarks that compare the two in one run,
    and tests that need a plan whatever the machine's load."""
    if openmp_runtime() is None or not _RUNTIME:
        return False
    flag = team_counter("fixed")
    old = bool(flag.value)
    flag.value = int(on)
    return old


def team_counters() -> dict[str, int]:
    """How many parallel regions ``ucf_parallel`` timed in this process, and how many of
    them lost to one thread (its team then shrank): what a benchmark reports beside
    its times."""
    return {label: team_counter(label).value for label in ("timed", "lost")}


def team_counter(label: str) -> ctypes.c_int64:
    """``ucf_parallel``'s process-wide count of regions ``"timed"`` or ``"lost"``, or its
    ``"fixed"`` flag (``set_whole_team``), read in place (a zero of its own where the
    team runtime is not linked): a change of ``"lost"`` is what makes the call path
    look at the loops' states again (``ucf.toolchain.team.LoopStates.plan``)."""
    if openmp_runtime() is None or not _RUNTIME:
        return ctypes.c_int64(0)
    from ucf.codegen import llvm_team

    labels = ("timed", "lost", "fixed")
    symbol = dict(zip(labels, (*llvm_team.COUNTERS, llvm_team.FIXED), strict=True))[label]
    return ctypes.c_int64.from_address(_RUNTIME[0].engine.get_global_value_address(symbol))


# OpenMP keeps its thread count per calling thread, so a count set in one Python thread
# would not reach kernels called from another (a thread pool, Dask's threaded
# scheduler): the count asked for is kept here and applied in each thread that calls.
_threads: dict[str, int] = {}
_applied = threading.local()


def set_num_threads(n: int) -> None:
    """Threads for parallel loops of both targets, in every Python thread that calls a
    kernel (else UCF_NUM_THREADS, else OpenMP's default)."""
    _threads["requested"] = int(n)
    apply_num_threads()


def num_threads() -> int:
    """The threads a parallel loop would get: the count asked for, else OpenMP's
    default; 1 without an OpenMP runtime."""
    lib = openmp_runtime()
    if lib is None:
        return 1
    return _threads.get("requested") or _max_threads(lib)


@cache
def _max_threads(lib: ctypes.CDLL) -> int:
    return int(lib.omp_get_max_threads())


def apply_num_threads() -> None:
    """Give the calling thread the requested thread count, once per change."""
    want = _threads.get("requested")
    lib = openmp_runtime()
    if want is None or lib is None or getattr(_applied, "n", None) == want:
        return
    lib.omp_set_num_threads(want)
    _applied.n = want


def _empty_engine() -> llvm.ExecutionEngine:
    mod = llvm.parse_assembly("")
    mod.triple = llvm.get_process_triple()
    # The engine takes ownership of its target machine, so it gets its own.
    return llvm.create_mcjit_compiler(mod, _new_target_machine())


#: Lines of IR above which a module is optimized at O2 rather than O3. O3's extra
#: passes grow much faster than the module: a kernel co-iterating four blocked operands
#: (54,700 lines, from the statement fuzzer) took 130 s at O3 and 8 s at O2; the
#: kernels of docs/ and bench/ are under 2,000 lines. The arithmetic is the same at
#: either level (no fast-math), so the numeric contract holds.
O3_LINES = 10_000


def _optimized(ir_text: str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    """The module at O3 (O2 past ``O3_LINES``) with vectorization for the host CPU:
    what runs, and what ``optimized_ir`` and ``assembly`` show (call with ``_lock``
    held)."""
    mod = llvm.parse_assembly(ir_text)
    mod.triple = llvm.get_process_triple()
    mod.data_layout = str(tm.target_data)
    mod.verify()
    level = 3 if ir_text.count("\n") <= O3_LINES else 2
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def compile_ir(ir_text: str) -> JitLibrary:
    """Optimize (``_optimized``), then JIT."""
    return load_object(_emit(ir_text))


def _emit(ir_text: str) -> bytes:
    with _lock:
        tm = _target_machine()
        return tm.emit_object(_optimized(ir_text, tm))


def load_object(obj: bytes) -> JitLibrary:
    """Link previously emitted object code into a fresh engine (the cache-hit path)."""
    openmp_runtime()  # resolve the GOMP symbols and ucf_parallel the object may reference
    return _link(obj)


def _link(obj: bytes) -> JitLibrary:
    with _lock:
        engine = _empty_engine()
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        return JitLibrary(engine, obj)


def optimized_ir(ir_text: str) -> str:
    """The IR after the pipeline the JIT runs, for people who want to read it."""
    with _lock:
        return str(_optimized(ir_text, _target_machine()))


def assembly(ir_text: str) -> str:
    """The host machine code the JIT runs, as assembly text."""
    with _lock:
        tm = _target_machine()
        return tm.emit_assembly(_optimized(ir_text, tm))
