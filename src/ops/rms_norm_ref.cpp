// Scalar reference of rms_norm / l2_norm (double accumulation); x rows may be strided, y is contiguous.
#include <cmath>

#include "ops/op_impl.h"

namespace ds::ops::ref {

void rms_norm(const OpContext&, const TensorView& x, const float* w, float eps, bool l2, const TensorView& y) {
  const int64_t n = x.ne[0], rows = x.n_rows();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i1 = r % x.ne[1], i2 = r / x.ne[1] % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
    const float* xr = reinterpret_cast<const float*>(x.as<uint8_t>() + i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]);
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
