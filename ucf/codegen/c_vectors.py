"""The C target's vector types and the macros for the vector operations GCC's vector
extension lacks or compiles poorly (``ir.PairDot``, ``ir.QuadDot``, fused multiply-adds,
min and max): each the x86 intrinsic where the compiler targets it, else the
definition lane by lane, the same values."""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import IR_TO_C


def c_type(ty: str) -> str:
    """The C type of an LLIR scalar or vector type (``vector_typedefs`` names the latter)."""
    return IR_TO_C[ty] if ir.lanes(ty) == 1 else f"ucf_{ty}"


def vector_typedefs(fns: list[ir.Function]) -> list[str]:
    """GCC vector types (also clang's) for the vector types the functions use: ``ucf_f32x8``
    in registers, and ``ucf_f32x8_u``, aligned as one element, to load and store at any
    element of an array."""
    from ucf.ir.walk import nodes

    used = sorted({n.type for n in nodes(fns) if isinstance(n, ir.Expr) and ir.lanes(n.type) > 1})
    lines = []
    for ty in used:
        elem = IR_TO_C[ir.element(ty)]
        size = f"vector_size({ir.lanes(ty)} * sizeof({elem}))"
        lines.append(f"typedef {elem} ucf_{ty} __attribute__(({size}));")
        lines.append(f"typedef {elem} ucf_{ty}_u __attribute__(({size}, aligned(sizeof({elem}))));")
    return lines


def pair_dots(fns: list[ir.Function]) -> list[str]:
    """A macro ``ucf_pairdot_<type>`` per vector type of ``ir.PairDot`` the functions use:
    AVX2's ``_mm256_madd_epi16`` where the compiler targets it (the default
    ``-march=native`` on the hosts that make the node), else the definition's sums, the
    same values (a kernel saved and built for another CPU). Macros, not functions: a
    function taking 32-byte vectors by value makes GCC warn of an ABI change when
    the target has no AVX."""
    from ucf.ir.walk import nodes

    used = sorted({n.type for n in nodes(fns) if isinstance(n, ir.PairDot)})
    if not used:
        return []
    lines = ["#if defined(__AVX2__)", "#include <immintrin.h>", "#endif"]
    for ty in used:
        n, t, name = ir.lanes(ty), c_type(ty), f"ucf_pairdot_{ty}"
        if n == 8:
            lines += [
                "#if defined(__AVX2__)",
                f"#define {name}(a, b) (({t})_mm256_madd_epi16((__m256i)(a), (__m256i)(b)))",
                "#else",
            ]
        lines += [
            f"#define {name}(a, b) __extension__({{ \\",
            f"  {t} ucf_a_ = (a), ucf_b_ = (b), ucf_r_; \\",
            f"  for (int ucf_l_ = 0; ucf_l_ < {n}; ucf_l_++) \\",
            "    ucf_r_[ucf_l_] = (int32_t)(int16_t)ucf_a_[ucf_l_] * (int16_t)ucf_b_[ucf_l_] \\",
            "      + (ucf_a_[ucf_l_] >> 16) * (ucf_b_[ucf_l_] >> 16); \\",
            "  ucf_r_; })",
        ]
        if n == 8:
            lines.append("#endif")
    return lines


def quad_dots(fns: list[ir.Function]) -> list[str]:
    """A macro ``ucf_quaddot_<type>(unsigned, signed, addend)`` per vector type of
    ``ir.QuadDot`` the functions use: VNNI's ``_mm256_dpbusd_epi32`` (AVX-512 VNNI with
    AVX-512VL) or ``_mm256_dpbusd_avx_epi32`` (AVX-VNNI) where the compiler targets it,
    else the definition's sums, the same values (a CPU without VNNI, where tests make
    the node, or a kernel saved and built for another CPU). The sums wrap in uint32 as
    the instruction's do, where int32 would overflow (undefined in C). Macros for the
    reason ``pair_dots`` gives."""
    from ucf.ir.walk import nodes

    used = sorted({n.type for n in nodes(fns) if isinstance(n, ir.QuadDot)})
    if not used:
        return []
    vnni = "defined(__AVX512VNNI__) && defined(__AVX512VL__)"
    lines = [f"#if {vnni} || defined(__AVXVNNI__)", "#include <immintrin.h>", "#endif"]
    for ty in used:
        n, t, name = ir.lanes(ty), c_type(ty), f"ucf_quaddot_{ty}"
        if n == 8:
            lines += [f"#if {vnni}", _dpbusd(name, t, "_mm256_dpbusd_epi32")]
            lines += ["#elif defined(__AVXVNNI__)", _dpbusd(name, t, "_mm256_dpbusd_avx_epi32")]
            lines.append("#else")
        elif n == 16:
            lines += ["#if defined(__AVX512VNNI__)", _dpbusd(name, t, "_mm512_dpbusd_epi32", 512)]
            lines += [f"#elif {vnni}", _halves(name, t, "_mm256_dpbusd_epi32")]
            lines += ["#elif defined(__AVXVNNI__)", _halves(name, t, "_mm256_dpbusd_avx_epi32")]
            lines.append("#else")
        lines += [
            f"#define {name}(u, s, c) __extension__({{ \\",
            f"  {t} ucf_u_ = (u), ucf_s_ = (s), ucf_r_ = (c); \\",
            f"  for (int ucf_l_ = 0; ucf_l_ < {n}; ucf_l_++) \\",
            "    for (int ucf_b_ = 0; ucf_b_ < 32; ucf_b_ += 8) \\",
            "      ucf_r_[ucf_l_] = (int32_t)((uint32_t)ucf_r_[ucf_l_] \\",
            "        + (uint32_t)((int32_t)(uint8_t)(ucf_u_[ucf_l_] >> ucf_b_) \\",
            "                     * (int8_t)(ucf_s_[ucf_l_] >> ucf_b_))); \\",
            "  ucf_r_; })",
        ]
        if n in (8, 16):
            lines.append("#endif")
    return lines


def _dpbusd(name: str, t: str, intrinsic: str, bits: int = 256) -> str:
    """The macro ``name`` as the VNNI ``intrinsic`` on vectors of type ``t``."""
    args = f"(__m{bits}i)(c), (__m{bits}i)(u), (__m{bits}i)(s)"
    return f"#define {name}(u, s, c) (({t}){intrinsic}({args}))"


def _halves(name: str, t: str, intrinsic: str) -> str:
    """The macro ``name`` on 16 int32 lanes of type ``t`` as the 256-bit VNNI
    ``intrinsic`` on each half (a kernel built for a CPU without the 512-bit form)."""
    half = "(__m256i)__builtin_shufflevector(ucf_{0}_, ucf_{0}_, {1})"
    parts = [
        f"{intrinsic}({half.format('c', h)}, {half.format('u', h)}, {half.format('s', h)})"
        for h in ("0, 1, 2, 3, 4, 5, 6, 7", "8, 9, 10, 11, 12, 13, 14, 15")
    ]
    return "\\\n".join(
        [
            f"#define {name}(u, s, c) __extension__({{ ",
            f"  {t} ucf_u_ = (u), ucf_s_ = (s), ucf_c_ = (c); ",
            f"  __m256i ucf_lo_ = {parts[0]}; ",
            f"  __m256i ucf_hi_ = {parts[1]}; ",
            f"  ({t})__builtin_shufflevector((__v8si)ucf_lo_, (__v8si)ucf_hi_, "
            "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); })",
        ]
    )


def vector_fmas(fns: list[ir.Function]) -> list[str]:
    """A macro ``ucf_fma_<type>`` per vector type of ``ir.FMA`` the functions use: FMA3's
    ``_mm256_fmadd_ps``/``_pd`` where the compiler targets it (the default
    ``-march=native`` on an FMA3 host), AVX-512's ``_mm512_fmadd_ps``/``_pd`` for the
    64-byte vectors of the tiles on an AVX-512 host, else C's ``fmaf``/``fma`` lane by
    lane; all
    exactly rounded, so the same values. The lane loop also vectorizes into ``vfmadd``,
    but GCC 12 then broadcasts a scalar factor with a shuffle, on the pipes the
    multiply-adds need (the c target's tile ran 0.92x the unfused one's), where the
    intrinsic takes ``vbroadcastss`` from memory. Macros for the reason ``pair_dots``
    gives."""
    from ucf.ir.walk import nodes

    used = sorted({n.type for n in nodes(fns) if isinstance(n, ir.FMA) and ir.lanes(n.type) > 1})
    if not used:
        return []
    lines = ["#if defined(__FMA__) || defined(__AVX512F__)", "#include <immintrin.h>", "#endif"]
    for ty in used:
        t, name, single = c_type(ty), f"ucf_fma_{ty}", ir.element(ty) == "f32"
        size = ir.lanes(ty) * (4 if single else 8)
        wide = size in (32, 64)
        if wide:
            bits, isa = (256, "__FMA__") if size == 32 else (512, "__AVX512F__")
            m = f"__m{bits}" if single else f"__m{bits}d"
            suffix = "ps" if single else "pd"
            lines += [
                f"#if defined({isa})",
                f"#define {name}(a, b, c) \\",
                f"  (({t})_mm{bits}_fmadd_{suffix}(({m})(a), ({m})(b), ({m})(c)))",
                "#else",
            ]
        fn = "fmaf" if single else "fma"
        lines += [
            f"#define {name}(a, b, c) __extension__({{ \\",
            f"  {t} ucf_a_ = (a), ucf_b_ = (b), ucf_c_ = (c), ucf_r_; \\",
            f"  for (int ucf_l_ = 0; ucf_l_ < {ir.lanes(ty)}; ucf_l_++) \\",
            f"    ucf_r_[ucf_l_] = {fn}(ucf_a_[ucf_l_], ucf_b_[ucf_l_], ucf_c_[ucf_l_]); \\",
            "  ucf_r_; })",
        ]
        if wide:
            lines.append("#endif")
    return lines


def vector_minmax(fns: list[ir.Function]) -> list[str]:
    """A macro ``ucf_min_<type>``/``ucf_max_<type>`` per vector type of a min or max the
    functions use (relu of a loaded vector in a register tile): lane by lane the
    scalar's ``a < b ? a : b`` (``ucf_runtime.h``), so a NaN lane picks the second
    operand as the scalar and the LLVM target's select do. GCC's vector extension has
    no ``?:`` in C, so the comparison's mask picks the bits. Macros for the reason
    ``pair_dots`` gives."""
    from ucf.ir.walk import nodes

    used = sorted(
        {
            (n.op, n.type)
            for n in nodes(fns)
            if isinstance(n, ir.Bin) and n.op in ("min", "max") and ir.lanes(n.type) > 1
        }
    )
    lines = []
    for op, ty in used:
        t, cmp = c_type(ty), "<" if op == "min" else ">"
        lines += [
            f"#define ucf_{op}_{ty}(a, b) __extension__({{ \\",
            f"  {t} ucf_a_ = (a), ucf_b_ = (b); \\",
            f"  __typeof__(ucf_a_ {cmp} ucf_b_) ucf_m_ = ucf_a_ {cmp} ucf_b_; \\",
            f"  ({t})(((__typeof__(ucf_m_))ucf_a_ & ucf_m_) | \\",
            "    ((__typeof__(ucf_m_))ucf_b_ & ~ucf_m_)); })",
        ]
    return lines
