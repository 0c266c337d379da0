// Scalar reference of partial NeoX RoPE: angles computed in double from the formula.
#include <cmath>

#include "ops/op_impl.h"

namespace ds::ops::ref {

void rope_neox(const OpContext&, const TensorView& x, int64_t n_rot, float base, int64_t pos0) {
  const int64_t head_dim = x.ne[0], n_head = x.ne[1], n_tokens = x.ne[2], half = n_rot / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const double pos = static_cast<double>(pos0 + t);
    for (int64_t h = 0; h < n_head; ++h) {
      float* v = x.as<float>() + (t * n_head + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double theta = pos * std::pow(static_cast<double>(base), -2.0 * i / n_rot);
        const double c = std::cos(theta), s = std::sin(theta);
        const double x0 = v[i], x1 = v[i + half];
        v[i] = static_cast<float>(x0 * c - x1 * s);
        v[i + half] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace ds::ops::ref
