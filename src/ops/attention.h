// attention: causal multi-head attention with GQA over a chunked KV cache.
//   q      [n_tokens, n_head, D] (ne {D, n_head, n_tokens}) F32; query t is at position pos0 + t
//   k_chunks, v_chunks: the cache in order, each [chunk_tokens, n_head_kv, D], all of one KV dtype
//          (attention_kv_dtype_supported: F32, F16, or the block types Q8_0 and Q4_0 with D a multiple of
//          32, each head row D / 32 blocks read as quant::dequantize_row's values), all the same size;
//          together they hold n_kv >= pos0 + n_tokens positions (the tail chunk may be partial)
//   o      [n_tokens, n_head, D] F32, overwritten
// o_t,h = softmax_j<=pos0+t (scale * q_t,h . k_j,g) v_j,g with g = h / (n_head / n_head_kv).
// The fast path is tiled over chunks with an online softmax, so memory does not grow with n_kv;
// the reference is a plain full softmax.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

// Whether attention reads KV chunks of dtype t (the KV cache types a model may be opened with).
bool attention_kv_dtype_supported(DType t);

Status attention(const OpContext& ctx, const TensorView& q, std::span<const TensorView> k_chunks,
                 std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,
                 const TensorView& o);

}  // namespace ds
