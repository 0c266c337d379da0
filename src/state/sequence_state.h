// SequenceState: everything one sequence carries between forward passes. Attention KV lives in
// fixed-size chunks behind a block table (logical chunk -> pool slot); each DeltaNet layer has its
// conv state [(K-1), conv_dim] and SSM state [nv, dk, dv]; plus the position and the last logits.
// Non-obvious choices: recurrent state exists only at the current position, so `pos` is both the
// number of tokens in the KV and the point the recurrent state describes. On a device pool the
// state also keeps a device array of slot base addresses indexed by logical chunk (allocated once
// for n_ctx tokens, so its address never changes), updated on the entries kv_reserve changes: device
// kernels and captured CUDA graphs read the block table from there. Logits always live on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/device_buffer.h"
#include "ops/top_k.h"
#include "state/kv_pool.h"
#include "state/state_layout.h"

namespace ds {

class SequenceState {
 public:
  // A fresh state at position 0 (zero recurrent state, no KV chunks) using slots of `pool`.
  static Result<std::unique_ptr<SequenceState>> create(std::shared_ptr<KvPool> pool);
  ~SequenceState();
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  const StateLayout& layout() const { return pool_->layout(); }
  const std::shared_ptr<KvPool>& pool() const { return pool_; }

  int64_t pos() const { return pos_; }
  void set_pos(int64_t pos) { pos_ = pos; }
  // False after loading a KV-only stream: the model must refuse to continue from it.
  bool has_recurrent() const { return has_recurrent_; }
  void set_has_recurrent(bool v) { has_recurrent_ = v; }

  // Makes sure KV chunks exist for tokens [0, n_tokens): kResourceExhausted if the pool is full,
  // kInvalidArgument beyond n_ctx.
  Status kv_reserve(int64_t n_tokens);
  int64_t n_kv_chunks() const { return static_cast<int64_t>(block_table_.size()); }
  const std::vector<int32_t>& block_table() const { return block_table_; }
  // Device pools: device array [ceil(n_ctx / kv_chunk_tokens)] of slot base addresses; entry c is
  // valid for c < n_kv_chunks(). Null on the CPU. Its address is fixed for the state's lifetime.
  const void* const* device_slot_table() const {
    return static_cast<const void* const*>(slot_table_.data());
  }
  // K / V of attention layer `attn_index` in logical chunk `chunk`: ne {head_dim, n_head_kv, chunk_tokens}.
  TensorView k_chunk(int64_t attn_index, int64_t chunk) const;
  TensorView v_chunk(int64_t attn_index, int64_t chunk) const;

  // Recurrent state of layer `layer` (must be a recurrent layer).
  TensorView conv_state(int64_t layer) const;  // ne {conv_dim, conv_kernel - 1}
  TensorView ssm_state(int64_t layer) const;   // ne {dv, dk, nv}
  // The one allocation holding every conv and SSM state (on the pool's device); fixed address.
  void* recurrent_data() const { return recurrent_.data(); }
  int64_t recurrent_bytes() const { return recurrent_.bytes(); }

  // Last logits [n_vocab]; valid after a forward that ended at pos(). Host memory at a fixed address,
  // page-locked for a CUDA pool's device (logits_pinned()), so the device copies a step's logits
  // straight into it.
  std::span<float> logits() { return {static_cast<float*>(logits_.data()), n_logits()}; }
  std::span<const float> logits() const { return {static_cast<const float*>(logits_.data()), n_logits()}; }
  bool logits_pinned() const { return logits_.pinned(); }
  bool logits_valid() const { return logits_valid_; }
  // A step's output is its row of logits, or nothing: either way no best logits (below) of an earlier
  // step stay valid.
  void set_logits_valid(bool v) {
    logits_valid_ = v;
    top_k_valid_ = false;
  }

  // The best kTopKMax logits of the last step, for a step that returned only them: a CUDA decode step
  // while want_top_k() (the engine sets it when its sampler needs no more); logits() is then not
  // valid, until the row is fetched (Model::fetch_logits, which makes the row the step's output).
  // Host memory at a fixed address, page-locked like the logits.
  const TopKResult& top_k() const { return *static_cast<const TopKResult*>(top_k_.data()); }
  TopKResult* top_k_data() { return static_cast<TopKResult*>(top_k_.data()); }
  bool top_k_valid() const { return top_k_valid_; }
  void set_top_k_valid() {
    logits_valid_ = false;
    top_k_valid_ = true;
  }
  bool want_top_k() const { return want_top_k_; }
  void set_want_top_k(bool v) { want_top_k_ = v; }

  // Back to position 0: frees the KV chunks, zeroes recurrent state, drops logits. Fails only on a
  // device error (the state is then unusable).
  Status reset();
  // Drops KV chunks past token `n_tokens` and sets pos (recurrent state is not rewound: callers
  // restore it from a snapshot). Used by deserialization and rollback.
  void kv_truncate(int64_t n_tokens);

  // A deep copy with its own KV slots from the same pool.
  Result<std::unique_ptr<SequenceState>> fork() const;

 private:
  explicit SequenceState(std::shared_ptr<KvPool> pool);
  std::shared_ptr<KvPool> pool_;
  std::vector<int32_t> block_table_;     // logical chunk -> pool slot
  std::vector<int64_t> layer_index_;     // layer -> index among its kind (attention or recurrent)
  DeviceBuffer recurrent_;               // all conv and SSM states, one allocation
  DeviceBuffer slot_table_;              // device pools: const void* per logical chunk (see above)
  int64_t pos_ = 0;
  bool has_recurrent_ = true;
  size_t n_logits() const { return static_cast<size_t>(logits_.bytes()) / sizeof(float); }
  HostBuffer logits_;  // n_vocab floats
  bool logits_valid_ = false;
  HostBuffer top_k_;   // one TopKResult
  bool top_k_valid_ = false, want_top_k_ = false;
};

}  // namespace ds
