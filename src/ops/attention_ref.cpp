// Scalar reference of causal GQA attention: all scores of a query materialized, a plain softmax,
// then the weighted sum of V; double accumulation. KV elements are read as floats: F16 widened, Q8_0
// dequantized (code * block scale).
#include <cmath>
#include <vector>

#include "core/half.h"

#include "ops/op_impl.h"
#include "quant/blocks.h"

namespace ds::ops::ref {

void attention(const OpContext&, const TensorView& q, std::span<const TensorView> k_chunks,
               std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,
               const TensorView& o) {
  const int64_t head_dim = q.ne[0], n_head = q.ne[1], n_tokens = q.ne[2];
  const int64_t n_head_kv = k_chunks[0].ne[1], chunk = k_chunks[0].ne[2];
  const int64_t group = n_head / n_head_kv;
  const DType dtype = k_chunks[0].dtype;
  // Element d of key/value j, head g, as a float. A Q8_0 head row is whole blocks (head_dim % 32 == 0),
  // so element i of the chunk is element i % 32 of its block i / 32.
  auto kv = [&](std::span<const TensorView> chunks, int64_t j, int64_t g, int64_t d) -> double {
    const int64_t i = ((j % chunk) * n_head_kv + g) * head_dim + d;
    const TensorView& c = chunks[static_cast<size_t>(j / chunk)];
    if (dtype == DType::Q8_0) {
      const quant::BlockQ8_0& b = c.as<quant::BlockQ8_0>()[i / quant::kQK8_0];
      return static_cast<float>(b.qs[i % quant::kQK8_0]) * fp16_to_f32(b.d);
    }
    return dtype == DType::F16 ? fp16_to_f32(c.as<uint16_t>()[i]) : c.as<float>()[i];
  };
  std::vector<double> p;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t n_vis = pos0 + t + 1;  // keys 0..pos0+t
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t g = h / group;
      const float* qh = q.as<float>() + (t * n_head + h) * head_dim;
      p.assign(static_cast<size_t>(n_vis), 0.0);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_vis; ++j) {
        double s = 0.0;
        for (int64_t d = 0; d < head_dim; ++d) s += static_cast<double>(qh[d]) * kv(k_chunks, j, g, d);
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < n_vis; ++j) sum += (p[j] = std::exp(p[j] - mx));
      float* oh = o.as<float>() + (t * n_head + h) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < n_vis; ++j) acc += p[j] * kv(v_chunks, j, g, d);
        oh[d] = static_cast<float>(acc / sum);
      }
    }
  }
  (void)n_kv;
}

}  // namespace ds::ops::ref
