// Scalar reference of the element-wise family (double math, rounded once).
#include <cmath>

#include "ops/op_impl.h"

namespace ds::ops::ref {

namespace {
double sigmoid_d(double v) { return 1.0 / (1.0 + std::exp(-v)); }
}  // namespace

void eltwise(const OpContext&, Eltwise kind, const TensorView& a, const TensorView& b, const TensorView& y) {
  const int64_t n = y.n_elements(), row = y.ne[0];
  const float* pa = a.as<float>();
  const float* pb = b.as<float>();
  float* py = y.as<float>();
  const bool per_row = kind == Eltwise::kMulSigmoid && b.ne[0] == 1 && row != 1;
  // A row-strided gate (mul_sigmoid): element i at pb[(i / row) * b_stride + i % row].
  const int64_t b_stride = !per_row && !b.is_contiguous() ? b.nb[1] / 4 : row;
  for (int64_t i = 0; i < n; ++i) {
    const double x = pa[i];
    const double u = per_row ? pb[i / row] : pb[(i / row) * b_stride + i % row];
    double r = 0.0;
    switch (kind) {
      case Eltwise::kAdd: r = x + u; break;
      case Eltwise::kMul: r = x * u; break;
      case Eltwise::kSilu: r = x * sigmoid_d(x); break;
      case Eltwise::kSigmoid: r = sigmoid_d(x); break;
      case Eltwise::kSwiglu: r = x * sigmoid_d(x) * u; break;
      case Eltwise::kMulSigmoid: r = x * sigmoid_d(u); break;
    }
    py[i] = static_cast<float>(r);
  }
}

}  // namespace ds::ops::ref
