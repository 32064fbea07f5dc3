"""In-process JIT with llvmlite: LLVM IR text to callable addresses.

The object code MCJIT produces is what the disk cache keeps, so a warm
process with a cache hit skips LLVM's optimizer and code generator entirely.
"""

from __future__ import annotations

import threading
from functools import cache

import llvmlite.binding as llvm

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


class JitLibrary:
    """Owns an execution engine; function addresses stay valid while it lives."""

    def __init__(self, engine: llvm.ExecutionEngine, object_code: bytes):
        self.engine = engine
        self.object_code = object_code

    def address(self, name: str) -> int:
        return self.engine.get_function_address(name)


def _empty_engine() -> llvm.ExecutionEngine:
    mod = llvm.parse_assembly("")
    mod.triple = llvm.get_process_triple()
    # The engine takes ownership of its target machine, so it gets its own.
    return llvm.create_mcjit_compiler(mod, _new_target_machine())


def compile_ir(ir_text: str) -> JitLibrary:
    """Optimize at O3 with vectorization for the host CPU, then JIT."""
    with _lock:
        tm = _target_machine()
        mod = llvm.parse_assembly(ir_text)
        mod.triple = llvm.get_process_triple()
        mod.data_layout = str(tm.target_data)
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_unrolling = False
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        obj = tm.emit_object(mod)
        return load_object(obj)


def load_object(obj: bytes) -> JitLibrary:
    """Link previously emitted object code into a fresh engine (the cache-hit path)."""
    with _lock:
        engine = _empty_engine()
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        return JitLibrary(engine, obj)


def optimized_ir(ir_text: str) -> str:
    """The IR after the O3 pipeline, for people who want to read it."""
    with _lock:
        tm = _target_machine()
        mod = llvm.parse_assembly(ir_text)
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return str(mod)
