// Speculative verification (Model::verify / keep_verified): a draft of tokens runs through the model as
// one segment, every row's logits come back, and the state can then be taken back to any of the
// segment's positions.
// Non-obvious choices:
//  - Attention KV needs no undo: rows past the kept position are never read (kernels read positions
//    below pos) and are overwritten by the next step; chunks past it are freed.
//  - The recurrent state does: a DeltaNet layer's conv and SSM state describe the end of the segment.
//    Before the segment runs, the whole recurrent allocation is copied aside (one device copy, 151 MB
//    on the 27B); during it, each DeltaNet layer keeps its projections' outputs (mixed, b, a: 40 KiB a
//    token and layer on the 27B, 16 MB in all for 8 tokens).
//    Keeping n_keep < n tokens copies the state back and re-runs only each layer's prep and delta rule
//    over the first n_keep tokens: no weight is read again, where re-running the tokens would read
//    them all.
#include <algorithm>

#include "core/check.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"

namespace ds {

struct ModelVerify {
  DeviceBuffer recurrent_copy;  // the state's recurrent allocation before the last verify
  DeviceBuffer stash;           // [n_recurrent_layers][deltanet_stash_floats] F32
  DeviceBuffer logits;          // [kMaxVerifyTokens, n_vocab] F32 on the model's device
  std::vector<float> rows;      // CUDA: the rows that come whole (on the CPU, `logits` is host memory)
  HostBuffer best;              // TopKResult [kMaxVerifyTokens], page-locked (CUDA); n = 0: row whole
  // The last verify: its state (identity only), first position and length; n = 0 when none is open.
  const SequenceState* state = nullptr;
  int64_t pos0 = 0, n = 0;
};

void ModelVerifyDeleter::operator()(ModelVerify* p) const { delete p; }

int64_t Model::max_verify_tokens() const { return std::min(kMaxVerifyTokens, options_.prefill_chunk); }

Status Model::verify_init() {
  if (verify_) return Status::ok();
  auto v = std::unique_ptr<ModelVerify, ModelVerifyDeleter>(new ModelVerify());
  const int64_t n_recurrent = std::count(config_.layer_kinds.begin(), config_.layer_kinds.end(), LayerKind::kDeltaNet);
  const Device dev = options_.device;
  DS_ASSIGN_OR_RETURN(v->stash,
                      DeviceBuffer::alloc(dev, std::max<int64_t>(1, n_recurrent) * 4 *
                                                   deltanet_stash_floats(config_)));
  DS_ASSIGN_OR_RETURN(v->logits, DeviceBuffer::alloc(dev, 4 * config_.n_vocab * kMaxVerifyTokens));
  if (cuda_) v->rows.resize(static_cast<size_t>(config_.n_vocab * kMaxVerifyTokens));
  DS_ASSIGN_OR_RETURN(v->best, HostBuffer::alloc(dev, sizeof(TopKResult) * kMaxVerifyTokens));
  verify_ = std::move(v);
  return Status::ok();
}

// The state's recurrent allocation to the verify's copy (save) or back, queued on the model's stream.
Status Model::copy_recurrent(SequenceState& state, bool save) {
  const int64_t floats = state.recurrent_bytes() / 4;
  if (floats == 0) return Status::ok();
  const TensorView rec = TensorView::contiguous(state.recurrent_data(), DType::F32, {floats}, options_.device);
  const TensorView kept = verify_->recurrent_copy.view(DType::F32, {floats});
  return save ? copy(ctx_, rec, kept) : copy(ctx_, kept, rec);
}

Status Model::verify_queue(SequenceState& state, std::span<const int32_t> tokens, const TensorView& logits) {
  const int64_t n = static_cast<int64_t>(tokens.size()), E = config_.n_embd;
  // The recurrent state as it was, then the segment with every DeltaNet layer's inputs kept.
  DS_TRY(copy_recurrent(state, /*save=*/true));
  const TensorView hidden = hidden_buf_.view(DType::F32, {E, n});
  if (cuda_) {
    DS_TRY(cuda_embed_staged(n, hidden));
  } else {
    DS_TRY(embed(tokens, hidden));
  }
  verify_stash_ = static_cast<float*>(verify_->stash.data());
  const Status ran = forward_layers(LayerRange{0, config_.n_layer}, state, hidden, hidden);
  verify_stash_ = nullptr;
  DS_TRY(ran);
  // logits [n, V] = output * RMSNorm(hidden; output_norm), every row.
  DS_ASSIGN_OR_RETURN(const TensorView norm, scratch_->f32({E, n}));
  DS_TRY(rms_norm(ctx_, hidden, weights_.output_norm, config_.rms_eps, norm));
  return matmul(ctx_, weights_.output, norm, logits);
}

Status Model::keep_queue(SequenceState& state, int64_t pos0, int64_t n_keep) {
  DS_TRY(copy_recurrent(state, /*save=*/false));
  const int64_t stash_floats = deltanet_stash_floats(config_);
  int64_t rec_index = 0;
  for (int64_t il = 0; il < config_.n_layer; ++il) {
    const LayerWeights& L = weights_.layers[static_cast<size_t>(il)];
    if (L.kind != LayerKind::kDeltaNet) continue;
    LayerCall call{ctx_, config_, *scratch_, state, debug_hook_, il, pos0, n_keep, nullptr, 0, {}};
    call.stash = static_cast<float*>(verify_->stash.data()) + rec_index++ * stash_floats;
    const ModelScratch::Mark mark = scratch_->mark();
    DS_TRY(deltanet_replay_state(call, L.deltanet));
    scratch_->rollback(mark);
  }
  return Status::ok();
}

Status Model::verify(SequenceState& state, std::span<const int32_t> tokens, bool whole_rows) {
  const int64_t n = static_cast<int64_t>(tokens.size()), V = config_.n_vocab;
  if (n < 1 || n > max_verify_tokens()) {
    return invalid_argument("verify: {} tokens; a verify takes 1 to {}", n, max_verify_tokens());
  }
  if (state.pool() != pool_) return invalid_argument("verify: the state belongs to another model");
  if (!state.has_recurrent()) {
    return invalid_argument("verify: the state at position {} has no recurrent state (restored from a KV-only stream)",
                            state.pos());
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      return invalid_argument("verify: token {} at index {} is outside the vocabulary of {}", tokens[i], i, V);
    }
  }
  const int64_t pos0 = state.pos();
  if (pos0 + n > n_ctx_) return invalid_argument("verify: {} tokens at position {} exceed the context of {}", n, pos0, n_ctx_);
  DS_TRY(verify_init());
  ModelVerify& v = *verify_;
  v.n = 0;  // nothing to keep if this one fails
  DS_TRY(state.kv_reserve(pos0 + n));

  if (v.recurrent_copy.bytes() < state.recurrent_bytes()) {
    v.recurrent_copy = DeviceBuffer();
    DS_ASSIGN_OR_RETURN(v.recurrent_copy, DeviceBuffer::alloc(options_.device, state.recurrent_bytes()));
  }
  const TensorView logits = v.logits.view(DType::F32, {V, n});
  auto* best = static_cast<TopKResult*>(v.best.data());
  if (cuda_) {
    DS_TRY(cuda_verify_step(state, tokens, logits, best, v.rows.data(), whole_rows));
  } else {
    scratch_->reset();
    DS_TRY(verify_queue(state, tokens, logits));
    for (int64_t i = 0; i < n; ++i) best[i].n = 0;
  }
  state.set_pos(pos0 + n);
  state.set_logits_valid(false);
  v.state = &state;
  v.pos0 = pos0;
  v.n = n;
  return Status::ok();
}

Model::VerifyRow Model::verify_row(int64_t i) const {
  DS_CHECK(verify_ && i >= 0 && i < verify_->n, "verify row {} of {}", i, verify_ ? verify_->n : 0);
  const ModelVerify& v = *verify_;
  const TopKResult& best = static_cast<const TopKResult*>(v.best.data())[i];
  if (best.n >= 1) return {&best, {}};
  const float* rows = cuda_ ? v.rows.data() : static_cast<const float*>(v.logits.data());
  return {nullptr, std::span<const float>(rows + i * config_.n_vocab, static_cast<size_t>(config_.n_vocab))};
}

Status Model::keep_verified(SequenceState& state, int64_t n_keep) {
  if (!verify_ || verify_->n == 0 || verify_->state != &state || state.pos() != verify_->pos0 + verify_->n) {
    return invalid_argument("keep_verified: the state at position {} did not just verify", state.pos());
  }
  ModelVerify& v = *verify_;
  if (n_keep < 1 || n_keep > v.n) {
    return invalid_argument("keep_verified: {} tokens of a verify of {}; keep 1 to {}", n_keep, v.n, v.n);
  }
  const int64_t n = v.n;
  v.n = 0;
  if (n_keep == n) return Status::ok();

  state.kv_truncate(v.pos0 + n_keep);
  if (cuda_) return cuda_keep_step(state, v.pos0, n_keep);
  scratch_->reset();
  return keep_queue(state, v.pos0, n_keep);
}

}  // namespace ds
