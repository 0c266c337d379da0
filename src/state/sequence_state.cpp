// SequenceState: block table over the KV pool (mirrored on the device for device pools), one
// allocation for all recurrent state.
#include "state/sequence_state.h"

#include <cstring>
#include <vector>

#include "core/check.h"

namespace ds {

SequenceState::SequenceState(std::shared_ptr<KvPool> pool) : pool_(std::move(pool)) {}

SequenceState::~SequenceState() {
  for (int32_t s : block_table_) pool_->slot_free(s);
}

Result<std::unique_ptr<SequenceState>> SequenceState::create(std::shared_ptr<KvPool> pool) {
  DS_CHECK(pool != nullptr, "SequenceState needs a pool");
  std::unique_ptr<SequenceState> st(new SequenceState(std::move(pool)));
  const StateLayout& l = st->layout();
  int64_t n_attn = 0, n_rec = 0;
  for (LayerStateKind k : l.kinds) st->layer_index_.push_back(k == LayerStateKind::kAttention ? n_attn++ : n_rec++);
  const int64_t floats = n_rec * (l.conv_state_floats() + l.ssm_state_floats());
  DS_ASSIGN_OR_RETURN(st->recurrent_, DeviceBuffer::alloc(st->pool_->device(), floats * 4, /*zero=*/true));
  if (st->pool_->device().kind != DeviceKind::kCpu && n_attn > 0) {
    const int64_t entries = (l.n_ctx + l.kv_chunk_tokens - 1) / l.kv_chunk_tokens;
    DS_ASSIGN_OR_RETURN(st->slot_table_,
                        DeviceBuffer::alloc(st->pool_->device(), entries * int64_t{sizeof(void*)}, /*zero=*/true));
  }
  DS_ASSIGN_OR_RETURN(st->logits_, HostBuffer::alloc(st->pool_->device(), l.n_vocab * int64_t{4}, /*zero=*/true));
  DS_ASSIGN_OR_RETURN(st->top_k_, HostBuffer::alloc(st->pool_->device(), sizeof(TopKResult), /*zero=*/true));
  return st;
}

Status SequenceState::kv_reserve(int64_t n_tokens) {
  const StateLayout& l = layout();
  if (n_tokens > l.n_ctx) {
    return invalid_argument("sequence of {} tokens exceeds the context of {} tokens", n_tokens, l.n_ctx);
  }
  if (l.n_attention_layers() == 0) return Status::ok();
  const int64_t need = (n_tokens + l.kv_chunk_tokens - 1) / l.kv_chunk_tokens;
  const size_t first_new = block_table_.size();
  Status status = Status::ok();
  while (static_cast<int64_t>(block_table_.size()) < need) {
    Result<int32_t> slot = pool_->slot_alloc();
    if (!slot.is_ok()) {
      status = slot.status();
      break;
    }
    block_table_.push_back(*slot);
  }
  if (!slot_table_.empty() && block_table_.size() > first_new) {
    // Mirror the new entries on the device (one copy for the whole range).
    std::vector<const void*> bases;
    for (size_t c = first_new; c < block_table_.size(); ++c) bases.push_back(pool_->slot_data(block_table_[c]));
    DS_CHECK(static_cast<int64_t>(block_table_.size() * sizeof(void*)) <= slot_table_.bytes(),
             "KV block table of {} chunks exceeds the device table of {} bytes", block_table_.size(),
             slot_table_.bytes());
    DS_TRY(device_copy(static_cast<const void**>(slot_table_.data()) + first_new, slot_table_.device(), bases.data(),
                       Device{}, static_cast<int64_t>(bases.size() * sizeof(void*))));
  }
  return status;
}

TensorView SequenceState::k_chunk(int64_t attn_index, int64_t chunk) const {
  DS_CHECK(chunk >= 0 && chunk < n_kv_chunks(), "KV chunk {} of {}", chunk, n_kv_chunks());
  return pool_->k_view(block_table_[static_cast<size_t>(chunk)], attn_index);
}

TensorView SequenceState::v_chunk(int64_t attn_index, int64_t chunk) const {
  DS_CHECK(chunk >= 0 && chunk < n_kv_chunks(), "KV chunk {} of {}", chunk, n_kv_chunks());
  return pool_->v_view(block_table_[static_cast<size_t>(chunk)], attn_index);
}

TensorView SequenceState::conv_state(int64_t layer) const {
  const StateLayout& l = layout();
  DS_CHECK(l.kinds[static_cast<size_t>(layer)] == LayerStateKind::kRecurrent, "layer {} is not recurrent", layer);
  float* base = static_cast<float*>(recurrent_.data()) +
                layer_index_[static_cast<size_t>(layer)] * (l.conv_state_floats() + l.ssm_state_floats());
  return TensorView::contiguous(base, DType::F32, {l.conv_dim, l.conv_kernel - 1}, pool_->device());
}

TensorView SequenceState::ssm_state(int64_t layer) const {
  const StateLayout& l = layout();
  DS_CHECK(l.kinds[static_cast<size_t>(layer)] == LayerStateKind::kRecurrent, "layer {} is not recurrent", layer);
  float* base = static_cast<float*>(recurrent_.data()) +
                layer_index_[static_cast<size_t>(layer)] * (l.conv_state_floats() + l.ssm_state_floats()) +
                l.conv_state_floats();
  return TensorView::contiguous(base, DType::F32, {l.ssm_dv, l.ssm_dk, l.ssm_nv}, pool_->device());
}

Status SequenceState::reset() {
  kv_truncate(0);
  has_recurrent_ = true;
  set_logits_valid(false);
  if (!recurrent_.empty()) DS_TRY(device_zero(recurrent_.data(), recurrent_.device(), recurrent_.bytes()));
  return Status::ok();
}

// Entries of the device slot table past the kept chunks go stale; nothing reads them (kernels read
// chunks below pos + n only) and kv_reserve rewrites each one before it is used again.
void SequenceState::kv_truncate(int64_t n_tokens) {
  const int64_t keep = (n_tokens + layout().kv_chunk_tokens - 1) / layout().kv_chunk_tokens;
  while (static_cast<int64_t>(block_table_.size()) > keep) {
    pool_->slot_free(block_table_.back());
    block_table_.pop_back();
  }
  pos_ = n_tokens;
  set_logits_valid(false);
}

Result<std::unique_ptr<SequenceState>> SequenceState::fork() const {
  DS_ASSIGN_OR_RETURN(auto copy, create(pool_));
  DS_TRY(copy->kv_reserve(static_cast<int64_t>(block_table_.size()) * layout().kv_chunk_tokens > layout().n_ctx
                              ? layout().n_ctx
                              : static_cast<int64_t>(block_table_.size()) * layout().kv_chunk_tokens));
  const int64_t slot_bytes = layout().kv_slot_bytes();
  const Device dev = pool_->device();
  std::vector<CopyRegion> regions;
  for (size_t c = 0; c < block_table_.size(); ++c) {
    regions.push_back({pool_->slot_data(copy->block_table_[c]), pool_->slot_data(block_table_[c]), slot_bytes});
  }
  if (!recurrent_.empty()) regions.push_back({copy->recurrent_.data(), recurrent_.data(), recurrent_.bytes()});
  DS_TRY(device_copy_regions(dev, dev, regions));
  copy->pos_ = pos_;
  copy->has_recurrent_ = has_recurrent_;
  if (logits_.bytes() > 0) std::memcpy(copy->logits_.data(), logits_.data(), static_cast<size_t>(logits_.bytes()));
  copy->logits_valid_ = logits_valid_;
  std::memcpy(copy->top_k_.data(), top_k_.data(), sizeof(TopKResult));
  copy->top_k_valid_ = top_k_valid_;
  copy->want_top_k_ = want_top_k_;
  return copy;
}

}  // namespace ds
