// Calling ucf kernels from C++ (docs/abi.md).
//
// The same program as examples/embed_c, written the C++ way: the matrices are
// classes that own their arrays (std::vector, so nothing is freed by hand),
// the kernels are wrapped in functions that validate their input with the
// exported *_check function and throw on bad data, and results come back by
// value. The kernels are exported by `ucf compile -o` (see the Makefile or
// CMakeLists.txt):
//   spmv: y(i) = A(i,j) * x(j)
//   spmm: C(i,k) = A(i,j) * B(j,k)
//
//   make && ./embed_cpp ../embed_c/matrix.mtx
//
// Prints "y i value" and "C i k value" lines, then the largest difference from
// naive loops over the entries as read; exits with status 1 on a mismatch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "spmm.h"
#include "spmv.h"
#include "ucf.h"

namespace {

constexpr int64_t kCols = 4;  // columns of the dense B in C = A * B

struct Entry {
  int32_t row, col;
  double val;
};

// The matrix as the file lists it.
struct Coordinates {
  int64_t rows = 0, cols = 0;
  std::vector<Entry> entries;
};

// A small Matrix Market reader: "coordinate" matrices with real, integer or
// pattern values, general or symmetric.
Coordinates read_mtx(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::string line, banner, object, layout, field, symmetry;
  std::getline(in, line);
  std::istringstream(line) >> banner >> object >> layout >> field >> symmetry;
  if (banner != "%%MatrixMarket" || object != "matrix" || layout != "coordinate")
    throw std::runtime_error(path + ": not a coordinate Matrix Market file");
  while (std::getline(in, line) && !line.empty() && line[0] == '%') {
  }
  Coordinates m;
  int64_t listed = 0;
  if (!(std::istringstream(line) >> m.rows >> m.cols >> listed))
    throw std::runtime_error(path + ": bad size line");
  for (int64_t q = 0; q < listed; q++) {
    int64_t i = 0, j = 0;
    double v = 1.0;
    if (!(in >> i >> j) || (field != "pattern" && !(in >> v)) || i < 1 || i > m.rows || j < 1 ||
        j > m.cols)
      throw std::runtime_error(path + ": bad entry " + std::to_string(q + 1));
    m.entries.push_back({int32_t(i - 1), int32_t(j - 1), v});
    if (symmetry == "symmetric" && i != j) m.entries.push_back({int32_t(j - 1), int32_t(i - 1), v});
  }
  return m;
}

// CSR with sorted columns, as the kernels need them.
class Csr {
 public:
  explicit Csr(const Coordinates& m) : rows_(m.rows), cols_(m.cols), pos_(m.rows + 1, 0) {
    std::vector<Entry> sorted = m.entries;
    std::sort(sorted.begin(), sorted.end(), [](const Entry& a, const Entry& b) {
      return a.row != b.row ? a.row < b.row : a.col < b.col;
    });
    for (const Entry& e : sorted) {
      pos_[e.row + 1]++;
      crd_.push_back(e.col);
      vals_.push_back(e.val);
    }
    for (int64_t i = 0; i < rows_; i++) pos_[i + 1] += pos_[i];
  }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  const int32_t* pos() const { return pos_.data(); }
  const int32_t* crd() const { return crd_.data(); }
  const double* vals() const { return vals_.data(); }

 private:
  int64_t rows_, cols_;
  std::vector<int32_t> pos_, crd_;
  std::vector<double> vals_;
};

// A row-major dense matrix.
struct Dense {
  Dense(int64_t r, int64_t c) : rows(r), cols(c), data(r * c, 0.0) {}
  double& operator()(int64_t i, int64_t k) { return data[i * cols + k]; }
  double operator()(int64_t i, int64_t k) const { return data[i * cols + k]; }
  int64_t rows, cols;
  std::vector<double> data;
};

std::vector<double> multiply(const Csr& A, const std::vector<double>& x) {
  const int64_t m = A.rows(), n = A.cols();
  char msg[256] = "";
  int status = spmv_check(m, n, m, n, A.pos(), A.crd(), A.vals(), int64_t(x.size()), x.data(),
                          msg, sizeof msg);
  if (status != UCF_OK) throw std::invalid_argument("spmv: " + std::string(msg));
  std::vector<double> y(m, 0.0);  // dense outputs start zeroed
  spmv(m, n, m, n, A.pos(), A.crd(), A.vals(), n, x.data(), m, y.data());
  return y;
}

Dense multiply(const Csr& A, const Dense& B) {
  const int64_t m = A.rows(), n = A.cols();
  char msg[256] = "";
  int status = spmm_check(m, n, B.cols, m, n, A.pos(), A.crd(), A.vals(), B.rows, B.cols,
                          B.data.data(), msg, sizeof msg);
  if (status != UCF_OK) throw std::invalid_argument("spmm: " + std::string(msg));
  Dense C(m, B.cols);
  spmm(m, n, B.cols, m, n, A.pos(), A.crd(), A.vals(), B.rows, B.cols, B.data.data(), m, B.cols,
       C.data.data());
  return C;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " MATRIX.mtx\n";
    return 2;
  }
  try {
    const Coordinates file = read_mtx(argv[1]);
    const Csr A(file);
    std::vector<double> x(A.cols());
    Dense B(A.cols(), kCols);
    for (int64_t j = 0; j < A.cols(); j++) {
      x[j] = 1.0 + 0.5 * double(j);
      for (int64_t k = 0; k < kCols; k++) B(j, k) = double((j + 2 * k) % 5) - 1.5;
    }
    const std::vector<double> y = multiply(A, x);
    const Dense C = multiply(A, B);

    std::vector<double> y_ref(A.rows(), 0.0);
    Dense C_ref(A.rows(), kCols);
    for (const Entry& e : file.entries) {
      y_ref[e.row] += e.val * x[e.col];
      for (int64_t k = 0; k < kCols; k++) C_ref(e.row, k) += e.val * B(e.col, k);
    }
    double err = 0.0;
    for (int64_t i = 0; i < A.rows(); i++) {
      std::printf("y %lld %.17g\n", static_cast<long long>(i), y[i]);
      err = std::max(err, std::fabs(y[i] - y_ref[i]));
    }
    for (int64_t i = 0; i < A.rows(); i++) {
      for (int64_t k = 0; k < kCols; k++) {
        std::printf("C %lld %lld %.17g\n", static_cast<long long>(i), static_cast<long long>(k),
                    C(i, k));
        err = std::max(err, std::fabs(C(i, k) - C_ref(i, k)));
      }
    }
    std::printf("max difference from the naive loops: %g\n", err);
    return err <= 1e-12 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
