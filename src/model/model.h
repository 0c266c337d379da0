// Model: the public entry to run a qwen35 / qwen35moe model. Load a GGUF, create sequence states,
// prefill and decode, read the last logits; the engine (sampling, scheduling, snapshots) builds on it.
//
//   ModelOptions opt;  opt.n_threads = 8;
//   DS_ASSIGN_OR_RETURN(auto model, Model::load("qwen.gguf", opt));
//   DS_ASSIGN_OR_RETURN(auto state, model->new_state());
//   DS_TRY(model->prefill(*state, prompt_ids));        // leaves the last logits in the state
//   std::span<const float> logits = model->logits(*state);
//   DS_TRY(model->decode(*state, next_id));
//
// Non-obvious choice: prefill runs in chunks aligned to absolute positions (chunk k covers
// [k*C, (k+1)*C)); a prefill that starts mid-chunk first runs to the next multiple of C. So
// "restore a snapshot taken at a multiple of C, then prefill the tail" is bit-identical to an
// uncached prefill on the same backend. The lower-level steps (embed, a layer range, head) are
// public for layer split and remote shards.
// Threading: a Model runs one forward at a time (its activation scratch and the CPU thread pool are
// shared); callers serialize prefill / decode / forward calls. Ops inside a call use all threads.
// On error mid-forward the state is left partially updated; restore it from a snapshot or reset it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"
#include "ops/device_buffer.h"
#include "ops/op_context.h"
#include "state/sequence_state.h"

namespace ds {

class GgufFile;
struct ModelScratch;  // per-model activation buffers (model.cpp)

struct ModelOptions {
  int32_t n_threads = 0;        // CPU threads (ThreadPool::global()); 0 = all cores
  int64_t n_ctx = 0;            // tokens per sequence; 0 = training context capped at 32768
  int64_t prefill_chunk = 256;  // C: prefill chunk in tokens (aligned to absolute positions)
  int64_t kv_chunk_tokens = 64; // tokens per KV chunk (block table granularity)
  DType kv_dtype = DType::F32;  // attention KV cache: F32, or F16 (half the memory)
  int64_t max_kv_slots = 0;     // KV pool bound in chunks; 0 = enough for 4 full sequences
  Device device{};              // only the CPU backend exists so far
  bool reference_ops = false;   // run the scalar reference ops (tests, debugging)
};

// [first, last) trunk layers executed as one unit on one device.
struct LayerRange {
  int64_t first = 0;
  int64_t last = 0;
};

// Called with each named intermediate ("blk.12.deltanet.beta", "result_norm", ...) after it is
// computed; views are valid only during the call. Only set when dumping, it costs nothing otherwise.
using DebugHook = std::function<void(std::string_view name, const TensorView& tensor)>;

class Model {
 public:
  // Maps a GGUF file, validates the config and every tensor, and prepares the KV pool.
  static Result<std::unique_ptr<Model>> load(const std::string& gguf_path, const ModelOptions& options);
  // A model over weights already in memory (tests, tools). `storage` keeps their memory alive.
  static Result<std::unique_ptr<Model>> from_weights(ModelConfig config, ModelWeights weights,
                                                     std::vector<DeviceBuffer> storage,
                                                     const ModelOptions& options);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_vocab() const { return config_.n_vocab; }
  const StateLayout& state_layout() const { return layout_; }
  const std::shared_ptr<KvPool>& kv_pool() const { return pool_; }
  // Identity of this model's weights and shapes, stored in every serialized state.
  uint64_t fingerprint() const { return layout_.model_fingerprint; }
  // The GGUF the weights come from, or null for from_weights models (tokenizer keys live there).
  const GgufFile* gguf() const { return gguf_.get(); }

  // ---- sequences ----
  Result<std::unique_ptr<SequenceState>> new_state() const;
  // Runs tokens from state.pos() on; afterwards the state holds the logits of the last token.
  // kInvalidArgument for an empty list, a token id out of range or a context overflow.
  // Calling it in pieces that end at multiples of options().prefill_chunk gives bit-identical
  // results to one call: use that to poll for cancellation, report progress, or save snapshots at
  // chunk boundaries (save_state(state, state.pos())) on the way.
  Status prefill(SequenceState& state, std::span<const int32_t> tokens);
  // One token (the same math as a 1-token prefill).
  Status decode(SequenceState& state, int32_t token);
  // The state's last logits [n_vocab] (empty if none are valid).
  std::span<const float> logits(const SequenceState& state) const;

  // ---- state streams (see state/state_io.h) ----
  Result<std::vector<uint8_t>> save_state(const SequenceState& state, int64_t n_tokens) const;
  Result<std::unique_ptr<SequenceState>> load_state(std::span<const uint8_t> bytes) const;
  // Only the layers of `range` (a shard's part of a split state), and the import of such parts
  // one after another into one state.
  Result<std::vector<uint8_t>> save_state(const SequenceState& state, int64_t n_tokens, LayerRange range) const;
  Status load_state_into(std::span<const uint8_t> bytes, SequenceState& state) const;

  // ---- units of execution ----
  // hidden [n_tokens, n_embd] F32 = token embeddings.
  Status embed(std::span<const int32_t> tokens, const TensorView& hidden);
  // Layers [range.first, range.last) over n_tokens tokens at positions state.pos() + i. hidden_in and
  // hidden_out are [n_tokens, n_embd] F32 and may alias. Writes the range's KV and recurrent state,
  // but does not advance state.pos() (the caller does, once every range has run).
  Status forward(LayerRange range, SequenceState& state, const TensorView& hidden_in,
                 const TensorView& hidden_out);
  // logits [n_vocab] = output * RMSNorm(hidden_row; output_norm), for one hidden row [n_embd].
  Status head(const TensorView& hidden_row, float* logits);

  void set_debug_hook(DebugHook hook) { debug_hook_ = std::move(hook); }

 private:
  Model();
  Status init(const ModelOptions& options);
  Status run_segment(SequenceState& state, std::span<const int32_t> tokens, bool want_logits);

  ModelConfig config_;
  ModelWeights weights_;
  ModelOptions options_;
  int64_t n_ctx_ = 0;
  StateLayout layout_;
  std::shared_ptr<KvPool> pool_;
  std::unique_ptr<GgufFile> gguf_;
  std::vector<DeviceBuffer> storage_;
  std::unique_ptr<ModelScratch> scratch_;
  OpContext ctx_;
  DebugHook debug_hook_;
};

}  // namespace ds
