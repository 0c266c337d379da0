// delta_net / delta_net_gates / delta_net_prep dispatchers. The reference is always the recurrent
// loop; the fast CPU path picks the recurrent or the chunked form. v may be a row-strided view;
// everything else is contiguous. delta_net_prep checks every operand itself (its CUDA kernel runs none
// of the four ops' checks) and on the CPU calls the four public ops.
#include "ops/delta_net.h"

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/check.h"
#include "ops/conv1d.h"
#include "ops/op_check.h"
#include "ops/op_impl.h"
#include "ops/rms_norm.h"

namespace ds {

namespace {
constexpr int64_t kChunkedMinTokens = 16;  // below this the chunk setup costs more than it saves
}

Status delta_net_gates(const OpContext& ctx, const TensorView& alpha, const TensorView& b,
                       const TensorView& dt_bias, const TensorView& ssm_a, const TensorView& g,
                       const TensorView& beta) {
  const char* op = "delta_net_gates";
  DS_TRY(ops::check_contig(op, "alpha", ctx, alpha, DType::F32));
  DS_TRY(ops::check_contig(op, "b", ctx, b, DType::F32));
  DS_TRY(ops::check_contig(op, "dt_bias", ctx, dt_bias, DType::F32));
  DS_TRY(ops::check_contig(op, "ssm_a", ctx, ssm_a, DType::F32));
  DS_TRY(ops::check_contig(op, "g", ctx, g, DType::F32));
  DS_TRY(ops::check_contig(op, "beta", ctx, beta, DType::F32));
  DS_TRY(ops::check_same_shape(op, "alpha", alpha, "b", b));
  DS_TRY(ops::check_same_shape(op, "alpha", alpha, "g", g));
  DS_TRY(ops::check_same_shape(op, "alpha", alpha, "beta", beta));
  const int64_t nv = alpha.ne[0];
  if (dt_bias.n_elements() != nv || ssm_a.n_elements() != nv) {
    return invalid_argument("{}: dt_bias {} / ssm_a {} do not match alpha {}", op, dt_bias.shape_string(),
                            ssm_a.shape_string(), alpha.shape_string());
  }
  if (alpha.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(delta_net_gates, ctx, alpha, b, dt_bias, ssm_a, g, beta);
  if (ctx.reference) {
    ops::ref::delta_net_gates(ctx, alpha, b, dt_bias.as<float>(), ssm_a.as<float>(), g, beta);
  } else {
    ops::cpu::delta_net_gates(ctx, alpha, b, dt_bias.as<float>(), ssm_a.as<float>(), g, beta);
  }
  return Status::ok();
}

Status delta_net_check(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& g, const TensorView& beta, const TensorView& state, const TensorView& out) {
  const char* op = "delta_net";
  DS_TRY(ops::check_contig(op, "q", ctx, q, DType::F32));
  DS_TRY(ops::check_contig(op, "k", ctx, k, DType::F32));
  DS_TRY(ops::check_tensor(op, "v", ctx, v, DType::F32));
  // v is only read, so its rows may sit anywhere (a view of a wider row); see the contract.
  if (v.nb[0] != 4 || v.nb[1] % 4 != 0 || v.nb[2] % 4 != 0 || v.nb[1] < 0 || v.nb[2] < 0) {
    return invalid_argument("{}: v {} (strides {}, {}, {}): rows must be contiguous, strides multiples of 4 bytes",
                            op, v.shape_string(), v.nb[0], v.nb[1], v.nb[2]);
  }
  DS_TRY(ops::check_contig(op, "g", ctx, g, DType::F32));
  DS_TRY(ops::check_contig(op, "beta", ctx, beta, DType::F32));
  DS_TRY(ops::check_contig(op, "state", ctx, state, DType::F32));
  DS_TRY(ops::check_contig(op, "out", ctx, out, DType::F32));
  DS_TRY(ops::check_same_shape(op, "q", q, "k", k));
  DS_TRY(ops::check_same_shape(op, "v", v, "out", out));
  const int64_t dk = q.ne[0], nk = q.ne[1], n_tokens = q.ne[2];
  const int64_t dv = v.ne[0], nv = v.ne[1];
  if (v.ne[2] != n_tokens || nk <= 0 || nv % nk != 0 || q.ne[3] != 1 || v.ne[3] != 1) {
    return invalid_argument("{}: q {} and v {} disagree (tokens, nv % nk)", op, q.shape_string(), v.shape_string());
  }
  DS_TRY(ops::check_shape(op, "g", g, nv, n_tokens));
  DS_TRY(ops::check_shape(op, "beta", beta, nv, n_tokens));
  DS_TRY(ops::check_shape(op, "state", state, dv, dk, nv));
  if (out.data == v.data && n_tokens > 0) return invalid_argument("{}: out must not alias v", op);
  return Status::ok();
}

Status delta_net(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& g, const TensorView& beta, const TensorView& state,
                 const TensorView& out, DeltaNetMode mode) {
  DS_TRY(delta_net_check(ctx, q, k, v, g, beta, state, out));
  const int64_t n_tokens = q.ne[2];
  if (n_tokens == 0) return Status::ok();
  DS_CUDA_DISPATCH(delta_net, ctx, q, k, v, g, beta, state, out, mode);
  if (ctx.reference) {
    ops::ref::delta_net_recurrent(ctx, q, k, v, g, beta, state, out);
    return Status::ok();
  }
  const bool chunked = mode == DeltaNetMode::kChunked || (mode == DeltaNetMode::kAuto && n_tokens >= kChunkedMinTokens);
  if (chunked) {
    ops::cpu::delta_net_chunked(ctx, q, k, v, g, beta, state, out);
  } else {
    ops::cpu::delta_net_recurrent(ctx, q, k, v, g, beta, state, out);
  }
  return Status::ok();
}

namespace {

// Byte ranges of two contiguous tensors intersect (empty tensors never do).
bool overlaps(const TensorView& a, const TensorView& b) {
  if (a.n_elements() == 0 || b.n_elements() == 0) return false;
  const auto* a0 = static_cast<const uint8_t*>(a.data);
  const auto* b0 = static_cast<const uint8_t*>(b.data);
  return a0 < b0 + b.n_bytes() && b0 < a0 + a.n_bytes();
}

}  // namespace

TensorView delta_net_conv_heads(const TensorView& t, int64_t c0, int64_t head_dim, int64_t n_head) {
  return row_heads(t, c0, head_dim, n_head, head_dim);
}

Status delta_net_prep_check(const OpContext& ctx, const DeltaNetPrep& p) {
  const char* op = "delta_net_prep";
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"mixed", &p.mixed}, {"conv_w", &p.conv_w}, {"alpha", &p.alpha},   {"b", &p.b},
      {"dt_bias", &p.dt_bias}, {"ssm_a", &p.ssm_a}, {"conv_state", &p.conv_state}};
  const std::pair<const char*, const TensorView*> outputs[] = {
      {"conv", &p.conv}, {"q", &p.q}, {"k", &p.k}, {"g", &p.g}, {"beta", &p.beta}};
  for (const auto& [name, t] : inputs) DS_TRY(ops::check_contig(op, name, ctx, *t, DType::F32));
  for (const auto& [name, t] : outputs) DS_TRY(ops::check_contig(op, name, ctx, *t, DType::F32));

  // conv: mixed, conv [n, C]; conv_w [C, K]; conv_state [K-1, C].
  const int64_t n_ch = p.mixed.ne[0], n_tokens = p.mixed.ne[1], kernel = p.conv_w.ne[0];
  if (p.mixed.ne[2] * p.mixed.ne[3] != 1) {
    return invalid_argument("{}: mixed {} must be 2-D", op, p.mixed.shape_string());
  }
  DS_TRY(ops::check_same_shape(op, "mixed", p.mixed, "conv", p.conv));
  if (kernel < 1) return invalid_argument("{}: conv_w {}: kernel must be >= 1", op, p.conv_w.shape_string());
  DS_TRY(ops::check_shape(op, "conv_w", p.conv_w, kernel, n_ch));
  DS_TRY(ops::check_shape(op, "conv_state", p.conv_state, n_ch, kernel - 1));
  // q, k [n, nk, dk] from the first 2 nk dk conv channels.
  const int64_t dk = p.q.ne[0], nk = p.q.ne[1];
  if (dk < 1 || nk < 1 || 2 * nk * dk > n_ch) {
    return invalid_argument("{}: q {} needs 2 * nk * dk <= {} conv channels (mixed {})", op, p.q.shape_string(), n_ch,
                            p.mixed.shape_string());
  }
  DS_TRY(ops::check_shape(op, "q", p.q, dk, nk, n_tokens));
  DS_TRY(ops::check_same_shape(op, "q", p.q, "k", p.k));
  // gates: alpha, b, g, beta [n, nv]; dt_bias, ssm_a [nv].
  const int64_t nv = p.alpha.ne[0];
  DS_TRY(ops::check_shape(op, "alpha", p.alpha, nv, n_tokens));
  DS_TRY(ops::check_same_shape(op, "alpha", p.alpha, "b", p.b));
  DS_TRY(ops::check_same_shape(op, "alpha", p.alpha, "g", p.g));
  DS_TRY(ops::check_same_shape(op, "alpha", p.alpha, "beta", p.beta));
  if (p.dt_bias.n_elements() != nv || p.ssm_a.n_elements() != nv) {
    return invalid_argument("{}: dt_bias {} / ssm_a {} do not match alpha {}", op, p.dt_bias.shape_string(),
                            p.ssm_a.shape_string(), p.alpha.shape_string());
  }
  // No output overlaps another output or an input (conv_state is both: it is read before it is written,
  // channel by channel, so only the outputs must stay clear of it).
  for (size_t i = 0; i < std::size(outputs); ++i) {
    for (size_t j = i + 1; j < std::size(outputs); ++j) {
      if (overlaps(*outputs[i].second, *outputs[j].second)) {
        return invalid_argument("{}: outputs {} and {} overlap", op, outputs[i].first, outputs[j].first);
      }
    }
    for (const auto& [name, t] : inputs) {
      if (overlaps(*outputs[i].second, *t)) {
        return invalid_argument("{}: output {} overlaps input {}", op, outputs[i].first, name);
      }
    }
  }
  return Status::ok();
}

Status delta_net_prep(const OpContext& ctx, const DeltaNetPrep& p) {
  DS_TRY(delta_net_prep_check(ctx, p));
  const int64_t dk = p.q.ne[0], nk = p.q.ne[1];
  if (p.mixed.ne[1] == 0) return Status::ok();
  DS_CUDA_DISPATCH(delta_net_prep, ctx, p);
  DS_TRY(delta_net_gates(ctx, p.alpha, p.b, p.dt_bias, p.ssm_a, p.g, p.beta));
  DS_TRY(conv1d_causal_silu(ctx, p.mixed, p.conv_w, p.conv_state, p.conv));
  DS_TRY(l2_norm(ctx, delta_net_conv_heads(p.conv, 0, dk, nk), p.eps, p.q));
  return l2_norm(ctx, delta_net_conv_heads(p.conv, nk * dk, dk, nk), p.eps, p.k);
}

}  // namespace ds
