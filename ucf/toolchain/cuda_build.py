"""Building and running CUDA source text: as C++ for the CPU emulator, or with nvcc.

Generated CUDA has to be checked on machines without a GPU. The same ``.cu``
text therefore builds two ways: ``build_emulated`` compiles it as C++ against
``runtime/ucf_cuda_emu.h`` into a shared library whose ``extern "C"``
launchers run every GPU thread as a fiber on the CPU, and ``nvcc_check``
proves that nvcc accepts it for a real architecture. ``build_device`` makes a
shared library for a real GPU, whose launchers take device pointers.

The compilers can be overridden, as ``UCF_CC`` does for target ``c``:
``UCF_CXX`` (default ``g++``) for emulation and ``UCF_NVCC`` for nvcc.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ucf.errors import CompileError, UcfError
from ucf.resources import runtime_dir
from ucf.toolchain import cache
from ucf.toolchain.cc import version

#: C++20 for the emulator (std::atomic_ref, std::bit_cast, __VA_OPT__); -x c++
#: because the source is a .cu file.
EMULATION_FLAGS = ("-std=c++20", "-O2", "-fPIC", "-shared", "-pthread", "-DUCF_CUDA_EMULATION")

#: What generated device code may assume of nvcc.
NVCC_FLAGS = ("-std=c++17",)


def emulation_compiler() -> list[str]:
    cxx = shlex.split(os.environ.get("UCF_CXX", "g++"))
    if shutil.which(cxx[0]) is None:
        raise CompileError(
            f"CUDA emulation needs a C++20 compiler, and '{cxx[0]}' was not found (set UCF_CXX)"
        )
    return cxx


def nvcc_path() -> str | None:
    """nvcc from ``UCF_NVCC``, the PATH, ``$CUDA_HOME/bin`` or /usr/local/cuda; None if absent."""
    env = os.environ.get("UCF_NVCC")
    if env:
        return shutil.which(env)
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
            return str(Path(home) / "bin" / "nvcc")
    return None


def _nvcc() -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompileError("nvcc was not found (set UCF_NVCC, CUDA_HOME or PATH)")
    return nvcc


def _compile(source: str, command: list[str], output: str) -> bytes:
    """Run ``command`` (which ends before ``-o``) on ``source`` in a scratch directory.

    Returns the bytes of ``output``; a nonzero exit raises CompileError with the
    compiler's stderr, so the user sees what was rejected and where.
    """
    with tempfile.TemporaryDirectory(prefix="ucf-cuda-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        out = Path(tmp) / output
        cmd = [*command, f"-I{runtime_dir()}", "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise CompileError(f"{shlex.join(cmd)} failed:\n{proc.stderr.strip()}")
        return out.read_bytes()


def emulation_identity() -> dict[str, object]:
    """What decides the bytes ``build_emulated`` produces, for the cache key."""
    cxx = emulation_compiler()
    return {"cxx": cxx, "cxx_version": version(cxx[0]), "flags": list(EMULATION_FLAGS)}


def build_emulated(source: str) -> bytes:
    """Compile CUDA ``source`` for the CPU emulator; the shared library's bytes.

    An intrinsic the emulator lacks is a compile error here, never a silent
    difference at run time.
    """
    cmd = [*emulation_compiler(), *EMULATION_FLAGS, "-x", "c++"]
    pch = _precompiled()
    if pch is None:
        return _compile(source, cmd, "kernel.so")
    try:  # found before runtime_dir(), so its .gch is used
        return _compile(source, [*cmd, f"-I{pch}"], "kernel.so")
    except CompileError:
        built = _compile(source, cmd, "kernel.so")  # the source's own error raises here
        shutil.rmtree(pch, ignore_errors=True)  # a damaged precompiled header: built anew
        return built


def _precompiled() -> Path | None:
    """A directory with the runtime headers and ``ucf_cuda.cuh`` precompiled for the
    emulator's compiler and flags, built once per cache: parsing the emulation header
    is half of every emulated kernel's compile. None when it cannot be built; the
    compiler also ignores a precompiled header that does not fit and reads the text,
    so this only ever saves time."""
    headers = sorted([*runtime_dir().glob("*.h"), *runtime_dir().glob("*.cuh")])
    ident = {
        **emulation_identity(),
        "headers": {h.name: h.read_text() for h in headers},
    }
    name = f"pch-{cache.key(ident)}"
    where = cache.cache_dir() / name
    gch = where / "ucf_cuda.cuh.gch"
    if gch.exists():
        return where
    with cache.lock(name):
        if gch.exists():
            return where
        where.mkdir(exist_ok=True)
        for h in headers:
            shutil.copyfile(h, where / h.name)
        flags = [f for f in EMULATION_FLAGS if f != "-shared"]
        tmp = where / "ucf_cuda.cuh.gch.tmp"
        cmd = [*emulation_compiler(), *flags, "-x", "c++-header", "ucf_cuda.cuh", "-o", tmp.name]
        if subprocess.run(cmd, capture_output=True, cwd=where).returncode != 0:
            return None
        tmp.replace(gch)
    return where


def nvcc_check(source: str, arch: str = "sm_80") -> None:
    """Compile ``source`` with nvcc for ``arch`` and discard the object.

    This is the check that the emulated text is also valid CUDA: the emulator
    accepts C++ that nvcc may reject (and vice versa), so both must pass.
    """
    _compile(source, [_nvcc(), "-c", f"-arch={arch}", *NVCC_FLAGS], "kernel.o")


def build_device(source: str, arch: str = "sm_80") -> bytes:
    """Compile ``source`` with nvcc into a shared library for a real GPU; its bytes.

    Its ``extern "C"`` launchers take device pointers (from pycuda, say) and
    return ``ucf_launch_error()``.
    """
    cmd = [_nvcc(), "-O3", f"-arch={arch}", *NVCC_FLAGS, "-shared", "-Xcompiler", "-fPIC"]
    return _compile(source, cmd, "kernel.so")


# ---------------------------------------------------------------- running kernels
def _ctypes_fn(lib, name: str, params):
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p if p.is_array else ctypes.c_int64 for p in params]
    fn.restype = ctypes.c_int
    return fn


class Emulated:
    """A generated launcher built for the CPU emulator; called with numpy arrays and ints."""

    def __init__(self, lib: ctypes.CDLL, name: str, params):
        self.lib = lib
        self.lib.ucf_emu_message.restype = ctypes.c_char_p
        self.fn = _ctypes_fn(self.lib, name, params)

    def __call__(self, *args) -> None:
        status = self.fn(*[a.ctypes.data if isinstance(a, np.ndarray) else a for a in args])
        if status != 0:
            message = self.lib.ucf_emu_message().decode(errors="replace")
            raise UcfError(f"the emulated CUDA kernel failed (status {status}): {message}")


class Device:
    """A generated launcher on a real GPU, through pycuda (the ``cuda`` extra).

    Nothing is imported or built until the first call, so kernels compile (and
    ``k.source``/``k.save`` work) on machines without pycuda, nvcc or a GPU.
    Each call copies the operands to fresh device memory and the outputs back.
    """

    def __init__(self, source: str, fields: dict, name: str, params):
        self.source, self.fields = source, fields
        self.name, self.params = name, list(params)
        self.fn = None

    def _setup(self) -> None:
        try:
            import pycuda.driver  # noqa: F401
        except ImportError:
            raise UcfError(
                "running target 'cuda' on a GPU needs pycuda (pip install pycuda, or pip install "
                "'.[cuda]' in a ucf checkout); "
                "pass emulate=True (--emulate) to run the generated CUDA on the CPU instead"
            ) from None
        try:
            import pycuda.autoinit as auto
        except Exception as e:  # no driver, no device: pycuda raises its own types
            raise UcfError(
                f"no usable CUDA device ({e}); pass emulate=True (--emulate) to run the "
                "generated CUDA on the CPU instead"
            ) from None
        major, minor = auto.device.compute_capability()
        arch = f"sm_{major}{minor}"
        fields = {**self.fields, "arch": arch, "nvcc": _nvcc(), "nvcc_version": version(_nvcc())}
        self.lib = cache.library(fields, lambda: build_device(self.source, arch))
        self.lib.ucf_cuda_error_string.restype = ctypes.c_char_p
        self.fn = _ctypes_fn(self.lib, self.name, self.params)

    def __call__(self, *args) -> None:
        if self.fn is None:
            self._setup()
        import pycuda.driver as drv

        device = [
            drv.to_device(a if a.size else np.zeros(1, a.dtype))
            if isinstance(a, np.ndarray)
            else None
            for a in args
        ]
        c_args = [int(d) if d is not None else a for a, d in zip(args, device, strict=True)]
        status = self.fn(*c_args)
        if status != 0:
            message = self.lib.ucf_cuda_error_string(status).decode(errors="replace")
            raise UcfError(f"the CUDA kernel failed (status {status}): {message}")
        for p, a, d in zip(self.params, args, device, strict=True):
            if p.output and d is not None and a.size:
                drv.memcpy_dtoh(a, d)


def save_cuda(plan, prefix: Path, name: str) -> tuple[Path, Path]:
    """Write ``prefix.cu`` and ``prefix.h`` with the launcher called ``name`` (and the
    device kernels ``name_k0``, ...), and copy the runtime headers the ``.cu`` needs
    beside them; the paths of the .cu and the .h."""
    from ucf.codegen.cuda import header, named, source
    from ucf.toolchain.export import beside, copy_runtime

    module = named(plan.cuda_module, name)
    title = str(plan.statement)
    h, cu = beside(prefix, ".h"), beside(prefix, ".cu")
    h.write_text(header(module, f"UCF_{name.upper()}_H", title))
    cu.write_text(f'#include "{h.name}"\n' + source(module, title))
    copy_runtime(prefix.parent, ("ucf_cuda.cuh", "ucf_cuda_emu.h"))
    return cu, h
