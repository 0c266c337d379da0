// delta_net / delta_net_gates dispatchers. The reference is always the recurrent loop; the fast CPU
// path picks the recurrent or the chunked form. v may be a row-strided view; everything else is
// contiguous.
#include "ops/delta_net.h"

#include "ops/op_check.h"
#include "ops/op_impl.h"

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

Status delta_net(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& g, const TensorView& beta, const TensorView& state,
                 const TensorView& out, DeltaNetMode mode) {
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

}  // namespace ds
