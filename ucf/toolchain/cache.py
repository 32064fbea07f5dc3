"""The on-disk cache of compiled kernels, which trusts nothing it reads back.

A cache directory is shared by processes and survives crashes, full disks and
editors, so any entry may be truncated, damaged or another kernel's. Every
entry is one file: a magic line, a JSON header holding the entry's full key
(statement, formats, schedule, dtypes, target, compiler and flags, versions)
and the SHA-256 and size of the payload, then the payload (a pickled plan, or
a shared library's bytes). Reading checks the header's key against the key
asked for and the payload's digest *before* anything is unpickled or
``dlopen``ed; any failure is a ``CacheWarning`` and a recompile, never a crash
or another statement's kernel. A shared library is loaded from a private
copy of the verified bytes, so a file changed afterwards cannot fault the
process.

Writes are atomic (a temporary file renamed into place) and made under a
per-entry file lock (filelock), so concurrent processes build an entry once
and readers never see half of one.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock

from ucf.errors import CacheWarning
from ucf.resources import cache_dir

MAGIC = b"ucf kernel cache entry v1\n"
_MAX_HEADER = 1 << 20


def key(fields: dict[str, Any]) -> str:
    """The file stem of the entry for ``fields`` (its full key, stored in the entry too)."""
    return hashlib.sha256(_canonical(fields)).hexdigest()[:32]


def _canonical(fields: dict[str, Any]) -> bytes:
    from ucf.lower.work import threshold
    from ucf.passes import partial_sums, streams
    from ucf.passes.pairs import available, quad_bytes
    from ucf.passes.tiling import enabled, tile_bytes

    settings = {
        "code": code_version(),
        "work_threshold": threshold(),
        "registers": enabled(),
        "pairs": available(),
        "partial_sums": partial_sums.enabled(),
        "stream_prefetch": streams.enabled(),
        "tile_bytes": tile_bytes("f32"),
        "quad_bytes": quad_bytes(),
    }
    return json.dumps({**settings, **fields}, sort_keys=True).encode()


_CODE: list[str] = []


def code_version() -> str:
    """A digest of the compiler's own sources, grammars and runtime headers.

    Cached plans are pickles of compiler objects, so any change to the code
    (not just a version bump) must miss the cache rather than load a stale plan.
    Hashing every source costs a process some milliseconds before its first cached
    kernel; the digest is kept in the cache directory under a stamp of the files'
    names, sizes and modification times, which takes only a ``stat`` of each
    (an edit changes the time, so the stamp, and the sources are hashed again)."""
    if not _CODE:
        from ucf.resources import grammar_file, runtime_dir

        root = Path(__file__).resolve().parent.parent
        files = sorted(root.rglob("*.py"))
        files += sorted(grammar_file("einsum.lark").parent.glob("*.lark"))
        files += sorted(runtime_dir().glob("*.h*"))
        stats = [(str(f), st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()]]
        stamp = hashlib.sha256(repr(stats).encode()).hexdigest()[:24]
        memo = cache_dir() / f"code-{stamp}"
        try:
            digest = memo.read_text()
        except OSError:
            digest = ""
        if len(digest) != 16 or not all(c in "0123456789abcdef" for c in digest):
            h = hashlib.sha256()
            for f in files:
                h.update(f.read_bytes())
            digest = h.hexdigest()[:16]
            try:
                atomic_write(memo, digest.encode())
            except OSError:
                pass  # a read-only cache: hash again next time
        _CODE.append(digest)
    return _CODE[0]


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def lock(name: str) -> filelock.BaseFileLock:
    """The lock that serializes building and writing the entry ``name``."""
    return filelock.FileLock(str(cache_dir() / f"{name}.lock"))


# ------------------------------------------------------------------ entries
def _pack(fields: dict[str, Any], payload: bytes) -> bytes:
    header = json.dumps(
        {
            "key": json.loads(_canonical(fields)),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "size": len(payload),
        },
        sort_keys=True,
    ).encode()
    return MAGIC + len(header).to_bytes(8, "big") + header + payload


def _unpack(data: bytes, fields: dict[str, Any]) -> bytes:
    """The verified payload of an entry, or ``ValueError`` saying what is wrong."""
    if not data.startswith(MAGIC):
        raise ValueError("is not a ucf cache entry (or its first bytes are damaged)")
    at = len(MAGIC)
    size = int.from_bytes(data[at : at + 8], "big")
    if not 0 < size <= _MAX_HEADER or at + 8 + size > len(data):
        raise ValueError("has a damaged or truncated header")
    try:
        header = json.loads(data[at + 8 : at + 8 + size])
        stored_key, digest, length = header["key"], header["sha256"], header["size"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("has a damaged header") from None
    if stored_key != json.loads(_canonical(fields)):
        raise ValueError("holds another kernel (its key differs)")
    payload = data[at + 8 + size :]
    if len(payload) != length:
        raise ValueError(f"is truncated or padded ({len(payload)} bytes, expected {length})")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ValueError("is damaged (its checksum differs)")
    return payload


def _read(name: str, fields: dict[str, Any]) -> bytes | None:
    """The verified payload of entry ``name``, or None (absent, or damaged: warned, removed)."""
    path = cache_dir() / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        _discard(path, f"cannot be read ({e.strerror})")
        return None
    try:
        payload = _unpack(data, fields)
    except ValueError as e:
        _discard(path, str(e))
        return None
    try:
        os.utime(path)  # recently used: eviction removes the least recently used first
    except OSError:
        pass
    return payload


def _discard(path: Path, reason: str) -> None:
    warnings.warn(f"ucf kernel cache: {path} {reason}; recompiling it", CacheWarning, stacklevel=5)
    try:
        path.unlink()
    except OSError:
        pass  # another process removed or replaced it; the lock orders the rewrite


def _write(name: str, fields: dict[str, Any], payload: bytes) -> None:
    data = _pack(fields, payload)
    try:
        atomic_write(cache_dir() / name, data)
        _account(len(data))
    except OSError:
        pass  # a read-only or full cache must never break compilation


#: Writes between two scans of the cache directory. Scanning stats every entry, so
#: scanning on every write made filling a cache quadratic: a test run that compiles
#: 3000 kernels into one directory spent a quarter of its time in ``stat``.
RESCAN_WRITES = 64
# Per cache directory: the bytes its entries held at the last scan plus what this process
# wrote since, and the writes since. Other processes' writes are seen at the next scan.
_TALLY: dict[Path, list[int]] = {}


def _account(written: int) -> None:
    """Count ``written`` bytes against the size limit; scan and evict when the count
    passes it, or when enough writes have gone by that other processes' may have."""
    where, cap = cache_dir(), limit()
    tally = _TALLY.get(where)
    if tally is None or tally[0] + written > cap or tally[1] + 1 >= RESCAN_WRITES:
        evict(cap)
    else:
        tally[0] += written
        tally[1] += 1


#: The default size limit of the cache directory, in MB (``UCF_CACHE_MAX_MB``).
DEFAULT_LIMIT_MB = 1024


def limit() -> int:
    """The cache's size limit in bytes: ``UCF_CACHE_MAX_MB``, else 1 GB."""
    text = os.environ.get("UCF_CACHE_MAX_MB", "")
    try:
        mb = float(text) if text else DEFAULT_LIMIT_MB
    except ValueError:
        mb = DEFAULT_LIMIT_MB
    return int(mb * 2**20)


#: What the cache holds: plans, shared libraries, and a kernel's decisions
#: (``ucf.exec.decisions``); the size limit counts them all.
ENTRY_SUFFIXES = (".plan", ".so", ".decision")


def _scan() -> list[tuple[float, int, Path]]:
    """Each entry's (last use, bytes, path), least recently used first."""
    found = []
    for p in cache_dir().iterdir():
        if p.suffix in ENTRY_SUFFIXES and not p.name.startswith("."):
            try:
                st = p.stat()
            except OSError:
                continue  # removed by another process meanwhile
            found.append((st.st_mtime, st.st_size, p))
    return sorted(found)


def entries() -> list[Path]:
    """The cache's entries (plans, libraries, decisions), least recently used first."""
    return [p for _, _, p in _scan()]


def size() -> int:
    """Bytes the cache's entries take."""
    return sum(n for _, n, _ in _scan())


def evict(max_bytes: int) -> list[Path]:
    """Remove least recently used entries until the cache is within ``max_bytes``;
    the removed paths. An entry in use elsewhere is rebuilt when next needed."""
    found = _scan()
    kept = sum(n for _, n, _ in found)
    removed = []
    for _, n, p in found:
        if kept <= max_bytes:
            break
        try:
            p.unlink()
        except OSError:
            continue
        kept -= n
        removed.append(p)
    _TALLY[cache_dir()] = [kept, 0]
    return removed


def clear() -> int:
    """Remove every entry and lock file; the number of entries removed."""
    removed = len(evict(0))
    for p in cache_dir().glob("pch-*"):  # the emulator's precompiled headers
        shutil.rmtree(p, ignore_errors=True)
    for p in cache_dir().glob("lark-*.tables"):  # the parser's (ucf.lang.parser)
        p.unlink(missing_ok=True)
    for p in cache_dir().glob("code-*"):  # the digests of ucf's sources (code_version)
        p.unlink(missing_ok=True)
    for p in cache_dir().glob("*.lock"):
        try:
            p.unlink()
        except OSError:
            pass
    return removed


def load(name: str, fields: dict[str, Any]) -> Any | None:
    """The cached object of entry ``name`` if it is intact and is ``fields``' entry."""
    payload = _read(name, fields)
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception as e:  # verified bytes from an incompatible pickle: rebuild
        _discard(cache_dir() / name, f"cannot be unpickled ({type(e).__name__})")
        return None


def store(name: str, fields: dict[str, Any], obj: Any) -> None:
    _write(name, fields, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def library(fields: dict[str, Any], build: Callable[[], bytes]) -> ctypes.CDLL:
    """The shared library keyed by ``fields`` (which name its compiler and flags):
    cached and verified, or built (``build`` returns its bytes) and stored. It is
    loaded from a private copy of the verified bytes."""
    name = f"{key(fields)}.so"
    data = _read(name, fields)
    if data is None:
        with lock(name):
            data = _read(name, fields)
            if data is None:
                data = build()
                _write(name, fields, data)
    fd, path = tempfile.mkstemp(dir=cache_dir(), prefix=".load-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return ctypes.CDLL(path)
    finally:
        os.unlink(path)  # the loader keeps its mapping; nothing else can reach the copy
