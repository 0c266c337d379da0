// Helpers for op tests: random F32 tensors, NaN-poisoned outputs, reference-vs-fast comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds::test {

// One tolerance per dtype, stated once: max |fast - ref| / max(1, max |ref|).
constexpr double kTolF32 = 2e-5;   // float vs double accumulation
constexpr double kTolHalf = 2e-3;  // F16 / BF16 weights (activations stay F32)
constexpr double kTolQuant = 3e-2; // quantized weights against 8-bit quantized activations

struct Host {
  std::vector<float> v;
  TensorView t;
  Host(std::initializer_list<int64_t> ne, float fill = std::numeric_limits<float>::quiet_NaN()) {
    int64_t n = 1;
    for (int64_t x : ne) n *= x;
    v.assign(static_cast<size_t>(n), fill);
    t = TensorView::contiguous(v.data(), DType::F32, ne);
  }
  void random(std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (float& x : v) x = d(rng);
  }
  void poison() { std::fill(v.begin(), v.end(), std::numeric_limits<float>::quiet_NaN()); }
};

// Heads [n, n_head, head_dim] at column c0 of every row of the contiguous [n, row] tensor t, heads
// head_stride elements apart: a strided view (the layout of the model's q / k / v and q / gate).
inline TensorView heads_view(const TensorView& t, int64_t c0, int64_t head_dim, int64_t n_head, int64_t head_stride) {
  TensorView r = t;
  r.data = t.as<float>() + c0;
  r.n_dims = 3;
  r.ne = {head_dim, n_head, t.ne[1], 1};
  r.nb = {4, 4 * head_stride, t.nb[1], t.nb[1] * t.ne[1]};
  return r;
}

inline OpContext ref_ctx() {
  OpContext c;
  c.reference = true;
  return c;
}
inline OpContext fast_ctx() { return OpContext{}; }

// Relative max error; fails on any NaN (an unwritten element) in either.
inline double rel_err(const std::vector<float>& fast, const std::vector<float>& ref) {
  EXPECT_EQ(fast.size(), ref.size());
  double mx = 1.0, err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(fast[i]) || std::isnan(ref[i])) return std::numeric_limits<double>::infinity();
    mx = std::max(mx, static_cast<double>(std::fabs(ref[i])));
  }
  for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(fast[i] - ref[i])));
  return err / mx;
}

}  // namespace ds::test
