"""A statement's gradients as kernels: what each operand's derived statement reads, in
which formats, and how a call feeds it.

Each derived statement (``ucf.autodiff.derive``) is compiled like any other
statement, so it gets its own default schedule (or one given by operand) and
lands in the kernel cache. Formats follow the forward call's: the output's
gradient is read in the output's format (a sparse output's gradient is sparse,
so each kernel iterates its stored positions and never an array of the output's
full shape); every dense operand's gradient is dense, in the operand's mode order
(``"D": "UU:1,0"`` gives the gradient of an SDDMM's D column-major, each stored entry
then adding K contiguous values; a row-major D's is written so too and copied
row-major once, ``scattered_last``); a sparse operand's gradient is computed in the
operand's own format from its pattern (ones at its stored positions, sharing its
index arrays), and comes back on the operand's index arrays with new values; a
dynamic operand's gradient is dense, computed over its live micro-tiles only (the
pattern is the kernel's dynamic operand, under the forward call's mask), and zero
elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ucf.autodiff.derive import Derived, derive
from ucf.autodiff.on_positions import OnPositions
from ucf.errors import FormatError, OperandError, ShapeError, UnsupportedError, boundary
from ucf.format.construction import trusted
from ucf.format.format import Format
from ucf.format.storage import foreign_type
from ucf.format.tensor import Tensor
from ucf.lang.ast import Statement, accesses, index_variables


class Backward:
    """The gradients of ``statement``'s operands, each a derived statement and a kernel.

    ``formats`` are the forward call's (Format objects, dense where absent; the
    output's, when given sparse, is the format its gradient is read in),
    ``dynamic`` maps a dynamic operand to its micro-tile shape, and ``schedules``
    may give a derived statement a schedule by operand (the default model's
    otherwise)."""

    def __init__(
        self,
        statement: Statement,
        formats: Mapping[str, Format],
        dynamic: Mapping[str, tuple[int, ...]] | None = None,
        *,
        target: str = "llvm",
        dtype: Any = np.float64,
        index_dtype: Any = np.int32,
        schedules: Mapping[str, str | None] | None = None,
    ):
        self.statement = statement
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise UnsupportedError(
                f"gradients of {statement} need a floating-point kernel, not {self.dtype}"
            )
        self.orders = {a.tensor: len(a.indices) for a in accesses(statement.rhs)}
        self.formats = {n: formats.get(n) or Format.dense(k) for n, k in self.orders.items()}
        out = formats.get(statement.lhs.tensor)
        #: The output's format when sparse: its gradient is read in it (``output_gradient``).
        self.output_format = out if out is not None and not out.is_dense else None
        self.dynamic = dict(dynamic or {})
        self.target, self.index_dtype = target, np.dtype(index_dtype)
        self.schedules = dict(schedules or {})
        self._derived: dict[str, Derived] = {}
        self._kernels: dict[str, Any] = {}
        self._prelude: dict[str, list[Any]] = {}
        self._ones: dict[tuple, np.ndarray] = {}
        #: The last pattern by operand (``_pattern``): it holds the operand's levels, so
        #: no other operand's can be those objects while it is kept.
        self._patterns: dict[str, Tensor] = {}
        self._positions = OnPositions(self)
        #: ``kernel_formats`` by operand: fixed by the formats, asked on every call.
        self._formats: dict[str, tuple[dict[str, Format], dict[str, tuple[int, ...]]]] = {}
        #: Where the output's extents come from: per output mode, the (operand, mode)
        #: pairs that a plain index of the same variable reads (``_output_shape``).
        out_vars = [i.single_variable for i in statement.lhs.indices]
        self._bound_by = [
            [
                (a.tensor, m)
                for a in accesses(statement.rhs)
                for m, idx in enumerate(a.indices)
                if v is not None and idx.single_variable == v
            ]
            for v in out_vars
        ]

    # ------------------------------------------------------------------ derivation
    def keeps_pattern(self, wrt: str) -> bool:
        """Whether ``wrt``'s gradient lives on its pattern (sparse or dynamic)."""
        return wrt in self.dynamic or not self.formats[wrt].is_dense

    def derived(self, wrt: str) -> Derived:
        if wrt not in self._derived:
            if wrt not in self.orders:
                raise OperandError(
                    f"{wrt} is not an operand of {self.statement} (operands: "
                    f"{', '.join(self.orders)})"
                )
            self._derived[wrt] = derive(self.statement, wrt, self.keeps_pattern(wrt))
        return self._derived[wrt]

    def kernel_formats(self, wrt: str) -> tuple[dict[str, Format], dict[str, tuple[int, ...]]]:
        """The formats of the derived statement's tensors, and its dynamic operand: the
        pattern of a dynamic ``wrt``, else a dynamic operand the statement reads once.
        Made once per operand (the caller must not change them)."""
        if wrt not in self._formats:
            self._formats[wrt] = self._kernel_formats(wrt)
        return self._formats[wrt]

    def _kernel_formats(self, wrt: str) -> tuple[dict[str, Format], dict[str, tuple[int, ...]]]:
        d = self.derived(wrt)
        assert d.statement is not None
        read = [a.tensor for a in accesses(d.statement.rhs)]
        fmts = {n: self.formats[n] for n in read if n in self.formats}
        dynamic: dict[str, tuple[int, ...]] = {}
        if wrt in self.dynamic:
            dynamic[d.pattern] = self.dynamic[wrt]
        else:
            once = [n for n in self.dynamic if read.count(n) == 1]
            if once:
                dynamic[once[0]] = self.dynamic[once[0]]
        for n in dynamic:
            fmts.pop(n, None)
        if self.output_format is not None:
            fmts[d.grad] = self.output_format
        if d.pattern is not None and wrt not in self.dynamic:
            fmts[d.pattern] = self.formats[wrt]
            fmts[d.statement.lhs.tensor] = writable(self.formats[wrt])
        elif wrt not in self.dynamic and _transposed(self.formats[wrt]):
            # A dense operand stored in another mode order gets its gradient in that
            # order: grad_D(k,j) of an SDDMM, D column-major, adds K contiguous values
            # per stored entry rather than K values a row apart.
            fmts[d.statement.lhs.tensor] = self.formats[wrt]
        elif wrt not in self.dynamic:
            written = scattered_last(d.statement, fmts, self.formats[wrt])
            if written is not None:
                fmts[d.statement.lhs.tensor] = written
        return fmts, dynamic

    def relaid(self, wrt: str) -> Format | None:
        """The format ``wrt``'s gradient is written in where that is not its declared one
        (``scattered_last``; it is copied into the declared one after), else None."""
        d = self.derived(wrt)
        if d.statement is None or d.pattern is not None or wrt in self.dynamic:
            return None
        written = self.kernel_formats(wrt)[0].get(d.statement.lhs.tensor)
        return None if written is None or written == self.formats[wrt] else written

    def kernel(self, wrt: str) -> Any:
        """The compiled kernel of ``wrt``'s derived statement (None when it is zero)."""
        if wrt not in self._kernels:
            d = self.derived(wrt)
            self._kernels[wrt] = None if d.statement is None else self._compile(wrt, d)
        return self._kernels[wrt]

    def prelude(self, wrt: str) -> list[Any]:
        """The kernels of the sums ``wrt``'s gradient reads, hoisted (``ucf.autodiff.hoist``):
        dense outputs, every operand read as the forward call reads it (a dynamic one
        dense, masked)."""
        if wrt not in self._prelude:
            from ucf.exec.kernel import Kernel

            found = []
            for t, _ in self.derived(wrt).prelude:
                read = {a.tensor for a in accesses(t.statement.rhs)}
                fmts = {n: self.formats[n] for n in read if n not in self.dynamic}
                expr = str(t.statement)
                found.append(Kernel(expr, fmts, None, self.target, self.dtype, self.index_dtype))
            self._prelude[wrt] = found
        return self._prelude[wrt]

    def _compile(self, wrt: str, d: Derived) -> Any:
        from ucf.exec.kernel import Kernel

        fmts, dynamic = self.kernel_formats(wrt)
        schedule = self.schedules.get(wrt)
        expr = str(d.statement)  # the compile entry takes text; it parses back to this tree
        if dynamic:
            from ucf.stile.dynamic import DynamicKernel

            return DynamicKernel(
                expr, fmts, schedule, self.target, self.dtype, self.index_dtype, dynamic
            )
        return Kernel(expr, fmts, schedule, self.target, self.dtype, self.index_dtype)

    def text(self) -> str:
        """Every operand's derived statement, one per line, with the formats of the
        tensors that are not dense."""
        lines = []
        for wrt in self.orders:
            d = self.derived(wrt)
            if d.statement is None:
                lines.append(f"grad_{wrt} = 0")
                continue
            fmts, dynamic = self.kernel_formats(wrt)
            notes = [f"{n}: {f}" for n, f in fmts.items() if not f.is_dense]
            notes += [f"{n}: dynamic {tuple(g)}" for n, g in dynamic.items()]
            lines.append(str(d.statement) + (f"  # {'; '.join(notes)}" if notes else ""))
        return "\n".join(lines)

    @property
    def cin(self) -> str:
        """Each operand's derived statement, the sums it hoisted, and the loop nests of
        their kernels."""
        parts = []
        for wrt in self.orders:
            d = self.derived(wrt)
            k = self.kernel(wrt)
            if k is None:
                parts.append(f"# gradient of {wrt}: zero")
                continue
            lines = [f"# gradient of {wrt}: {d.statement}"]
            relaid = self.relaid(wrt)
            if relaid is not None:
                lines.append(
                    f"# {d.statement.lhs.tensor} written as '{relaid}' (the modes no sparse "
                    f"operand reads last), then copied into {wrt}'s '{self.formats[wrt]}'"
                )
            for (t, _), pk in zip(d.prelude, self.prelude(wrt), strict=True):
                lines += [f"# first {t.statement}", pk.cin]
            parts.append("\n".join([*lines, k.cin]))
        return "\n".join(parts)

    # ---------------------------------------------------------------------- calling
    @boundary
    def __call__(
        self,
        wrt: str,
        grad: Any,
        operands: Mapping[str, Tensor],
        masks: Mapping[str, np.ndarray] | None = None,
        extents: Mapping[str, int] | None = None,
        hoisted: dict[str, Any] | None = None,
    ) -> Tensor:
        """The gradient of ``wrt`` given the output's gradient ``grad`` (see
        ``output_gradient``) and the forward call's operands (a dynamic operand dense,
        with its mask in ``masks``; without one, its nonzeros). A sparse operand's
        gradient shares its index arrays; any other is a new dense tensor. ``hoisted``
        keeps the hoisted sums computed, for the other operands' gradients of the same
        call."""
        d = self.derived(wrt)
        missing = [n for n in self.orders if n not in operands]
        if missing:
            raise OperandError(
                f"the gradient of {wrt} is given the forward call's operands without "
                f"{', '.join(missing)} (operands of {self.statement}: {', '.join(self.orders)})"
            )
        x = operands[wrt]
        if not isinstance(x, Tensor) and self.keeps_pattern(wrt) and wrt not in self.dynamic:
            # a scipy matrix or an array given for a sparse operand, as the forward call
            # takes it: its gradient lives on the entries that call read, in its format
            from ucf.format.interop import as_tensor

            x = as_tensor(x, self.formats[wrt], wrt, index_dtype=self.index_dtype)
        grad = self.output_gradient(grad, operands)
        if d.statement is None:
            return self._zero(wrt, x)
        if self._positions.applies(wrt) and self._positions.same(x, grad):
            result = self._positions(wrt, grad, operands)  # no pattern: see on_positions
            return trusted(x.shape, x.format, x.levels, on_pattern(x, result), x.index_dtype)
        masks = {n: _mask(operands[n], (masks or {}).get(n)) for n in self.dynamic}
        _, dynamic = self.kernel_formats(wrt)
        # A dynamic operand the kernel does not read as its dynamic one is read masked.
        reads = {n: operands[n] for n in _reads(d) if n in self.orders}
        for n in set(self.dynamic) & set(reads) - set(dynamic):
            reads[n] = np.where(masks[n], np.asarray(operands[n]), 0).astype(self.dtype)
        if d.ranges or d.extents or d.prelude:
            extents = dict(extents or self._extents(operands, grad))

        def extent(source: str | int) -> int:
            return extents[source] if isinstance(source, str) else x.shape[source]

        args: dict[str, Any] = {d.grad: grad}
        hoisted = {} if hoisted is None else hoisted
        for (t, sources), k in zip(d.prelude, self.prelude(wrt), strict=True):
            key = f"{t.variables}:{t.statement.rhs}"
            if key not in hoisted:
                used = {a.tensor: reads[a.tensor] for a in accesses(t.statement.rhs)}
                hoisted[key] = k(shapes={t.name: tuple(map(extent, sources))}, **used)
            args[t.name] = hoisted[key]
        args.update(
            {a.tensor: reads[a.tensor] for a in accesses(d.statement.rhs) if a.tensor in reads}
        )
        if d.pattern is not None:
            args[d.pattern] = self._pattern(wrt, x)
        for name, v in d.ranges:
            args[name] = self._ones_array((extents[v],))
        kernel = self.kernel(wrt)
        if dynamic:
            ((name, _),) = dynamic.items()
            result = kernel(masks={name: masks[wrt if name == d.pattern else name]}, **args)
        else:
            shapes = {v: extent(s) for v, s in d.extents} if d.extents else None
            result = kernel(shapes=shapes, **args)
        if d.pattern is None or wrt in self.dynamic:
            if wrt in self.dynamic:
                return result
            declared = self.formats[wrt]
            if result.format.mode_order == declared.mode_order:
                return result
            # Written in scattered_last's order (``relaid``): one transposing copy into
            # the declared one.
            vals = np.ascontiguousarray(np.asarray(result).transpose(declared.mode_order))
            return trusted(result.shape, declared, [{} for _ in result.shape], vals.reshape(-1))
        return trusted(x.shape, x.format, x.levels, on_pattern(x, result), x.index_dtype)

    def output_gradient(self, grad: Any, operands: Mapping[str, Any]) -> Any:
        """``grad`` as the kernels read the output's gradient, after checking its shape
        against the output's (as far as ``operands`` fix it).

        A dense output's gradient is passed on as given. A sparse output's is read in
        the output's format: a ``Tensor`` in it (the forward result's index arrays with
        new values) as it is, anything else (another format, scipy.sparse, a torch or
        numpy array) converted into it by its stored entries. Entries at positions the
        output does not store are harmless: the output is zero there whatever the
        operands' values, so every term of every gradient is zero there too."""
        out = self.statement.lhs
        shape = getattr(grad, "shape", None)
        if shape is None:
            a = np.asarray(grad)
            if a.dtype == object:
                raise OperandError(
                    f"the gradient of output {out} is a {foreign_type(grad)}; expected a ucf "
                    "Tensor, numpy array, scipy.sparse matrix or torch tensor"
                )
            shape = a.shape
        shape, want = tuple(shape), self._output_shape(operands)
        fits = len(shape) == len(want)
        if not fits or any(w not in (None, s) for s, w in zip(shape, want, strict=True)):
            fixed = ", ".join("?" if w is None else str(w) for w in want)
            raise ShapeError(
                f"the gradient of output {out} is a {foreign_type(grad)} of shape {shape}; "
                f"{out.tensor}'s shape from the operands is ({fixed})"
            )
        if self.output_format is None:
            return grad
        if (
            isinstance(grad, Tensor)
            and grad.format == self.output_format
            and grad.vals.dtype == self.dtype
            and grad.index_dtype == self.index_dtype
        ):
            return grad  # the forward result's index arrays with new values: as it is
        from ucf.format.interop import as_tensor

        return as_tensor(
            grad,
            self.output_format,
            name=f"grad_{out.tensor} (the gradient of output {out})",
            dtype=self.dtype,
            index_dtype=self.index_dtype,
        )

    def _output_shape(self, operands: Mapping[str, Any]) -> tuple[int | None, ...]:
        """The output's extent in each mode that a plain index of an operand fixes (the
        first operand read with that variable, in the statement's order)."""
        found: list[int | None] = []
        for pairs in self._bound_by:
            extent = None
            for tensor, m in pairs:
                shape = getattr(operands.get(tensor), "shape", ())
                if m < len(shape):
                    extent = int(shape[m])
                    break
            found.append(extent)
        return tuple(found)

    def _pattern(self, wrt: str, x: Tensor) -> Any:
        """Ones on ``x``'s positions: the same Tensor while ``x`` holds the same levels,
        so that a call on the same operands replays (``ucf.exec.replay``: it compares
        operands by identity; a new pattern each call ran the whole binding path, about
        half the call at 300 rows)."""
        if wrt in self.dynamic:
            return self._ones_array(tuple(np.shape(x)))
        kept = self._patterns.get(wrt)
        if (
            kept is not None
            and kept.levels is x.levels
            and kept.shape == x.shape
            and kept.format == x.format
            and kept.index_dtype == x.index_dtype
            and len(kept.vals) == len(x.vals)
        ):
            return kept
        ones = self._ones_array((len(x.vals),))
        self._patterns[wrt] = kept = trusted(x.shape, x.format, x.levels, ones, x.index_dtype)
        return kept

    def _ones_array(self, shape: tuple[int, ...]) -> np.ndarray:
        """Ones of ``shape`` in the kernel's dtype, made once per shape: a pattern's values
        are read every call and never written."""
        key = (shape, self.dtype)
        if key not in self._ones:
            ones = np.ones(shape, dtype=self.dtype)
            ones.flags.writeable = False
            self._ones[key] = ones
        return self._ones[key]

    def _zero(self, wrt: str, x: Tensor) -> Tensor:
        if self.keeps_pattern(wrt) and wrt not in self.dynamic:
            vals = np.zeros(len(x.vals), dtype=self.dtype)
            return trusted(x.shape, x.format, x.levels, vals, x.index_dtype)
        shape = tuple(np.shape(x))
        fmt = Format.dense(len(shape))
        return trusted(shape, fmt, [{} for _ in shape], np.zeros(int(np.prod(shape)), self.dtype))

    def _extents(self, operands: Mapping[str, Any], grad: Any) -> dict[str, int]:
        """The forward call's extents, from its operands and its output's gradient."""
        from ucf.exec.shapes import bound_extents
        from ucf.format.interop import as_tensor

        given = {n: as_tensor(v, name=n) for n, v in operands.items()}
        stmt = self.statement
        variables = index_variables(stmt.lhs) + index_variables(stmt.rhs)
        return bound_extents(stmt, variables, given, out=grad)


def gradients(kernel: Any) -> Backward:
    """The gradients of a compiled kernel's statement, for its formats, dtype, index
    dtype and target (and its dynamic operand's micro-tile): ``.text()`` lists each
    operand's derived statement, ``.cin`` adds the loop nests of their kernels, and
    calling it computes one (docs/training.md)."""
    from ucf.exec.kernel import Kernel
    from ucf.stile.dynamic import DynamicKernel

    if not isinstance(kernel, Kernel | DynamicKernel):
        raise OperandError(f"gradients takes a compiled kernel (ucf.compile), got {kernel!r}")
    statement = kernel.statement
    names = {statement.lhs.tensor, *(a.tensor for a in accesses(statement.rhs))}
    formats = {n: f for n, f in kernel.parsed_formats.items() if n in names}
    dynamic = {kernel.name: kernel.granularity} if isinstance(kernel, DynamicKernel) else None
    return Backward(
        statement,
        formats,
        dynamic,
        target=kernel.target,
        dtype=kernel.dtype,
        index_dtype=kernel.index_dtype,
    )


def scattered_last(stmt: Statement, fmts: Mapping[str, Format], declared: Format) -> Format | None:
    """The dense format a dense operand's gradient is written in where its declared one
    scatters the writes, else None: the declared mode order with the modes whose
    variables no sparse operand reads moved last (in their order).

    The sparse operands drive the outer loops, so the variables only dense operands
    read run innermost, and each stored entry adds to the output along them:
    grad_D(k,j) = grad_A(i,j) * B(i,j) * C(i,k), D declared row-major (K x n), added
    K values a row apart per stored entry of B. Written with k last they are
    contiguous, and one transposing copy gives the declared order back: 100k rows of
    10, K = 8, one thread, CPU time, load 5.4: 10.05 ms row-major, 3.96 ms written
    column-major and copied (scipy's ``((G*B).T @ C).T``, which leaves its result
    Fortran-ordered, 4.63 ms)."""
    lhs = [idx.single_variable for idx in stmt.lhs.indices]
    driven = {
        v
        for a in accesses(stmt.rhs)
        if a.tensor in fmts and not fmts[a.tensor].is_dense
        for idx in a.indices
        for v in idx.variables
    }
    if not declared.is_dense or not driven or None in lhs:
        return None
    order = list(declared.mode_order)
    moved = [m for m in order if lhs[m] in driven] + [m for m in order if lhs[m] not in driven]
    return None if moved == order else Format.dense(len(order), moved)


def _transposed(fmt: Format) -> bool:
    """Whether a dense format stores its modes in another order than their own."""
    return fmt.is_dense and fmt.mode_order != tuple(sorted(fmt.mode_order))


def writable(fmt: Format) -> Format:
    """The format a kernel writes a gradient of ``fmt`` in: ``fmt`` itself, except that a
    level no kernel writes (fixed-width: N:M, ELL) is computed in the kind the level is
    converted to, holding the same entries in the same order (the pattern drives)."""
    kinds = []
    for kind in fmt.levels:
        try:
            kinds.append(kind.as_output())
        except FormatError:
            kinds.append(kind.reordered())
    return fmt.with_structure(tuple(kinds), fmt.maps).structure


def on_pattern(x: Tensor, result: Tensor, drop_outside: bool = False) -> np.ndarray:
    """``result``'s values at ``x``'s stored positions, in ``x``'s order (zero where
    ``result`` stores nothing): its own values when both store the same positions.
    ``result``'s entries outside them are a bug, unless ``drop_outside`` (an output's
    gradient from torch, which may store any positions) drops them."""
    if result.format.structure == x.format.structure and all(
        all(a[k] is b[k] or np.array_equal(a[k], b[k]) for k in a)
        for a, b in zip(x.levels, result.levels, strict=True)
    ):
        return result.vals
    xc, rc = _coords(x), _coords(result)
    if xc.shape == rc.shape and np.array_equal(xc, rc):
        return result.vals
    dims = np.maximum(xc.max(axis=0, initial=0), rc.max(axis=0, initial=0)) + 1
    xk = np.ravel_multi_index(xc.T, dims) if len(xc) else np.zeros(0, np.int64)
    rk = np.ravel_multi_index(rc.T, dims) if len(rc) else np.zeros(0, np.int64)
    order = np.argsort(xk, kind="stable")
    at = np.searchsorted(xk[order], rk)
    rvals = result.vals[: len(rk)]
    vals = np.zeros(len(x.vals), dtype=result.vals.dtype)
    if len(xk) == 0:
        if len(rk) and not drop_outside:
            raise RuntimeError("a gradient came back with entries outside its operand's pattern")
        return vals
    inside = (at < len(xk)) & (xk[order[np.minimum(at, len(xk) - 1)]] == rk)
    if not inside.all():
        if not drop_outside:
            # The pattern is a factor of every term, so this is a bug, not a user's error.
            raise RuntimeError("a gradient came back with entries outside its operand's pattern")
        at, rvals = at[inside], rvals[inside]
    vals[order[at]] = rvals
    return vals


def _coords(t: Tensor) -> np.ndarray:
    """The mode coordinates of every stored position, in the order of ``t.vals``."""
    cols, count = t.columns()
    return t.format.mode_coords(cols, count)


def _reads(d: Derived) -> set[str]:
    """The tensors ``d``'s statement and its hoisted sums read."""
    found = {a.tensor for a in accesses(d.statement.rhs)}
    return found.union(*({a.tensor for a in accesses(t.statement.rhs)} for t, _ in d.prelude))


def _mask(operand: Any, mask: Any) -> np.ndarray:
    """A dynamic operand's mask as booleans: the one given, else the operand's nonzeros."""
    m = np.asarray(operand) if mask is None else np.asarray(mask)
    return m != 0 if m.dtype != np.bool_ else m
