// Scalar reference of the causal depthwise conv1d with carried state.
#include <vector>

#include "ops/op_impl.h"

namespace ds::ops::ref {

void conv1d_causal(const OpContext&, const TensorView& x, const TensorView& w, const TensorView& state,
                   const TensorView& y) {
  const int64_t n_ch = x.ne[0], n_tokens = x.ne[1], kernel = w.ne[0];
  // in[p] for p in [-(K-1), n_tokens): the state then x.
  auto in = [&](int64_t p, int64_t c) {
    return p < 0 ? state.as<float>()[(p + kernel - 1) * n_ch + c] : x.as<float>()[p * n_ch + c];
  };
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t c = 0; c < n_ch; ++c) {
      double acc = 0.0;
      for (int64_t i = 0; i < kernel; ++i) acc += static_cast<double>(w.as<float>()[c * kernel + i]) * in(t - (kernel - 1) + i, c);
      y.as<float>()[t * n_ch + c] = static_cast<float>(acc);
    }
  }
  // New state: the last K-1 inputs.
  std::vector<float> next(static_cast<size_t>((kernel - 1) * n_ch));
  for (int64_t r = 0; r < kernel - 1; ++r) {
    for (int64_t c = 0; c < n_ch; ++c) next[r * n_ch + c] = in(n_tokens - (kernel - 1) + r, c);
  }
  for (size_t i = 0; i < next.size(); ++i) state.as<float>()[i] = next[i];
}

}  // namespace ds::ops::ref
