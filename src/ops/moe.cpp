// moe_route dispatcher, and moe_ffn: a composite op that gathers the tokens routed to each expert,
// runs that expert's FFN through matmul / swiglu on its slice of the stacked weights, and scatters
// the weighted results back. Non-obvious choice: experts run one after another, each matmul
// parallel over weight rows, so every selected expert's weights stream from memory exactly once.
#include "ops/moe.h"

#include <algorithm>
#include <vector>

#include "ops/device_buffer.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/op_check.h"
#include "ops/op_impl.h"

namespace ds {

Status moe_route(const OpContext& ctx, const TensorView& logits, int64_t k, const TensorView& ids,
                 const TensorView& weights) {
  DS_TRY(ops::check_contig("moe_route", "logits", ctx, logits, DType::F32));
  DS_TRY(ops::check_contig("moe_route", "ids", ctx, ids, DType::I32));
  DS_TRY(ops::check_contig("moe_route", "weights", ctx, weights, DType::F32));
  const int64_t n_expert = logits.ne[0], n_tokens = logits.ne[1];
  if (k < 1 || k > n_expert) return invalid_argument("moe_route: k {} with {} experts", k, n_expert);
  DS_TRY(ops::check_shape("moe_route", "ids", ids, k, n_tokens));
  DS_TRY(ops::check_shape("moe_route", "weights", weights, k, n_tokens));
  if (n_tokens == 0) return Status::ok();
  DS_CUDA_DISPATCH(moe_route, ctx, logits, k, ids, weights);
  if (ctx.reference) {
    ops::ref::moe_route(ctx, logits, k, ids, weights);
  } else {
    ops::cpu::moe_route(ctx, logits, k, ids, weights);
  }
  return Status::ok();
}

namespace {

// Expert e's 2-D slice [rows, cols] of a stacked {cols, rows_total, n_expert} tensor, rows [r0, r0+n).
TensorView expert_slice(const TensorView& t, int64_t e, int64_t r0, int64_t n) {
  TensorView s = t;
  s.data = static_cast<uint8_t*>(t.data) + e * t.nb[2] + r0 * t.nb[1];
  s.n_dims = 2;
  s.ne = {t.ne[0], n, 1, 1};
  s.nb = {t.nb[0], t.nb[1], t.nb[1] * n, t.nb[1] * n};
  return s;
}

Status check_stack(const char* op, const TensorView& t, const char* name, const OpContext& ctx, int64_t ne0,
                   int64_t ne1, int64_t n_expert) {
  DS_TRY(ops::check_tensor(op, name, ctx, t, t.dtype));
  DS_TRY(ops::check_shape(op, name, t, ne0, ne1, n_expert));
  if (t.nb[0] != dtype_block_bytes(t.dtype) || t.nb[1] < t.row_bytes() || t.nb[2] < t.nb[1] * ne1) {
    return invalid_argument("{}: {} {} has overlapping rows", op, name, t.shape_string());
  }
  return Status::ok();
}

}  // namespace

Status moe_ffn(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
               const TensorView& weights, const TensorView& y) {
  DS_TRY(check_moe_io("moe_ffn", ctx, x, ids, weights, y, ids.ne[0]));
  DS_TRY(check_moe_experts("moe_ffn", ctx, experts, x.ne[0]));
  const int64_t n_embd = x.ne[0], n_tokens = x.ne[1], k = ids.ne[0];
  const int64_t n_ff = experts.down.ne[0], n_expert = experts.down.ne[2];
  const bool fused = experts.gate_up.data != nullptr;
  if (n_tokens == 0) return Status::ok();
  DS_CUDA_DISPATCH(moe_ffn, ctx, x, experts, ids, weights, y);

  // Group (token, slot) pairs by expert.
  const int32_t* id = ids.as<int32_t>();
  const float* w = weights.as<float>();
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(n_expert));
  for (int64_t i = 0; i < n_tokens * k; ++i) {
    if (id[i] < 0 || id[i] >= n_expert) {
      return invalid_argument("moe_ffn: expert id {} at token {} is outside [0, {})", id[i], i / k, n_expert);
    }
    routed[static_cast<size_t>(id[i])].push_back(i);
  }
  if (!ctx.reference) {
    ops::cpu::moe_ffn(ctx, x, experts, routed, k, w, y);
    return Status::ok();
  }
  // Reference: each expert through the public ops, one after another.
  int64_t max_m = 0;
  for (const auto& r : routed) max_m = std::max<int64_t>(max_m, static_cast<int64_t>(r.size()));
  const int64_t floats = max_m * (2 * n_embd + 2 * n_ff);
  DS_ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::alloc(ctx.device, floats * 4));
  float* base = static_cast<float*>(scratch.data());
  float* xg = base;
  float* hg = xg + max_m * n_embd;
  float* hu = hg + max_m * n_ff;
  float* out = hu + max_m * n_ff;

  float* yd = y.as<float>();
  std::fill(yd, yd + n_tokens * n_embd, 0.0f);
  const float* xd = x.as<float>();
  for (int64_t e = 0; e < n_expert; ++e) {
    const auto& r = routed[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(r.size());
    if (m == 0) continue;
    for (int64_t i = 0; i < m; ++i) std::copy_n(xd + (r[i] / k) * n_embd, n_embd, xg + i * n_embd);
    const TensorView xv = TensorView::contiguous(xg, DType::F32, {n_embd, m}, ctx.device);
    const TensorView gv = TensorView::contiguous(hg, DType::F32, {n_ff, m}, ctx.device);
    const TensorView uv = TensorView::contiguous(hu, DType::F32, {n_ff, m}, ctx.device);
    const TensorView ov = TensorView::contiguous(out, DType::F32, {n_embd, m}, ctx.device);
    if (fused) {
      DS_TRY(matmul(ctx, expert_slice(experts.gate_up, e, 0, n_ff), xv, gv));
      DS_TRY(matmul(ctx, expert_slice(experts.gate_up, e, n_ff, n_ff), xv, uv));
    } else {
      DS_TRY(matmul(ctx, expert_slice(experts.gate, e, 0, n_ff), xv, gv));
      DS_TRY(matmul(ctx, expert_slice(experts.up, e, 0, n_ff), xv, uv));
    }
    DS_TRY(swiglu(ctx, gv, uv, gv));
    DS_TRY(matmul(ctx, expert_slice(experts.down, e, 0, n_embd), gv, ov));
    for (int64_t i = 0; i < m; ++i) {
      float* yt = yd + (r[i] / k) * n_embd;
      const float wt = w[r[i]];
      const float* o = out + i * n_embd;
      for (int64_t c = 0; c < n_embd; ++c) yt[c] += wt * o[c];
    }
  }
  return Status::ok();
}

Status check_moe_io(const char* op, const OpContext& ctx, const TensorView& x, const TensorView& ids,
                    const TensorView& weights, const TensorView& y, int64_t k) {
  DS_TRY(ops::check_contig(op, "x", ctx, x, DType::F32));
  DS_TRY(ops::check_contig(op, "y", ctx, y, DType::F32));
  DS_TRY(ops::check_same_shape(op, "x", x, "y", y));
  DS_TRY(ops::check_contig(op, "ids", ctx, ids, DType::I32));
  DS_TRY(ops::check_contig(op, "weights", ctx, weights, DType::F32));
  const int64_t n_tokens = x.ne[1];
  if (x.data == y.data && n_tokens > 0) return invalid_argument("{}: y must not alias x", op);
  DS_TRY(ops::check_shape(op, "ids", ids, k, n_tokens));
  DS_TRY(ops::check_shape(op, "weights", weights, k, n_tokens));
  return Status::ok();
}

Status check_moe_experts(const char* op, const OpContext& ctx, const MoeExperts& experts, int64_t n_embd) {
  const int64_t n_ff = experts.down.ne[0], n_expert = experts.down.ne[2];
  DS_TRY(check_stack(op, experts.down, "down", ctx, n_ff, n_embd, n_expert));
  if (experts.gate_up.data != nullptr) return check_stack(op, experts.gate_up, "gate_up", ctx, n_embd, 2 * n_ff, n_expert);
  DS_TRY(check_stack(op, experts.gate, "gate", ctx, n_embd, n_ff, n_expert));
  return check_stack(op, experts.up, "up", ctx, n_embd, n_ff, n_expert);
}

}  // namespace ds
