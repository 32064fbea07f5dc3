"""The kernel's parameters: how each storage reaches the generated function."""

from __future__ import annotations

from ucf.format.format import Format
from ucf.ir.nodes import I64, Array, Const, Expr, Param, Var
from ucf.lower.state import (
    SlotParams,
)


class ParamsMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _slot_params(
        self, name: str, fmt: Format, order: int, output: bool = False, fixed=()
    ) -> SlotParams:
        """``fixed`` gives the modes whose size is known when compiling (a block's)."""
        dims: list[Expr] = [
            Const(fixed[m], I64) if fixed and fixed[m] else Var(f"{name}_dim{m}", I64)
            for m in range(order)
        ]
        levels = []
        for lvl, kind in enumerate(fmt.levels):
            levels.append({a: Array(f"{name}{lvl}_{a}", self.it, output) for a in kind.arrays})
        held = fmt.values.ir if fmt.values else self.vt  # read in place, widened on load
        vals = Array(f"{name}_vals", held, output)
        if not (fmt.values and fmt.values.quantized):
            return SlotParams(dims, levels, vals)
        scale, zero = Array(f"{name}_scale", "f32"), Array(f"{name}_zero", "i32")
        return SlotParams(dims, levels, vals, scale, zero)

    def _params(self, assemble: bool) -> list[Param]:
        params = [
            Param(f"n_{k}", I64, False, role=("extent", k), doc=f"extent of index variable {k}")
            for k in self.extents
        ]
        for slot_name, sp in self.slot_params.items():
            params += self._storage_params(slot_name, sp, output=False)
        if assemble:
            params.append(
                Param(
                    f"{self.out_name}_counts",
                    I64,
                    True,
                    True,
                    role=("counts",),
                    doc="out: number of entries each output level receives",
                )
            )
            if self.local is not None:
                kind = self.out_fmt.levels[self.local]
                arr = self.out_params.levels[self.local][kind.segment_array]
                params.append(
                    Param(
                        arr.name,
                        arr.elem,
                        True,
                        True,
                        role=(kind.segment_array, self.out_name, self.local),
                        doc=f"out: entries under each parent of output level {self.local}",
                    )
                )
        else:
            params += self._storage_params(self.out_name, self.out_params, output=True)
            if self.sparse_out:
                params.append(
                    Param(
                        f"{self.out_name}_counts",
                        I64,
                        True,
                        False,
                        role=("counts",),
                        doc="in: the entries per output level that _assemble counted",
                    )
                )
        return params

    def _storage_params(self, slot: str, sp: SlotParams, output: bool) -> list[Param]:
        who = "output" if output else "operand"
        params = [
            Param(
                f"{slot}_dim{m}",
                I64,
                False,
                role=("dim", slot, m),
                doc=f"{who} {slot}: size of mode {m}",
            )
            for m in range(len(sp.dims))
        ]
        for lvl, arrays in enumerate(sp.levels):
            for key, arr in arrays.items():
                params.append(
                    Param(
                        arr.name,
                        arr.elem,
                        True,
                        output,
                        role=(key, slot, lvl),
                        doc=f"{who} {slot}: level {lvl} {key} array",
                    )
                )
        params.append(
            Param(
                sp.vals.name,
                sp.vals.elem,
                True,
                output,
                role=("vals", slot),
                doc=f"{who} {slot}: values",
            )
        )
        for key, arr, what in (("scale", sp.scale, "scales"), ("zero", sp.zero, "zero points")):
            if arr is not None:
                doc = f"{who} {slot}: {what}, one per scale group"
                params.append(Param(arr.name, arr.elem, True, False, role=(key, slot), doc=doc))
        return params

    def _counts_array(self) -> Array:
        return Array(f"{self.out_name}_counts", I64, True)
