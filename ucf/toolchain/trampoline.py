"""Calling a compiled function with its arguments packed in one array.

ctypes converts a foreign call's arguments one by one, about 0.2 µs each, so a
kernel with fifteen parameters spends more in the call than a tiny kernel's
run. A call that repeats (``ucf.exec.replay``) can keep its arguments in a C
array instead and go through a trampoline: a two-argument function that loads
them and calls the kernel with the kernel's own signature. One trampoline serves
every function of a signature (which parameters are pointers, in order); each is
JIT-compiled once per process.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

_TRAMPOLINE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_made: dict[tuple[bool, ...], tuple[Any, Any]] = {}  # signature -> (library, trampoline)
_lock = threading.Lock()


def _ir(signature: tuple[bool, ...]) -> str:
    """``void trampoline(void (*f)(...), int64_t *args)``: ``f(args[0], args[1], ...)``,
    each argument read as a pointer or an int64 as ``signature`` says."""
    from llvmlite import ir as ll

    i8p, i64 = ll.IntType(8).as_pointer(), ll.IntType(64)
    module = ll.Module()
    fn = ll.Function(module, ll.FunctionType(ll.VoidType(), [i8p, i64.as_pointer()]), "trampoline")
    b = ll.IRBuilder(fn.append_basic_block())
    target = ll.FunctionType(ll.VoidType(), [i8p if p else i64 for p in signature])
    callee = b.bitcast(fn.args[0], target.as_pointer())
    values = []
    for k, pointer in enumerate(signature):
        value = b.load(b.gep(fn.args[1], [ll.Constant(i64, k)], inbounds=True))
        values.append(b.inttoptr(value, i8p) if pointer else value)
    b.call(callee, values)
    b.ret_void()
    return str(module)


def trampoline(signature: tuple[bool, ...]) -> Any:
    """The trampoline for functions whose parameters are pointers where ``signature``
    is true and int64 elsewhere: call it with the function's address and the address
    of the int64 arguments."""
    found = _made.get(signature)
    if found is None:
        from ucf.toolchain import jit

        with _lock:
            found = _made.get(signature)
            if found is None:
                library = jit.compile_ir(_ir(signature))
                found = (library, _TRAMPOLINE(library.address("trampoline")))
                _made[signature] = found
    return found[1]


class Packed:
    """One function's arguments in a C array, and what calls it with them:
    ``call(address, args_at)``. Writing ``args[k]`` changes the k-th argument of the
    next call (the caller keeps what the addresses point to alive)."""

    __slots__ = ("call", "address", "args", "args_at", "keep")

    def __init__(self, fn: Any, signature: Sequence[bool], args: Sequence[int]) -> None:
        self.call = trampoline(tuple(signature))
        self.keep = fn  # the function object holds its code's library
        self.address = ctypes.cast(fn, ctypes.c_void_p).value
        self.args = (ctypes.c_int64 * len(args))(*args)
        self.args_at = ctypes.addressof(self.args)
