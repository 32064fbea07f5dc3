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
