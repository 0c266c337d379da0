// Scalar reference of rms_norm / l2_norm (double accumulation).
#include <cmath>

#include "ops/op_impl.h"

namespace ds::ops::ref {

void rms_norm(const OpContext&, const TensorView& x, const float* w, float eps, bool l2, const TensorView& y) {
  const int64_t n = x.ne[0], rows = x.n_rows();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.as<float>() + r * n;
    float* yr = y.as<float>() + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double denom = l2 ? std::sqrt(ss + eps) : std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      const double v = xr[i] / denom;
      yr[i] = static_cast<float>(w ? v * w[i] : v);
    }
  }
}

}  // namespace ds::ops::ref
