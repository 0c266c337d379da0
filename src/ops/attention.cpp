// attention dispatcher: checks q/o shapes, GQA divisibility and that the chunk list covers the
// causal window of the last query.
#include "ops/attention.h"

#include "ops/op_check.h"
#include "ops/op_impl.h"

namespace ds {

bool attention_kv_dtype_supported(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::Q8_0 || t == DType::Q4_0;
}

Status attention(const OpContext& ctx, const TensorView& q, std::span<const TensorView> k_chunks,
                 std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,
                 const TensorView& o) {
  DS_TRY(ops::check_contig("attention", "q", ctx, q, DType::F32));
  DS_TRY(ops::check_contig("attention", "o", ctx, o, DType::F32));
  DS_TRY(ops::check_same_shape("attention", "q", q, "o", o));
  const int64_t head_dim = q.ne[0], n_head = q.ne[1], n_tokens = q.ne[2];
  if (q.ne[3] != 1) return invalid_argument("attention: q {} must be 3-D", q.shape_string());
  if (q.data == o.data && n_tokens > 0) return invalid_argument("attention: o must not alias q");
  if (k_chunks.size() != v_chunks.size() || k_chunks.empty()) {
    return invalid_argument("attention: {} K chunks and {} V chunks", k_chunks.size(), v_chunks.size());
  }
  const TensorView& k0 = k_chunks[0];
  const int64_t n_head_kv = k0.ne[1], chunk_tokens = k0.ne[2];
  if (k0.ne[0] != head_dim || n_head_kv <= 0 || n_head % n_head_kv != 0 || chunk_tokens <= 0) {
    return invalid_argument("attention: K chunk {} does not fit q {} (head_dim, GQA)", k0.shape_string(),
                            q.shape_string());
  }
  if (!attention_kv_dtype_supported(k0.dtype)) {
    return unsupported("attention: KV chunk {}: dtype must be f32, f16, q8_0 or q4_0", k0.shape_string());
  }
  if (head_dim % dtype_block_size(k0.dtype) != 0) {
    return unsupported("attention: KV chunk {}: {} needs head_dim a multiple of {}, not {}", k0.shape_string(),
                       dtype_name(k0.dtype), dtype_block_size(k0.dtype), head_dim);
  }
  for (size_t c = 0; c < k_chunks.size(); ++c) {
    DS_TRY(ops::check_contig("attention", "k chunk", ctx, k_chunks[c], k0.dtype));
    DS_TRY(ops::check_contig("attention", "v chunk", ctx, v_chunks[c], k0.dtype));
    DS_TRY(ops::check_same_shape("attention", "k chunk 0", k0, "k chunk", k_chunks[c]));
    DS_TRY(ops::check_same_shape("attention", "k chunk 0", k0, "v chunk", v_chunks[c]));
  }
  if (pos0 < 0 || n_kv < pos0 + n_tokens || n_kv > static_cast<int64_t>(k_chunks.size()) * chunk_tokens) {
    return invalid_argument("attention: n_kv {} for {} queries at pos0 {} with {} chunks of {}", n_kv, n_tokens,
                            pos0, k_chunks.size(), chunk_tokens);
  }
  if (n_tokens == 0) return Status::ok();
  DS_CUDA_DISPATCH(attention, ctx, q, k_chunks, v_chunks, n_kv, pos0, scale, o);
  if (ctx.reference) {
    ops::ref::attention(ctx, q, k_chunks, v_chunks, n_kv, pos0, scale, o);
  } else {
    ops::cpu::attention(ctx, q, k_chunks, v_chunks, n_kv, pos0, scale, o);
  }
  return Status::ok();
}

}  // namespace ds
