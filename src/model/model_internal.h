// Internal to the model module: the activation scratch arena, view helpers and the per-layer-type
// forwards (layer_attention.cpp, layer_deltanet.cpp, layer_ffn.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace ds {

// Bump allocator for one segment's activations. Non-obvious choice: it grows by adding blocks (freed
// again by the layer's rollback) and, at the next reset, merges into one block of the live high-water
// size, so steady state is a single allocation reused by every segment and layer. `generation` changes whenever a block is allocated: a captured
// CUDA graph holds the addresses it handed out and is valid only while the generation is unchanged.
struct ModelScratch {
  explicit ModelScratch(Device d) : device(d) {}
  Result<TensorView> f32(std::initializer_list<int64_t> ne);
  Result<TensorView> i32(std::initializer_list<int64_t> ne);
  // Outputs [rows[i], n] of products of one input. For one token they are back to back in one
  // allocation (each still a contiguous tensor), so matmul_many runs products whose weights are also
  // adjacent (on CUDA they are uploaded so) as one launch; for more tokens, separate tensors.
  template <size_t N>
  Result<std::array<TensorView, N>> f32_outputs(const int64_t (&rows)[N], int64_t n) {
    std::array<TensorView, N> out;
    if (n != 1) {
      for (size_t i = 0; i < N; ++i) {
        DS_ASSIGN_OR_RETURN(out[i], f32({rows[i], n}));
      }
      return out;
    }
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    DS_ASSIGN_OR_RETURN(const TensorView all, f32({total, 1}));
    int64_t at = 0;
    for (size_t i = 0; i < N; ++i) {
      out[i] = TensorView::contiguous(all.as<float>() + at, DType::F32, {rows[i], 1}, device);
      at += rows[i];
    }
    return out;
  }
  void reset();
  // Everything handed out after a mark is released by rollback (per-layer intermediates).
  struct Mark {
    size_t n_blocks;
    int64_t offset, used_total;
  };
  Mark mark() const;
  void rollback(const Mark& m);

  Device device;
  std::vector<DeviceBuffer> blocks;
  int64_t offset = 0;      // bytes used in blocks.back()
  int64_t used_total = 0;  // bytes live since reset
  int64_t peak = 0;        // most bytes live at once: the size of the merged block
  uint64_t generation = 0; // bumped on every block allocation
};

// Everything a layer forward needs besides its weights.
struct LayerCall {
  const OpContext& ctx;
  const ModelConfig& config;
  ModelScratch& scratch;
  SequenceState& state;
  const DebugHook& hook;
  int64_t il;        // layer index
  int64_t pos0;      // absolute position of the first token
  int64_t n_tokens;
  // CUDA only: pos0 in device memory (what graph-captured kernels read) and a host-side upper bound
  // of pos0 + n_tokens that sizes attention launches (cuda::attention_launch_bound; 0 on the CPU).
  const int32_t* d_pos = nullptr;
  int64_t max_kv = 0;
  // CUDA, one token: the int8 activations of the layer's normalized input, written by the norm that
  // produced it (cuda::add_rms_norm_q8); empty otherwise. layer_matmul_many reads them.
  TensorView x_q8{};
  // Speculative verify, DeltaNet layers: where the layer keeps its per-token inputs for a later
  // replay of its recurrent state (deltanet_stash_floats floats); null otherwise.
  float* stash = nullptr;

  // Reports a named intermediate ("blk.<il>.<what>") to the debug hook, if one is set.
  void dump(const char* what, const TensorView& t) const;
};

// Hands a named tensor to the hook; device tensors (contiguous) are passed as host copies.
void debug_dump(const DebugHook& hook, std::string_view name, const TensorView& t);

// Same data, new contiguous shape (element counts must match).
TensorView reshape(const TensorView& t, std::initializer_list<int64_t> ne);
// Columns [c0, c0 + n) of every row of a contiguous 2-D F32 tensor: a strided view.
TensorView columns(const TensorView& t, int64_t c0, int64_t n);

// matmul_many of the layer's normalized input x_norm: with call.x_q8 the int8-activation products read
// those activations instead of quantizing x_norm again.
Status layer_matmul_many(const LayerCall& call, std::span<const TensorView> ws, const TensorView& x_norm,
                         std::span<const TensorView> ys);

// x_norm, out: [n_tokens, n_embd]. out is overwritten with the mixer / FFN output (before residual).
Status attention_forward(const LayerCall& call, const AttentionWeights& w, int64_t attn_index,
                         const TensorView& x_norm, const TensorView& out);
Status deltanet_forward(const LayerCall& call, const DeltaNetWeights& w, const TensorView& x_norm,
                        const TensorView& out);
// A DeltaNet layer's stash (LayerCall::stash): mixed [kMaxVerifyTokens, conv_dim], then b and a
// [kMaxVerifyTokens, nv] each; a verify of n tokens writes the first n rows of each.
int64_t deltanet_stash_floats(const ModelConfig& c);
// The layer's conv and SSM state advanced through the first call.n_tokens tokens of its stash (the
// same prep and delta rule as deltanet_forward; its output is discarded).
Status deltanet_replay_state(const LayerCall& call, const DeltaNetWeights& w);
Status dense_ffn_forward(const LayerCall& call, const DenseFfnWeights& w, const TensorView& x_norm,
                         const TensorView& out);
// The MoE FFN as an op chain (routing, routed experts, shared expert); the model calls it where
// moe_ffn_fuses_norm does not hold.
Status moe_ffn_forward(const LayerCall& call, const MoeFfnWeights& w, const TensorView& x_norm,
                       const TensorView& out);
// The MoE FFN on its input given as the residual add and norm before it: x += delta, then
// moe_ffn_forward(RMSNorm(x; norm)), with no x_norm written. Only where moe_ffn_fuses_norm (CUDA decode
// through moe_block_decode, whose router kernel computes the norm); out may alias delta.
bool moe_ffn_fuses_norm(const LayerCall& call, const MoeFfnWeights& w);
Status moe_ffn_forward_add_norm(const LayerCall& call, const MoeFfnWeights& w, const TensorView& x,
                                const TensorView& delta, const TensorView& norm, const TensorView& out);

}  // namespace ds
