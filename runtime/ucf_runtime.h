/* ucf runtime helpers for generated C kernels.
 *
 * Generated sources carry this header inline, so a saved kernel compiles on
 * its own; keep everything here static inline and C99.
 */
#ifndef UCF_RUNTIME_H
#define UCF_RUNTIME_H
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* OpenMP directives vanish when the file is compiled without OpenMP. */
#ifdef _OPENMP
#define UCF_OMP(directive) _Pragma(directive)
#else
#define UCF_OMP(directive)
#endif

/* min and max per type; a comparison with NaN picks the second operand, as the
 * LLVM target's select does, so both targets agree bit for bit. */
#define UCF_MINMAX(T, S)                                                        \
  static inline T ucf_min_##S(T a, T b) { return a < b ? a : b; }               \
  static inline T ucf_max_##S(T a, T b) { return a > b ? a : b; }
UCF_MINMAX(int32_t, i32)
UCF_MINMAX(int64_t, i64)
UCF_MINMAX(float, f32)
UCF_MINMAX(double, f64)

/* A float select that stays free of branches (ir.Select's branchless: a short sum's
 * steps kept only inside its fiber, ucf.passes.short_sums): the bits of a where c
 * holds, else of b, through an integer mask, so -0.0, infinities and NaN payloads
 * pass unchanged, as LLVM's select passes them. GCC 12 makes a float ?: a branch,
 * mispredicted about once a fiber there. The mask is made in a general register and
 * the blend done in a vector one (one vpternlogq; through general registers the
 * value's round trip lengthened the sum's chain: TTV 1.4x LLVM's time); the empty
 * asm hides that the mask is 0 or all ones, so no compiler turns the blend back
 * into a branch. */
#if defined(__GNUC__)
#define UCF_BLEND(T, U, S)                                                      \
  typedef T ucf_blend_##S##_v __attribute__((vector_size(16)));                \
  typedef U ucf_blend_##S##_m __attribute__((vector_size(16)));                \
  static inline T ucf_blend_##S(bool c, T a, T b) {                             \
    U m = (U)0 - (U)c;                                                          \
    __asm__("" : "+r"(m));                                                      \
    ucf_blend_##S##_m mask = (ucf_blend_##S##_m){0} + m;                        \
    ucf_blend_##S##_v x = {a}, y = {b}; /* not {0} + a: 0.0 + -0.0 is 0.0 */    \
    return ((ucf_blend_##S##_v)(((ucf_blend_##S##_m)x & mask) |                 \
                                ((ucf_blend_##S##_m)y & ~mask)))[0];            \
  }
#else
#define UCF_BLEND(T, U, S)                                                      \
  static inline T ucf_blend_##S(bool c, T a, T b) {                             \
    U x, y, m = (U)0 - (U)c;                                                    \
    memcpy(&x, &a, sizeof x);                                                   \
    memcpy(&y, &b, sizeof y);                                                   \
    x = (x & m) | (y & ~m);                                                     \
    memcpy(&a, &x, sizeof a);                                                   \
    return a;                                                                   \
  }
#endif
UCF_BLEND(float, uint32_t, f32)
UCF_BLEND(double, uint64_t, f64)

/* A bitmap's word operations (ir.Bits), on the word's bits as unsigned, so that no
 * signed shift or overflow is undefined: the trailing zero bits (64 for zero, as
 * LLVM's cttz with zero defined; one tzcnt with BMI), the word without its lowest set
 * bit (blsr), the word with bit n alone set, the count of set bits. */
#if defined(__BMI__)
#include <immintrin.h>
/* tzcnt itself: gcc made the test of the portable form below branches after each
 * blsr, which mispredict where a bitmap's words hold a bit or two. */
static inline int64_t ucf_ctz64(int64_t x) { return (int64_t)_tzcnt_u64((uint64_t)x); }
#else
static inline int64_t ucf_ctz64(int64_t x) {
  return x ? (int64_t)__builtin_ctzll((unsigned long long)x) : INT64_C(64);
}
#endif
static inline int64_t ucf_blsr64(int64_t x) {
  uint64_t u = (uint64_t)x;
  return (int64_t)(u & (u - 1));
}
static inline int64_t ucf_bit64(int64_t n) { return (int64_t)(UINT64_C(1) << n); }
static inline int64_t ucf_popcount64(int64_t x) {
  return (int64_t)__builtin_popcountll((unsigned long long)x);
}

/* A bfloat16 (its bits, held in uint16_t) as the float32 it is: the same bits in
 * the top half of a float's. */
static inline float ucf_bf16_f32(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

#endif /* UCF_RUNTIME_H */
