// Helpers for op tests: random F32 tensors, NaN-poisoned outputs, reference-vs-fast comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "ops/delta_net.h"
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

// The inputs of one delta_net_prep call (random) and its outputs (NaN), host tensors.
struct PrepCase {
  int64_t nk, nv, dk, kernel, n;
  int64_t n_ch() const { return 2 * nk * dk + nv * dk; }
};
struct PrepIO {
  Host mixed, w, st, alpha, b, dt_bias, ssm_a, conv, q, k, g, beta;
  explicit PrepIO(const PrepCase& c)
      : mixed({c.n_ch(), c.n}), w({c.kernel, c.n_ch()}), st({c.n_ch(), c.kernel - 1}), alpha({c.nv, c.n}),
        b({c.nv, c.n}), dt_bias({c.nv}), ssm_a({c.nv}), conv({c.n_ch(), c.n}), q({c.dk, c.nk, c.n}),
        k({c.dk, c.nk, c.n}), g({c.nv, c.n}), beta({c.nv, c.n}) {}
  PrepIO(const PrepIO& o) = delete;
  // Random inputs; alpha up to alpha_hi (past 20: softplus's linear branch).
  void randomize(std::mt19937& rng, float alpha_hi) {
    mixed.random(rng, -3, 3);
    w.random(rng);
    st.random(rng);
    alpha.random(rng, -4, alpha_hi);
    b.random(rng, -4, 4);
    dt_bias.random(rng, -1, 1);
    ssm_a.random(rng, -2, -0.1f);
  }
  // The call's arguments, each tensor through `view` (the host tensor itself, or a device copy).
  template <typename View>
  DeltaNetPrep args(float eps, View view) const {
    DeltaNetPrep p;
    p.mixed = view(mixed);
    p.conv_w = view(w);
    p.alpha = view(alpha);
    p.b = view(b);
    p.dt_bias = view(dt_bias);
    p.ssm_a = view(ssm_a);
    p.conv_state = view(st);
    p.eps = eps;
    p.conv = view(conv);
    p.q = view(q);
    p.k = view(k);
    p.g = view(g);
    p.beta = view(beta);
    return p;
  }
  DeltaNetPrep args(float eps) const {
    return args(eps, [](const Host& h) { return h.t; });
  }
};

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
