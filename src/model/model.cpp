// Model: setup from weights, the position-aligned prefill loop, embed / layer range / head steps,
// and state streams. Non-obvious choice: a segment never crosses a multiple of prefill_chunk, so
// the split of any token stream into forward calls depends only on absolute positions. The CUDA
// specifics (stream, step buffers, weight upload, decode graph) live in model_cuda.cpp; this file
// branches to them where a step differs.
#include "model/model.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/log.h"
#include "gguf/gguf.h"  // complete type for the owned GgufFile
#include "model/model_internal.h"
#include "model/weight_specs.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/get_rows.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"
#include "state/state_io.h"
#if DS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace ds {

// ---- scratch and views ----

Result<TensorView> ModelScratch::f32(std::initializer_list<int64_t> ne) {
  TensorView t = TensorView::contiguous(nullptr, DType::F32, ne, device);
  const int64_t bytes = (t.n_bytes() + 63) / 64 * 64;
  if (blocks.empty() || offset + bytes > blocks.back().bytes()) {
    DS_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::alloc(device, std::max<int64_t>(bytes, int64_t{4} << 20)));
    blocks.push_back(std::move(b));
    offset = 0;
    ++generation;
  }
  t.data = static_cast<uint8_t*>(blocks.back().data()) + offset;
  offset += bytes;
  used_total += bytes;
  peak = std::max(peak, used_total);
  return t;
}

Result<TensorView> ModelScratch::i32(std::initializer_list<int64_t> ne) {
  DS_ASSIGN_OR_RETURN(TensorView t, f32(ne));
  t.dtype = DType::I32;
  return t;
}

ModelScratch::Mark ModelScratch::mark() const { return {blocks.size(), offset, used_total}; }

void ModelScratch::rollback(const Mark& m) {
  // Blocks added since the mark hold only released intermediates: free them, so a first segment that
  // spills in every layer does not keep every layer's blocks (and `peak` stays the live high-water).
  // On CUDA the freed blocks go back to the device cache; later work is ordered on the same stream.
  if (blocks.size() > m.n_blocks) {
    blocks.resize(m.n_blocks);
    ++generation;
  }
  offset = m.offset;
  used_total = m.used_total;
}

void ModelScratch::reset() {
  if (blocks.size() > 1 || (blocks.size() == 1 && blocks[0].bytes() < peak)) {
    const int64_t want = peak;
    blocks.clear();
    auto b = DeviceBuffer::alloc(device, want);
    if (b.is_ok()) blocks.push_back(std::move(b).value());
    ++generation;
  }
  offset = 0;
  used_total = 0;
}

void LayerCall::dump(const char* what, const TensorView& t) const {
  if (hook) debug_dump(hook, "blk." + std::to_string(il) + "." + what, t);
}

void debug_dump(const DebugHook& hook, std::string_view name, const TensorView& t) {
  if (!hook) return;
  if (t.device.kind == DeviceKind::kCpu) {
    hook(name, t);
    return;
  }
  DS_CHECK(t.is_contiguous(), "debug hook: device tensor {} {} is not contiguous", name, t.shape_string());
  std::vector<uint8_t> host(static_cast<size_t>(t.n_bytes()));
  const Status s = device_copy(host.data(), Device{}, t.data, t.device, t.n_bytes());
  if (!s.is_ok()) {
    DS_LOG_WARN("debug hook: {} not copied from {}: {}", name, t.device.to_string(), s.to_string());
    return;
  }
  TensorView h = t;
  h.data = host.data();
  h.device = Device{};
  hook(name, h);
}

void Model::dump(std::string_view name, const TensorView& t) const { debug_dump(debug_hook_, name, t); }

TensorView reshape(const TensorView& t, std::initializer_list<int64_t> ne) {
  TensorView r = TensorView::contiguous(t.data, t.dtype, ne, t.device);
  DS_CHECK(r.n_elements() == t.n_elements(), "reshape {} to {} elements", t.shape_string(), r.n_elements());
  return r;
}

TensorView columns(const TensorView& t, int64_t c0, int64_t n) {
  DS_CHECK(c0 >= 0 && c0 + n <= t.ne[0] && t.dtype == DType::F32, "columns [{}, {}) of {}", c0, c0 + n,
           t.shape_string());
  TensorView r = t;
  r.data = t.as<float>() + c0;
  r.ne[0] = n;
  return r;
}

// ---- setup ----

Model::Model() = default;
Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::from_weights(ModelConfig config, ModelWeights weights,
                                                   std::vector<DeviceBuffer> storage, const ModelOptions& options) {
  DS_TRY(model_weights_validate(weights, config));
  DS_TRY(weights_finish(config, &weights));
  std::unique_ptr<Model> m(new Model());
  m->config_ = std::move(config);
  m->weights_ = std::move(weights);
  m->storage_ = std::move(storage);
  DS_TRY(m->init(options));
  return m;
}

namespace {

uint64_t weights_fingerprint(const ModelConfig& c, ModelWeights& w) {
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  const int64_t dims[] = {static_cast<int64_t>(c.arch), c.n_layer, c.n_embd, c.n_vocab, c.n_head, c.n_head_kv,
                          c.head_dim, c.n_rot, c.ssm_conv_kernel, c.ssm_d_state, c.ssm_n_group, c.ssm_n_v_head,
                          c.is_moe() ? 0 : c.n_ff /* only a fallback for MoE */, c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp};
  XXH3_64bits_update(h, dims, sizeof(dims));
  XXH3_64bits_update(h, &c.rms_eps, sizeof(c.rms_eps));
  XXH3_64bits_update(h, &c.rope_base, sizeof(c.rope_base));
  ModelWeights probe = w;
  for (const WeightSpec& s : weight_specs(c, &probe)) {
    const TensorView& t = *s.slot;
    if (t.data == nullptr) continue;
    XXH3_64bits_update(h, s.name.data(), s.name.size());
    XXH3_64bits_update(h, &t.dtype, sizeof(t.dtype));
    XXH3_64bits_update(h, t.ne.data(), sizeof(int64_t) * 4);
    // Small tensors (norms, gates) are hashed whole, large ones by their first 4 KiB: the identity of
    // a file without reading gigabytes.
    const int64_t bytes = t.row_bytes() * t.n_rows();
    XXH3_64bits_update(h, t.data, static_cast<size_t>(std::min<int64_t>(bytes, 4096)));
  }
  const uint64_t v = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return v;
}

}  // namespace

Status Model::init(const ModelOptions& options) {
  options_ = options;
  const bool cuda = options.device.kind == DeviceKind::kCuda;
  if (options.device.kind != DeviceKind::kCpu && !cuda) {
    return unsupported("model: device {} has no backend", options.device.to_string());
  }
  if (options.prefill_chunk < 0 || options.kv_chunk_tokens <= 0) {
    return invalid_argument("model: prefill_chunk {} must be >= 0 (0 = auto) and kv_chunk_tokens {} positive",
                            options.prefill_chunk, options.kv_chunk_tokens);
  }
  if (options_.prefill_chunk == 0) options_.prefill_chunk = cuda ? cuda_auto_prefill_chunk() : kPrefillChunkCpu;
  if (!attention_kv_dtype_supported(options.kv_dtype)) {
    return unsupported("model: KV cache dtype {} is not supported (f32, f16, q8_0 or q4_0)",
                       dtype_name(options.kv_dtype));
  }
  // A block type's head row is whole blocks (F32 and F16 have blocks of one element).
  if (config_.head_dim % dtype_block_size(options.kv_dtype) != 0) {
    return unsupported("model: KV cache dtype {} needs head_dim a multiple of {}; this model's head_dim is {} "
                       "(use f16 or f32)", dtype_name(options.kv_dtype), dtype_block_size(options.kv_dtype),
                       config_.head_dim);
  }
  if (cuda && options.reference_ops) {
    return unsupported("model: reference_ops are CPU-only; device {} was requested", options.device.to_string());
  }
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : std::min<int64_t>(config_.n_ctx_train > 0 ? config_.n_ctx_train : 4096, 32768);
  if (options.n_threads > 0) ThreadPool::set_default_threads(options.n_threads);
  ctx_.device = options.device;
  ctx_.pool = &ThreadPool::global();
  ctx_.reference = options.reference_ops;
  if (options.n_threads > 0 && ctx_.pool->n_threads() != options.n_threads) {
    DS_LOG_WARN("model: the global thread pool already runs {} threads ({} requested)", ctx_.pool->n_threads(),
                options.n_threads);
  }

  layout_ = StateLayout{};
  for (LayerKind k : config_.layer_kinds) {
    layout_.kinds.push_back(k == LayerKind::kAttention ? LayerStateKind::kAttention : LayerStateKind::kRecurrent);
  }
  layout_.n_head_kv = config_.n_head_kv;
  layout_.head_dim = config_.head_dim;
  layout_.kv_chunk_tokens = options.kv_chunk_tokens;
  layout_.kv_dtype = options.kv_dtype;
  layout_.conv_kernel = config_.ssm_conv_kernel;
  layout_.conv_dim = config_.conv_dim();
  layout_.ssm_dk = config_.ssm_d_state;
  layout_.ssm_dv = config_.ssm_d_state;
  layout_.ssm_nv = config_.ssm_n_v_head;
  layout_.n_vocab = config_.n_vocab;
  layout_.n_ctx = n_ctx_;
  layout_.model_fingerprint = weights_fingerprint(config_, weights_);  // reads host weights: before any upload
  if (cuda) DS_TRY(cuda_init());
  const int64_t per_seq = (n_ctx_ + options.kv_chunk_tokens - 1) / options.kv_chunk_tokens;
  pool_ = std::make_shared<KvPool>(layout_, options.device, options.max_kv_slots > 0 ? options.max_kv_slots : 4 * per_seq);
  scratch_ = std::make_unique<ModelScratch>(options.device);
  const int64_t max_segment = std::min(options_.prefill_chunk, n_ctx_);
  DS_ASSIGN_OR_RETURN(hidden_buf_, DeviceBuffer::alloc(options.device, max_segment * config_.n_embd * 4));
  DS_ASSIGN_OR_RETURN(head_norm_, DeviceBuffer::alloc(options.device, config_.n_embd * 4));
  return Status::ok();
}

// ---- sequences ----

Result<std::unique_ptr<SequenceState>> Model::new_state() const { return SequenceState::create(pool_); }

std::span<const float> Model::logits(const SequenceState& state) const {
  if (!state.logits_valid()) return {};
  return {state.logits().data(), state.logits().size()};
}

Status Model::prefill(SequenceState& state, std::span<const int32_t> tokens) {
  if (tokens.empty()) return invalid_argument("prefill: no tokens");
  if (state.pool() != pool_) return invalid_argument("prefill: the state belongs to another model");
  if (!state.has_recurrent()) {
    return invalid_argument("prefill: the state at position {} has no recurrent state (restored from a KV-only stream)",
                            state.pos());
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.n_vocab) {
      return invalid_argument("prefill: token {} at index {} is outside the vocabulary of {}", tokens[i], i,
                              config_.n_vocab);
    }
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (state.pos() + n > n_ctx_) {
    return invalid_argument("prefill: {} tokens at position {} exceed the context of {}", n, state.pos(), n_ctx_);
  }
  const int64_t C = options_.prefill_chunk;
  for (int64_t i = 0; i < n;) {
    const int64_t p = state.pos();
    const int64_t len = std::min(n - i, (p / C + 1) * C - p);  // up to the next multiple of C
    DS_TRY(run_segment(state, tokens.subspan(static_cast<size_t>(i), static_cast<size_t>(len)), i + len == n));
    i += len;
  }
  return Status::ok();
}

Status Model::decode(SequenceState& state, int32_t token) { return prefill(state, std::span<const int32_t>(&token, 1)); }

Status Model::run_segment(SequenceState& state, std::span<const int32_t> tokens, bool want_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  DS_CHECK(n >= 1 && n * config_.n_embd * 4 <= hidden_buf_.bytes(), "segment of {} tokens exceeds the hidden buffer",
           n);
  DS_TRY(state.kv_reserve(state.pos() + n));
  if (cuda_) return cuda_run_segment(state, tokens, want_logits);
  const TensorView hidden = hidden_buf_.view(DType::F32, {config_.n_embd, n});
  DS_TRY(embed(tokens, hidden));
  DS_TRY(forward_layers(LayerRange{0, config_.n_layer}, state, hidden, hidden));
  state.set_logits_valid(false);
  if (want_logits) {
    const TensorView last = TensorView::contiguous(hidden.as<float>() + (n - 1) * config_.n_embd, DType::F32,
                                                   {config_.n_embd, 1}, options_.device);
    DS_TRY(head_queue(last, state.logits().data()));
  }
  state.set_pos(state.pos() + n);
  state.set_logits_valid(want_logits);
  return Status::ok();
}

// ---- units of execution ----

Status Model::embed(std::span<const int32_t> tokens, const TensorView& hidden) {
  if (cuda_) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (hidden.dtype != DType::F32 || !hidden.is_contiguous() || hidden.ne[0] != config_.n_embd ||
        hidden.n_rows() != n || hidden.device != options_.device) {
      return invalid_argument("embed: hidden {} on {} must be contiguous [{}, {}] f32 on {}", hidden.shape_string(),
                              hidden.device.to_string(), n, config_.n_embd, options_.device.to_string());
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= config_.n_vocab) {
        return invalid_argument("embed: token {} at index {} is outside the vocabulary of {}", tokens[i], i,
                                config_.n_vocab);
      }
    }
    DS_TRY(cuda_stage(0, tokens));
    return cuda_embed_staged(n, hidden);
  }
  TensorView ids = TensorView::contiguous(const_cast<int32_t*>(tokens.data()), DType::I32,
                                          {static_cast<int64_t>(tokens.size())}, options_.device);
  DS_TRY(get_rows(ctx_, weights_.token_embd, ids, hidden));
  dump("token_embd", hidden);
  return Status::ok();
}

Status Model::forward(LayerRange range, SequenceState& state, const TensorView& hidden_in,
                      const TensorView& hidden_out) {
  if (range.first < 0 || range.last > config_.n_layer || range.first > range.last) {
    return invalid_argument("forward: layer range [{}, {}) outside [0, {})", range.first, range.last, config_.n_layer);
  }
  const int64_t E = config_.n_embd;
  if (hidden_in.ne[0] != E || hidden_out.ne != hidden_in.ne || hidden_in.dtype != DType::F32 ||
      !hidden_in.is_contiguous() || !hidden_out.is_contiguous() || hidden_in.device != options_.device ||
      hidden_out.device != options_.device) {
    return invalid_argument("forward: hidden {} / {} must be contiguous [n_tokens, {}] f32 on {}",
                            hidden_in.shape_string(), hidden_out.shape_string(), E, options_.device.to_string());
  }
  if (state.pool() != pool_) return invalid_argument("forward: the state belongs to another model");
  if (cuda_) DS_TRY(cuda_stage(state.pos(), {}));
  return forward_layers(range, state, hidden_in, hidden_out);
}

Status layer_matmul_many(const LayerCall& call, std::span<const TensorView> ws, const TensorView& x_norm,
                         std::span<const TensorView> ys) {
#if DS_HAVE_CUDA
  if (call.x_q8.data != nullptr) return cuda::matmul_many_q8(call.ctx, ws, x_norm, call.x_q8, ys);
#endif
  return matmul_many(call.ctx, ws, x_norm, ys);
}

Status Model::forward_layers(LayerRange range, SequenceState& state, const TensorView& hidden_in,
                             const TensorView& hidden_out) {
  const int64_t E = config_.n_embd, n = hidden_in.ne[1];
  const int64_t pos0 = state.pos();
  DS_TRY(state.kv_reserve(pos0 + n));
  scratch_->reset();
  if (hidden_out.data != hidden_in.data) DS_TRY(copy(ctx_, hidden_in, hidden_out));
  const TensorView& x = hidden_out;  // residual stream [n, E], updated in place

  int64_t attn_index = 0;
  for (int64_t il = 0; il < range.first; ++il) {
    attn_index += config_.layer_kinds[static_cast<size_t>(il)] == LayerKind::kAttention;
  }
  const int64_t stash_floats = deltanet_stash_floats(config_);
  DS_ASSIGN_OR_RETURN(TensorView cur, scratch_->f32({E, n}));
  DS_ASSIGN_OR_RETURN(TensorView mix, scratch_->f32({E, n}));
  // cur's int8 activations (CUDA, one token; see norm_cur below): live across layers, like cur.
  TensorView cur_q8{};
#if DS_HAVE_CUDA
  if (cuda_ && n == 1 && cuda::norm_q8_applies(E)) {
    DS_ASSIGN_OR_RETURN(cur_q8, scratch_->f32({(cuda::norm_q8_act_bytes(E, 1) + 3) / 4}));
  }
#endif
  const ModelScratch::Mark layer_mark = scratch_->mark();
  const int32_t* d_pos = cuda_ ? cuda_step_pos() : nullptr;
#if DS_HAVE_CUDA
  const int64_t max_kv = cuda_ ? cuda::attention_launch_bound(pos0 + n, n_ctx_) : 0;
#else
  const int64_t max_kv = 0;
#endif
  // Each residual add is fused with the norm that follows it (add_rms_norm); cur holds the normalized
  // input of the next block. On CUDA for one token the norm also writes cur's int8 activations
  // (cur_q8), which the block's first products read instead of quantizing cur themselves.
  const auto norm_cur = [&](const TensorView* res, const TensorView& w) -> Status {
#if DS_HAVE_CUDA
    if (cur_q8.data != nullptr) {
      return res ? cuda::add_rms_norm_q8(ctx_, x, *res, w, config_.rms_eps, cur, cur_q8)
                 : cuda::rms_norm_q8(ctx_, x, w, config_.rms_eps, cur, cur_q8);
    }
#endif
    return res ? add_rms_norm(ctx_, x, *res, w, config_.rms_eps, cur) : rms_norm(ctx_, x, w, config_.rms_eps, cur);
  };
  if (range.first < range.last) {
    DS_TRY(norm_cur(nullptr, weights_.layers[static_cast<size_t>(range.first)].attn_norm));
  }
  for (int64_t il = range.first; il < range.last; ++il) {
    const LayerWeights& L = weights_.layers[static_cast<size_t>(il)];
    LayerCall call{ctx_, config_, *scratch_, state, debug_hook_, il, pos0, n, d_pos, max_kv, cur_q8};
    // h = x + Mixer(RMSNorm(x; attn_norm))
    if (L.kind == LayerKind::kAttention) {
      DS_TRY(attention_forward(call, L.attn, attn_index++, cur, mix));
    } else {
      if (verify_stash_ != nullptr) call.stash = verify_stash_ + (il - attn_index) * stash_floats;
      DS_TRY(deltanet_forward(call, L.deltanet, cur, mix));
    }
    call.dump("attn_out", mix);
    // out = h + FFN(RMSNorm(h; post_attention_norm)); a MoE block may take the residual add and norm itself
    if (config_.is_moe() && moe_ffn_fuses_norm(call, L.moe)) {
      DS_TRY(moe_ffn_forward_add_norm(call, L.moe, x, mix, L.post_attention_norm, mix));
    } else {
      DS_TRY(norm_cur(&mix, L.post_attention_norm));
      if (config_.is_moe()) {
        DS_TRY(moe_ffn_forward(call, L.moe, cur, mix));
      } else {
        DS_TRY(dense_ffn_forward(call, L.ffn, cur, mix));
      }
    }
    call.dump("ffn_out", mix);
    if (il + 1 < range.last) {
      DS_TRY(norm_cur(&mix, weights_.layers[static_cast<size_t>(il + 1)].attn_norm));
    } else {
      DS_TRY(add(ctx_, x, mix, x));
    }
    call.dump("out", x);
    scratch_->rollback(layer_mark);  // release the layer's intermediates
  }
  return Status::ok();
}

Status Model::head(const TensorView& hidden_row, float* logits) {
  if (hidden_row.n_elements() != config_.n_embd || hidden_row.dtype != DType::F32 || !hidden_row.is_contiguous() ||
      hidden_row.device != options_.device) {
    return invalid_argument("head: hidden row {} on {} must be [{}] f32 on {}", hidden_row.shape_string(),
                            hidden_row.device.to_string(), config_.n_embd, options_.device.to_string());
  }
  DS_TRY(head_queue(hidden_row, cuda_ ? nullptr : logits));  // on CUDA `logits` may be pageable
  if (cuda_) return cuda_finish_logits(logits, /*in_place=*/false);
  return Status::ok();
}

Status Model::head_queue(const TensorView& hidden_row, float* logits, TopKResult* top_k) {
  const TensorView row = reshape(hidden_row, {config_.n_embd, 1});
  const TensorView norm = head_norm_.view(DType::F32, {config_.n_embd, 1});
  DS_TRY(rms_norm(ctx_, row, weights_.output_norm, config_.rms_eps, norm));
  dump("result_norm", norm);
  if (cuda_) return cuda_head_output(norm, logits, top_k);
  const TensorView out = TensorView::contiguous(logits, DType::F32, {config_.n_vocab, 1}, options_.device);
  DS_TRY(matmul(ctx_, weights_.output, norm, out));
  dump("result_output", out);
  return Status::ok();
}

// ---- state streams ----

Result<std::vector<uint8_t>> Model::save_state(const SequenceState& state, int64_t n_tokens) const {
  return state_serialize(state, n_tokens);
}

Result<std::unique_ptr<SequenceState>> Model::load_state(std::span<const uint8_t> bytes) const {
  return state_deserialize(bytes, pool_);
}

Result<std::vector<uint8_t>> Model::save_state(const SequenceState& state, int64_t n_tokens, LayerRange range) const {
  return state_serialize(state, n_tokens, range.first, range.last);
}

Status Model::load_state_into(std::span<const uint8_t> bytes, SequenceState& state, bool with_recurrent) const {
  if (state.pool() != pool_) return invalid_argument("load_state_into: the state belongs to another model");
  return state_deserialize_into(bytes, state, with_recurrent);
}


}  // namespace ds
