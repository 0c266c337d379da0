// Scalar reference of causal GQA attention: all scores of a query materialized, a plain softmax,
// then the weighted sum of V; double accumulation. KV elements are read as quant::dequantize_row's
// values (F32 as stored, F16 widened, Q8_0 / Q4_0 blocks dequantized), one head row at a time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/op_impl.h"
#include "quant/quant.h"

namespace ds::ops::ref {

void attention(const OpContext&, const TensorView& q, std::span<const TensorView> k_chunks,
               std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,
               const TensorView& o) {
  const int64_t head_dim = q.ne[0], n_head = q.ne[1], n_tokens = q.ne[2];
  const int64_t n_head_kv = k_chunks[0].ne[1], chunk = k_chunks[0].ne[2];
  const int64_t group = n_head / n_head_kv;
  const DType dtype = k_chunks[0].dtype;
  // A head row is whole blocks (the dispatcher checked head_dim against the block size).
  const int64_t row_bytes = dtype_row_bytes(dtype, head_dim);
  // Key / value j of head g as floats: out[0, head_dim).
  auto kv_row = [&](std::span<const TensorView> chunks, int64_t j, int64_t g, float* out) {
    const TensorView& c = chunks[static_cast<size_t>(j / chunk)];
    quant::dequantize_row(dtype, c.as<uint8_t>() + ((j % chunk) * n_head_kv + g) * row_bytes, out, head_dim);
  };
  std::vector<double> p, acc;
  std::vector<float> row(static_cast<size_t>(head_dim));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t n_vis = pos0 + t + 1;  // keys 0..pos0+t
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t g = h / group;
      const float* qh = q.as<float>() + (t * n_head + h) * head_dim;
      p.assign(static_cast<size_t>(n_vis), 0.0);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_vis; ++j) {
        kv_row(k_chunks, j, g, row.data());
        double s = 0.0;
        for (int64_t d = 0; d < head_dim; ++d) s += static_cast<double>(qh[d]) * row[d];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < n_vis; ++j) sum += (p[j] = std::exp(p[j] - mx));
      acc.assign(static_cast<size_t>(head_dim), 0.0);
      for (int64_t j = 0; j < n_vis; ++j) {
        kv_row(v_chunks, j, g, row.data());
        for (int64_t d = 0; d < head_dim; ++d) acc[d] += p[j] * row[d];
      }
      float* oh = o.as<float>() + (t * n_head + h) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) oh[d] = static_cast<float>(acc[d] / sum);
    }
  }
  (void)n_kv;
}

}  // namespace ds::ops::ref
