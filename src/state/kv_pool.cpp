// KvPool: lazily allocated KV slots with a free list.
#include "state/kv_pool.h"

#include "core/check.h"

namespace ds {

KvPool::KvPool(const StateLayout& layout, Device device, int64_t max_slots)
    : layout_(layout), device_(device), max_slots_(max_slots) {}

int64_t KvPool::used_slots() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(slots_.size() - free_.size());
}

Result<int32_t> KvPool::slot_alloc() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!free_.empty()) {
    const int32_t s = free_.back();
    free_.pop_back();
    in_use_[static_cast<size_t>(s)] = true;
    return s;
  }
  if (static_cast<int64_t>(slots_.size()) >= max_slots_) {
    return resource_exhausted("KV pool: all {} chunk slots of {} tokens are in use", max_slots_,
                              layout_.kv_chunk_tokens);
  }
  DS_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::alloc(device_, layout_.kv_slot_bytes()));
  slots_.push_back(std::move(buf));
  in_use_.push_back(true);
  return static_cast<int32_t>(slots_.size() - 1);
}

void KvPool::slot_free(int32_t slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  DS_CHECK(slot >= 0 && slot < static_cast<int32_t>(slots_.size()) && in_use_[static_cast<size_t>(slot)],
           "KV slot {} freed twice or never allocated", slot);
  in_use_[static_cast<size_t>(slot)] = false;
  free_.push_back(slot);
}

uint8_t* KvPool::slot_data(int32_t slot) const {
  std::lock_guard<std::mutex> lock(mutex_);
  DS_CHECK(slot >= 0 && slot < static_cast<int32_t>(slots_.size()), "bad KV slot {}", slot);
  return static_cast<uint8_t*>(slots_[static_cast<size_t>(slot)].data());
}

TensorView KvPool::k_view(int32_t slot, int64_t attn_index) const {
  return TensorView::contiguous(slot_data(slot) + k_offset(attn_index), layout_.kv_dtype,
                                {layout_.head_dim, layout_.n_head_kv, layout_.kv_chunk_tokens}, device_);
}

TensorView KvPool::v_view(int32_t slot, int64_t attn_index) const {
  return TensorView::contiguous(slot_data(slot) + v_offset(attn_index), layout_.kv_dtype,
                                {layout_.head_dim, layout_.n_head_kv, layout_.kv_chunk_tokens}, device_);
}

}  // namespace ds
