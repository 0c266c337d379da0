// Fast CPU row norms (x rows may be strided, y contiguous) and RoPE: threads over rows, 8 partial
// sums so the compiler vectorizes the reduction without -ffast-math; RoPE frequencies computed once
// per call.
#include <cmath>
#include <vector>

#include "ops/op_impl.h"

namespace ds::ops::cpu {

namespace {
float sum_squares(const float* x, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += x[i + l] * x[i + l];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}
}  // namespace

void rms_norm(const OpContext& ctx, const TensorView& x, const float* w, float eps, bool l2, const TensorView& y) {
  const int64_t n = x.ne[0];
  ctx.threads().parallel_for(x.n_rows(), [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i1 = r % x.ne[1], i2 = r / x.ne[1] % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
      const float* xr =
          reinterpret_cast<const float*>(x.as<uint8_t>() + i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]);
      float* yr = y.as<float>() + r * n;
      const float ss = sum_squares(xr, n);
      const float inv = 1.0f / std::sqrt(l2 ? ss + eps : ss / static_cast<float>(n) + eps);
      if (w) {
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
      } else {
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv;
      }
    }
  });
}

void rope_neox(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, int64_t pos0) {
  const int64_t head_dim = x.ne[0], n_head = x.ne[1], n_tokens = x.ne[2], half = n_rot / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(static_cast<double>(base), -2.0 * i / n_rot);
  ctx.threads().parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) {
    std::vector<float> cs(static_cast<size_t>(2 * half));
    for (int64_t t = t0; t < t1; ++t) {
      const double pos = static_cast<double>(pos0 + t);
      for (int64_t i = 0; i < half; ++i) {
        cs[2 * i] = static_cast<float>(std::cos(pos * inv_freq[i]));
        cs[2 * i + 1] = static_cast<float>(std::sin(pos * inv_freq[i]));
      }
      for (int64_t h = 0; h < n_head; ++h) {
        float* v = x.as<float>() + (t * n_head + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = v[i], x1 = v[i + half], c = cs[2 * i], s = cs[2 * i + 1];
          v[i] = x0 * c - x1 * s;
          v[i + half] = x0 * s + x1 * c;
        }
      }
    }
  });
}

}  // namespace ds::ops::cpu
