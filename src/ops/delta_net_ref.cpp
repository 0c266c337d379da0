// Scalar reference of the gated delta rule (recurrent form, exactly the spec's loop) and its gates.
#include <cmath>
#include <vector>

#include "ops/op_impl.h"

namespace ds::ops::ref {

void delta_net_gates(const OpContext&, const TensorView& alpha, const TensorView& b, const float* dt_bias,
                     const float* ssm_a, const TensorView& g, const TensorView& beta) {
  const int64_t nv = alpha.ne[0], rows = alpha.n_rows();
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t i = t * nv + h;
      const double a = static_cast<double>(alpha.as<float>()[i]) + dt_bias[h];
      const double softplus = a > 20.0 ? a : std::log1p(std::exp(a));
      g.as<float>()[i] = static_cast<float>(ssm_a[h] * softplus);
      beta.as<float>()[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(b.as<float>()[i]))));
    }
  }
}

void delta_net_recurrent(const OpContext&, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& g, const TensorView& beta, const TensorView& state,
                         const TensorView& out) {
  const int64_t dk = q.ne[0], nk = q.ne[1], n_tokens = q.ne[2], dv = v.ne[0], nv = v.ne[1];
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  std::vector<double> kv(static_cast<size_t>(dv));
  for (int64_t h = 0; h < nv; ++h) {
    float* S = state.as<float>() + h * dk * dv;  // S[i * dv + j], i over dk, j over dv
    const int64_t hk = h % nk;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* qt = q.as<float>() + (t * nk + hk) * dk;
      const float* kt = k.as<float>() + (t * nk + hk) * dk;
      const float* vt = reinterpret_cast<const float*>(v.as<uint8_t>() + t * v.nb[2] + h * v.nb[1]);
      const double decay = std::exp(static_cast<double>(g.as<float>()[t * nv + h]));
      const double bt = beta.as<float>()[t * nv + h];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] = static_cast<float>(S[i] * decay);
      for (int64_t j = 0; j < dv; ++j) {  // kv = S^T k
        double acc = 0.0;
        for (int64_t i = 0; i < dk; ++i) acc += static_cast<double>(S[i * dv + j]) * kt[i];
        kv[j] = acc;
      }
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j) {
          S[i * dv + j] = static_cast<float>(S[i * dv + j] + kt[i] * bt * (vt[j] - kv[j]));
        }
      }
      float* ot = out.as<float>() + (t * nv + h) * dv;
      for (int64_t j = 0; j < dv; ++j) {
        double acc = 0.0;
        for (int64_t i = 0; i < dk; ++i) acc += static_cast<double>(S[i * dv + j]) * qt[i];
        ot[j] = static_cast<float>(acc * scale);
      }
    }
  }
}

}  // namespace ds::ops::ref
