/* Calling ucf kernels from a C program (docs/abi.md).
 *
 * Reads a sparse matrix A from a Matrix Market file into CSR, then runs two
 * kernels exported by `ucf compile -o` (see the Makefile or CMakeLists.txt):
 *   spmv: y(i) = A(i,j) * x(j)
 *   spmm: C(i,k) = A(i,j) * B(j,k)
 * and compares each result with a naive loop over the entries as read.
 *
 *   make && ./embed_c matrix.mtx
 *
 * Prints "y i value" and "C i k value" lines, then the largest difference from
 * the naive loops; exits with status 1 on a mismatch or bad input.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spmm.h"
#include "spmv.h"
#include "ucf.h"

#define NCOLS 4 /* columns of the dense B in C = A * B */

/* The matrix as the file lists it: coordinates and values, in any order. */
typedef struct {
  int64_t rows, cols, nnz;
  int32_t *row, *col;
  double* val;
} Entries;

/* A small Matrix Market reader: "coordinate" matrices with real, integer or
 * pattern values, general or symmetric. Returns 0 on success. */
static int read_mtx(const char* path, Entries* e) {
  FILE* f = fopen(path, "r");
  if (f == NULL) return 1;
  char line[1024], field[64] = "", symmetry[64] = "";
  if (fgets(line, sizeof line, f) == NULL ||
      sscanf(line, "%%%%MatrixMarket matrix coordinate %63s %63s", field, symmetry) != 2) {
    fclose(f);
    return 2;
  }
  int pattern = strcmp(field, "pattern") == 0;
  int symmetric = strcmp(symmetry, "symmetric") == 0;
  do {
    if (fgets(line, sizeof line, f) == NULL) {
      fclose(f);
      return 3;
    }
  } while (line[0] == '%');
  long long rows, cols, listed;
  if (sscanf(line, "%lld %lld %lld", &rows, &cols, &listed) != 3 || listed < 0) {
    fclose(f);
    return 3;
  }
  int64_t cap = symmetric ? 2 * listed : listed;
  e->rows = rows;
  e->cols = cols;
  e->nnz = 0;
  e->row = malloc(sizeof(int32_t) * (size_t)(cap > 0 ? cap : 1));
  e->col = malloc(sizeof(int32_t) * (size_t)(cap > 0 ? cap : 1));
  e->val = malloc(sizeof(double) * (size_t)(cap > 0 ? cap : 1));
  for (long long q = 0; q < listed; q++) {
    long long i, j;
    double v = 1.0;
    int got = pattern ? fscanf(f, "%lld %lld", &i, &j) : fscanf(f, "%lld %lld %lf", &i, &j, &v);
    if (got != (pattern ? 2 : 3) || i < 1 || i > rows || j < 1 || j > cols) {
      fclose(f);
      return 4;
    }
    e->row[e->nnz] = (int32_t)(i - 1);
    e->col[e->nnz] = (int32_t)(j - 1);
    e->val[e->nnz++] = v;
    if (symmetric && i != j) {
      e->row[e->nnz] = (int32_t)(j - 1);
      e->col[e->nnz] = (int32_t)(i - 1);
      e->val[e->nnz++] = v;
    }
  }
  fclose(f);
  return 0;
}

/* CSR arrays for the kernels: rows counted, then each row's columns sorted
 * (the kernels need sorted, unique columns; spmv_check says so if not). */
static void to_csr(const Entries* e, int32_t* pos, int32_t* crd, double* vals) {
  memset(pos, 0, sizeof(int32_t) * (size_t)(e->rows + 1));
  for (int64_t q = 0; q < e->nnz; q++) pos[e->row[q] + 1]++;
  for (int64_t i = 0; i < e->rows; i++) pos[i + 1] += pos[i];
  int32_t* next = malloc(sizeof(int32_t) * (size_t)(e->rows + 1));
  memcpy(next, pos, sizeof(int32_t) * (size_t)(e->rows + 1));
  for (int64_t q = 0; q < e->nnz; q++) {
    int32_t at = next[e->row[q]]++;
    crd[at] = e->col[q];
    vals[at] = e->val[q];
  }
  free(next);
  for (int64_t i = 0; i < e->rows; i++) { /* insertion sort: rows are short */
    for (int32_t q = pos[i] + 1; q < pos[i + 1]; q++) {
      int32_t c = crd[q];
      double v = vals[q];
      int32_t p = q;
      for (; p > pos[i] && crd[p - 1] > c; p--) {
        crd[p] = crd[p - 1];
        vals[p] = vals[p - 1];
      }
      crd[p] = c;
      vals[p] = v;
    }
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MATRIX.mtx\n", argv[0]);
    return 2;
  }
  Entries e;
  int status = read_mtx(argv[1], &e);
  if (status != 0) {
    fprintf(stderr, "%s: cannot read a coordinate Matrix Market file (error %d)\n", argv[1],
            status);
    return 1;
  }
  const int64_t m = e.rows, n = e.cols, nnz = e.nnz;
  int32_t* pos = malloc(sizeof(int32_t) * (size_t)(m + 1));
  int32_t* crd = malloc(sizeof(int32_t) * (size_t)(nnz > 0 ? nnz : 1));
  double* vals = malloc(sizeof(double) * (size_t)(nnz > 0 ? nnz : 1));
  to_csr(&e, pos, crd, vals);

  /* The same CSR described once, as ucf.h's tensor struct: level 1 of A is
   * compressed, and the kernels' A1_pos/A1_crd are its pos[1]/crd[1]. */
  const int64_t dims[2] = {m, n};
  const int32_t mode_order[2] = {0, 1};
  const ucf_level_t kinds[2] = {UCF_LEVEL_DENSE, UCF_LEVEL_COMPRESSED};
  void* level_pos[2] = {NULL, pos};
  void* level_crd[2] = {NULL, crd};
  const ucf_tensor_t A = {2, 2, dims, mode_order, kinds, level_pos, level_crd, vals,
                          (int32_t)sizeof(int32_t), (int32_t)sizeof(double)};
  const int32_t* A1_pos = (const int32_t*)A.pos[1];
  const int32_t* A1_crd = (const int32_t*)A.crd[1];
  const double* A_vals = (const double*)A.vals;

  double* x = malloc(sizeof(double) * (size_t)n);
  double* B = malloc(sizeof(double) * (size_t)(n * NCOLS));
  for (int64_t j = 0; j < n; j++) {
    x[j] = 1.0 + 0.5 * (double)j;
    for (int64_t k = 0; k < NCOLS; k++) B[j * NCOLS + k] = (double)((j + 2 * k) % 5) - 1.5;
  }
  /* Dense outputs are zeroed by the caller (docs/abi.md, "Dense outputs"). */
  double* y = calloc((size_t)(m > 0 ? m : 1), sizeof(double));
  double* C = calloc((size_t)(m * NCOLS > 0 ? m * NCOLS : 1), sizeof(double));

  char msg[256];
  status = spmv_check(m, n, A.dims[0], A.dims[1], A1_pos, A1_crd, A_vals, n, x, msg, sizeof msg);
  if (status != UCF_OK) {
    fprintf(stderr, "spmv_check: error %d: %s\n", status, msg);
    return 1;
  }
  spmv(m, n, A.dims[0], A.dims[1], A1_pos, A1_crd, A_vals, n, x, m, y);
  spmm(m, n, NCOLS, A.dims[0], A.dims[1], A1_pos, A1_crd, A_vals, n, NCOLS, B, m, NCOLS, C);

  /* The naive loops, over the entries in file order. */
  double* y_ref = calloc((size_t)(m > 0 ? m : 1), sizeof(double));
  double* C_ref = calloc((size_t)(m * NCOLS > 0 ? m * NCOLS : 1), sizeof(double));
  for (int64_t q = 0; q < nnz; q++) {
    y_ref[e.row[q]] += e.val[q] * x[e.col[q]];
    for (int64_t k = 0; k < NCOLS; k++)
      C_ref[e.row[q] * NCOLS + k] += e.val[q] * B[e.col[q] * NCOLS + k];
  }
  double err = 0.0;
  for (int64_t i = 0; i < m; i++) {
    printf("y %lld %.17g\n", (long long)i, y[i]);
    err = fmax(err, fabs(y[i] - y_ref[i]));
  }
  for (int64_t i = 0; i < m; i++) {
    for (int64_t k = 0; k < NCOLS; k++) {
      printf("C %lld %lld %.17g\n", (long long)i, (long long)k, C[i * NCOLS + k]);
      err = fmax(err, fabs(C[i * NCOLS + k] - C_ref[i * NCOLS + k]));
    }
  }
  printf("max difference from the naive loops: %g\n", err);
  free(e.row), free(e.col), free(e.val), free(pos), free(crd), free(vals);
  free(x), free(B), free(y), free(C), free(y_ref), free(C_ref);
  return err <= 1e-12 ? 0 : 1;
}
