// Fast CPU element-wise ops (threads over contiguous ranges; float math; mul_sigmoid reads a
// row-strided gate) and MoE routing.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/moe.h"
#include "ops/op_impl.h"

namespace ds::ops::cpu {

namespace {
constexpr int64_t kGrain = 4096;  // elements per task: below this threading costs more than it saves
inline float sigmoid_f(float v) { return 1.0f / (1.0f + std::exp(-v)); }
}  // namespace

void eltwise(const OpContext& ctx, Eltwise kind, const TensorView& a, const TensorView& b, const TensorView& y) {
  const int64_t n = y.n_elements(), row = y.ne[0];
  const float* pa = a.as<float>();
  const float* pb = b.as<float>();
  float* py = y.as<float>();
  const bool per_row = kind == Eltwise::kMulSigmoid && b.ne[0] == 1 && row != 1;
  // A row-strided gate (mul_sigmoid): element i at pb[(i / row) * b_stride + i % row].
  const int64_t b_stride = !per_row && !b.is_contiguous() ? b.nb[1] / 4 : row;
  auto body = [&](int64_t i0, int64_t i1, int) {
    switch (kind) {
      case Eltwise::kAdd: for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] + pb[i]; break;
      case Eltwise::kMul: for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] * pb[i]; break;
      case Eltwise::kSilu: for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] * sigmoid_f(pa[i]); break;
      case Eltwise::kSigmoid: for (int64_t i = i0; i < i1; ++i) py[i] = sigmoid_f(pa[i]); break;
      case Eltwise::kSwiglu: for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] * sigmoid_f(pa[i]) * pb[i]; break;
      case Eltwise::kMulSigmoid:
        if (b_stride != row) {
          for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] * sigmoid_f(pb[(i / row) * b_stride + i % row]);
        } else {
          for (int64_t i = i0; i < i1; ++i) py[i] = pa[i] * sigmoid_f(per_row ? pb[i / row] : pb[i]);
        }
        break;
    }
  };
  if (n < 2 * kGrain) {
    body(0, n, 0);
  } else {
    ctx.threads().parallel_for(n, body, kGrain);
  }
}

void moe_route(const OpContext& ctx, const TensorView& logits, int64_t k, const TensorView& ids,
               const TensorView& weights) {
  const int64_t n_expert = logits.ne[0], n_tokens = logits.ne[1];
  ctx.threads().parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) {
    std::vector<float> p(static_cast<size_t>(n_expert));
    std::vector<int32_t> order(static_cast<size_t>(n_expert));
    for (int64_t t = t0; t < t1; ++t) {
      const float* l = logits.as<float>() + t * n_expert;
      const float mx = *std::max_element(l, l + n_expert);
      float sum = 0.0f;
      for (int64_t e = 0; e < n_expert; ++e) sum += (p[e] = std::exp(l[e] - mx));
      for (int64_t e = 0; e < n_expert; ++e) p[e] /= sum;
      for (int64_t e = 0; e < n_expert; ++e) order[e] = static_cast<int32_t>(e);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t x, int32_t y) { return p[x] > p[y] || (p[x] == p[y] && x < y); });
      float sel = 0.0f;
      for (int64_t j = 0; j < k; ++j) sel += p[order[j]];
      const float inv = 1.0f / std::max(sel, kMoeWeightSumFloor);
      for (int64_t j = 0; j < k; ++j) {
        ids.as<int32_t>()[t * k + j] = order[j];
        weights.as<float>()[t * k + j] = p[order[j]] * inv;
      }
    }
  });
}

}  // namespace ds::ops::cpu
