/* ucf runtime helpers for generated C kernels.
 *
 * Generated sources carry this header inline, so a saved kernel compiles on
 * its own; keep everything here static inline and C99.
 */
#ifndef UCF_RUNTIME_H
#define UCF_RUNTIME_H
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* OpenMP directives vanish when the file is compiled without OpenMP. */
#ifdef _OPENMP
#define UCF_OMP(directive) _Pragma(directive)
#else
#define UCF_OMP(directive)
#endif

static inline int64_t ucf_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ucf_max(int64_t a, int64_t b) { return a > b ? a : b; }

#endif /* UCF_RUNTIME_H */
