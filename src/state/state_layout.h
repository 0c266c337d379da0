// StateLayout: the shape of one sequence's state (which layers hold attention KV, which hold DeltaNet
// conv and SSM state, and their dimensions). The state module knows nothing about models; a model
// describes its state with this struct. Non-obvious choice: the fingerprint covers the model identity
// and every dimension, so a serialized state can only be loaded into the exact same layout.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace ds {

enum class LayerStateKind : uint8_t { kAttention = 0, kRecurrent = 1 };

struct StateLayout {
  std::vector<LayerStateKind> kinds;  // per layer
  // attention KV, per attention layer: K and V [kv_chunk_tokens, n_head_kv, head_dim] (kv_dtype) per chunk
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t kv_chunk_tokens = 64;       // tokens per KV chunk (block table granularity)
  DType kv_dtype = DType::F32;        // F32, F16 (half the memory), Q8_0 (34 bytes per 32 elements) or
                                      // Q4_0 (18 bytes per 32; both head_dim a multiple of 32): each
                                      // (position, head) row is head_dim / 32 consecutive blocks
  // DeltaNet, per recurrent layer: conv state [(conv_kernel - 1), conv_dim], SSM state [nv, dk, dv]
  int64_t conv_kernel = 0;
  int64_t conv_dim = 0;
  int64_t ssm_dk = 0;
  int64_t ssm_dv = 0;
  int64_t ssm_nv = 0;
  int64_t n_vocab = 0;                // last logits
  int64_t n_ctx = 0;                  // maximum tokens per sequence
  uint64_t model_fingerprint = 0;     // identity of the weights and architecture

  int64_t n_layer() const { return static_cast<int64_t>(kinds.size()); }
  int64_t n_attention_layers() const;
  int64_t conv_state_floats() const { return (conv_kernel - 1) * conv_dim; }
  int64_t ssm_state_floats() const { return ssm_nv * ssm_dk * ssm_dv; }
  // Bytes of one position's K (or V) in one attention layer: n_head_kv rows of head_dim kv_dtype elements.
  int64_t kv_row_bytes() const { return n_head_kv * dtype_row_bytes(kv_dtype, head_dim); }
  // Bytes of one KV chunk slot: K and V of every attention layer.
  int64_t kv_slot_bytes() const { return n_attention_layers() * 2 * kv_chunk_tokens * kv_row_bytes(); }
  uint64_t fingerprint() const;
};

}  // namespace ds
