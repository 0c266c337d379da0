// Scalar reference of MoE routing: softmax in double, selection by repeated arg-max (ties to the
// lower index), renormalization with the 6.1e-5 floor.
#include <cmath>
#include <vector>

#include "ops/moe.h"
#include "ops/op_impl.h"

namespace ds::ops::ref {

void moe_route(const OpContext&, const TensorView& logits, int64_t k, const TensorView& ids,
               const TensorView& weights) {
  const int64_t n_expert = logits.ne[0], n_tokens = logits.ne[1];
  std::vector<double> p(static_cast<size_t>(n_expert));
  std::vector<bool> taken(static_cast<size_t>(n_expert));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits.as<float>() + t * n_expert;
    double mx = -INFINITY, sum = 0.0;
    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, static_cast<double>(l[e]));
    for (int64_t e = 0; e < n_expert; ++e) sum += (p[e] = std::exp(l[e] - mx));
    for (int64_t e = 0; e < n_expert; ++e) p[e] /= sum;
    std::fill(taken.begin(), taken.end(), false);
    double sel_sum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < n_expert; ++e) {
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      }
      taken[best] = true;
      ids.as<int32_t>()[t * k + j] = static_cast<int32_t>(best);
      weights.as<float>()[t * k + j] = static_cast<float>(p[best]);
      sel_sum += p[best];
    }
    const double denom = std::max(sel_sum, static_cast<double>(kMoeWeightSumFloor));
    for (int64_t j = 0; j < k; ++j) {
      weights.as<float>()[t * k + j] = static_cast<float>(ids.as<int32_t>()[t * k + j] >= 0
                                                             ? p[ids.as<int32_t>()[t * k + j]] / denom
                                                             : 0.0);
    }
  }
}

}  // namespace ds::ops::ref
