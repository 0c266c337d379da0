// KvPool: physical slots of attention KV, each holding kv_chunk_tokens tokens of K and V for every
// attention layer of a layout. Sequences map their logical chunks to slots through a block table.
// Non-obvious choice: a slot spans all attention layers of the layout, so one block table serves
// every layer and a snapshot copies whole slots; slots are allocated lazily up to max_slots.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"
#include "ops/device_buffer.h"
#include "state/state_layout.h"

namespace ds {

class KvPool {
 public:
  // max_slots bounds the pool (0 = enough for n_ctx tokens of `max_sequences` sequences).
  KvPool(const StateLayout& layout, Device device, int64_t max_slots);

  const StateLayout& layout() const { return layout_; }
  Device device() const { return device_; }
  int64_t max_slots() const { return max_slots_; }
  int64_t used_slots() const;

  // kResourceExhausted when every slot is taken.
  Result<int32_t> slot_alloc();
  void slot_free(int32_t slot);

  // K or V of one attention layer (index among attention layers) in a slot:
  // [kv_chunk_tokens, n_head_kv, head_dim] of kv_dtype, i.e. ne {head_dim, n_head_kv, kv_chunk_tokens}
  // (for Q8_0 / Q4_0, nb[0] is the 34- / 18-byte block and a head row is head_dim / 32 blocks).
  TensorView k_view(int32_t slot, int64_t attn_index) const;
  TensorView v_view(int32_t slot, int64_t attn_index) const;
  uint8_t* slot_data(int32_t slot) const;  // kv_slot_bytes() bytes
  // Byte offsets of that K / V inside every slot: slot layout is [attn layer][K, V][chunk tokens].
  int64_t k_offset(int64_t attn_index) const { return 2 * attn_index * kv_bytes_per_layer(); }
  int64_t v_offset(int64_t attn_index) const { return (2 * attn_index + 1) * kv_bytes_per_layer(); }
  // Bytes of one layer's K (or V) in a slot: kv_chunk_tokens position rows (StateLayout::kv_row_bytes).
  int64_t kv_bytes_per_layer() const { return layout_.kv_chunk_tokens * layout_.kv_row_bytes(); }

 private:
  StateLayout layout_;
  Device device_;
  int64_t max_slots_;
  mutable std::mutex mutex_;  // protects slots_, free_, in_use_
  std::vector<DeviceBuffer> slots_;
  std::vector<int32_t> free_;
  std::vector<bool> in_use_;
};

}  // namespace ds
