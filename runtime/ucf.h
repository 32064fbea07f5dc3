/* ucf.h: what every exported ucf kernel shares (docs/abi.md).
 *
 * Kernel headers written by `ucf compile -o` (and Kernel.save) include this
 * file, and the export copies it next to them. It holds the ABI version, the
 * error codes the `<name>_check` functions return, and ucf_tensor_t, a plain
 * description of one tensor's storage that programs may use to carry the
 * arrays a kernel takes. C99 and C++.
 */
#ifndef UCF_H
#define UCF_H
#include <stddef.h>
#include <stdint.h>

/* The calling convention's version. The major number changes when a kernel
 * built from the same statement, formats, schedule and dtypes would take
 * different arguments or mean something else by them; the minor number when
 * something is added (a function, an error code) that old callers can ignore. */
#define UCF_ABI_VERSION_MAJOR 2
#define UCF_ABI_VERSION_MINOR 2
#define UCF_ABI_VERSION (UCF_ABI_VERSION_MAJOR * 100 + UCF_ABI_VERSION_MINOR)

/* Error codes: 0 is success, every failure is positive. */
#define UCF_OK 0
#define UCF_ERR_DIM 1           /* a size disagrees with an extent, or is negative */
#define UCF_ERR_POS 2           /* a pos array does not start at 0 or decreases */
#define UCF_ERR_CRD_RANGE 3     /* a coordinate is negative or not below its dimension */
#define UCF_ERR_CRD_ORDER 4     /* coordinates of a segment are not sorted */
#define UCF_ERR_CRD_DUPLICATE 5 /* a coordinate repeats within a segment */
#define UCF_ERR_ALLOC 6         /* malloc failed (the TACO-convention assemble) */
#define UCF_ERR_ARG 7           /* a tensor's order, mode types or csize do not match */
#define UCF_ERR_SCALE 8         /* a quantized operand's scale count, a scale or a zero point */

/* restrict in C, __restrict in C++. */
#ifndef UCF_RESTRICT
#ifdef __cplusplus
#define UCF_RESTRICT __restrict
#else
#define UCF_RESTRICT restrict
#endif
#endif

/* Level kinds, as in format strings. */
typedef enum {
  UCF_LEVEL_DENSE = 'U',      /* no arrays */
  UCF_LEVEL_COMPRESSED = 'C', /* pos and crd */
  UCF_LEVEL_SINGLETON = 'S'   /* crd */
} ucf_level_t;

/* One tensor's storage, as the kernels' arguments take it apart: a kernel
 * argument <T>_dim<m> is dims[m], <T><l>_pos is pos[l], <T><l>_crd is crd[l]
 * and <T>_vals is vals. The arrays of level l hold coordinates of mode
 * mode_order[l]. Index arrays have the kernel's index type (index_size bytes:
 * 4 for int32_t, 8 for int64_t), values its value type (value_size bytes). */
typedef struct {
  int32_t order;              /* number of modes */
  int32_t levels;             /* number of storage levels (order, unless blocked) */
  const int64_t* dims;        /* [order] size of each mode */
  const int32_t* mode_order;  /* [levels] the mode each level stores */
  const ucf_level_t* kinds;   /* [levels] */
  void** pos;                 /* [levels] pos array of a compressed level, else NULL */
  void** crd;                 /* [levels] crd array of a compressed/singleton level, else NULL */
  void* vals;                 /* one value per position of the last level */
  int32_t index_size;         /* bytes per pos/crd entry */
  int32_t value_size;         /* bytes per value */
} ucf_tensor_t;

#endif /* UCF_H */
