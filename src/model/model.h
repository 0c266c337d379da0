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
// On a CUDA device (options.device = cuda:N) the weights are copied to the device at load, the
// sequence state (KV slots, recurrent state) lives there, and only token ids, the position and the
// last logits cross the bus; a single-token decode step is captured once as a CUDA graph and replayed
// (model_cuda.cpp). State streams are byte-identical whatever the device.
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
#include "ops/top_k.h"
#include "state/sequence_state.h"

namespace ds {

class GgufFile;
struct ModelScratch;  // per-model activation buffers (model.cpp)
struct ModelCuda;     // CUDA stream, step buffers and the decode graph (model_cuda.cpp)
struct ModelVerify;   // the last speculative verify: recurrent copy, DeltaNet inputs, logits (model_verify.cpp)
struct ModelVerifyDeleter {
  void operator()(ModelVerify* p) const;
};
struct ModelCudaDeleter {
  void operator()(ModelCuda* p) const;
};

struct ModelOptions {
  int32_t n_threads = 0;        // CPU threads (ThreadPool::global()); 0 = all cores
  int64_t n_ctx = 0;            // tokens per sequence; 0 = training context capped at 32768
  // C: prefill chunk in tokens (aligned to absolute positions); 0 = auto: kPrefillChunkCpu on the
  // CPU; on CUDA kPrefillChunkCudaLarge on devices of at least kPrefillChunkCudaLargeMinBytes, else
  // kPrefillChunkCuda (GEMMs and the grouped MoE products want more rows; the step buffers grow with
  // C). options() reports the value in use.
  int64_t prefill_chunk = 0;
  int64_t kv_chunk_tokens = 64; // tokens per KV chunk (block table granularity)
  DType kv_dtype = DType::F32;  // attention KV cache: F32, F16 (half the memory), Q8_0 (8.5 bits an
                                // element) or Q4_0 (4.5 bits an element; both head_dim a multiple of 32)
  int64_t max_kv_slots = 0;     // KV pool bound in chunks; 0 = enough for 4 full sequences
  Device device{};              // cpu, or cuda:N (builds with the CUDA backend)
  bool reference_ops = false;   // run the scalar reference ops (tests, debugging; CPU only)
  bool cuda_graphs = true;      // CUDA: replay the single-token decode step as a captured graph
  bool cuda_time_steps = false; // CUDA: time each replayed step on the device (CudaGraphStats; two events a step)
};

constexpr int64_t kPrefillChunkCpu = 256;
// Tokens a speculative verify runs at most (Model::verify): up to 8 the CUDA products read the weights
// once for every token in the matrix-vector kernels; from 9 they dequantize to BF16 for the GEMM path.
constexpr int64_t kMaxVerifyTokens = 8;
constexpr int64_t kPrefillChunkCuda = 1024;
// Measured on an H100 (docs/perf-gpu.md): 4096 against 1024 prefills 4096-token prompts 18% (27B) and
// 31% (35B-A3B) faster and 32K prompts 15% and 20% faster, for 2.4 GiB more peak memory on the 27B at
// 32K (21.4 GiB): too little room left on a 24 GB card, so those keep 1024.
constexpr int64_t kPrefillChunkCudaLarge = 4096;
constexpr int64_t kPrefillChunkCudaLargeMinBytes = int64_t{28} << 30;

// Decode-step graph counters of a CUDA model (all zero on the CPU or with cuda_graphs off).
struct CudaGraphStats {
  int64_t captures = 0;  // graphs captured (then instantiated, or updated into the existing executable)
  int64_t replays = 0;   // decode steps run by launching a captured graph (the capture's own run included)
  int64_t uncaptured = 0;  // single-token steps run op by op: warming up a new graph key, or after a capture failed
  // With ModelOptions::cuda_time_steps: the replays timed on the device (events around the graph
  // launch, so its logits copy included) and their total; a step's wall time less this is host time.
  int64_t timed_replays = 0;
  double replay_device_ms = 0.0;
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
  // On CUDA the mapping stays for its metadata; the pages of its tensor data are released.
  const GgufFile* gguf() const { return gguf_.get(); }
  Device device() const { return options_.device; }
  // Bytes of device memory holding the weights (0 on the CPU, where weights are used in place).
  int64_t weight_device_bytes() const { return weight_device_bytes_; }
  // The weights as the forward reads them: on CUDA device views, some in a device layout (Q6_K_G4).
  const ModelWeights& weights() const { return weights_; }
  CudaGraphStats cuda_graph_stats() const;

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
  // The state's last logits [n_vocab] (empty if none are valid). A CUDA decode step of a state that
  // wants only its best logits (SequenceState::set_want_top_k) leaves state.top_k() valid instead.
  std::span<const float> logits(const SequenceState& state) const;
  // The whole row of the state's last step when that step returned only its best logits: copied from
  // the device now (for a best-logits result that overflowed, or a sampler that needs more). Must come
  // before the model runs another step; kInvalidArgument otherwise.
  Status fetch_logits(SequenceState& state);

  // ---- speculative decoding ----
  // Runs `tokens` (1 to max_verify_tokens(): the sequence's next token, then a draft of what follows)
  // from state.pos() as one segment: afterwards state.pos() = pos0 + n, and verify_row(i) is the
  // result after tokens[0..i] (what a decode of tokens[i] would leave). Until this model runs another
  // step, keep_verified takes the state back to any of those n positions.
  // kInvalidArgument for an empty or too long list, a token out of range or a context overflow.
  // With whole_rows every row comes whole (a sampler with penalties needs them); else on CUDA only
  // their best logits.
  Status verify(SequenceState& state, std::span<const int32_t> tokens, bool whole_rows = false);
  // Row i of the last verify: its best logits (CUDA, where the vocabulary allows and the verify did not
  // ask for whole rows; a row whose selection overflowed comes whole instead), else its whole row of
  // logits. Valid until the next step.
  struct VerifyRow {
    const TopKResult* top_k = nullptr;
    std::span<const float> logits;
  };
  VerifyRow verify_row(int64_t i) const;
  // Keeps the first n_keep (1..n) tokens of the state's last verify: KV past pos0 + n_keep is dropped
  // and the recurrent state is rebuilt from its copy taken before the verify, through those tokens
  // (the DeltaNet layers' inputs of each token were kept; no product runs again). The state's logits
  // stay invalid: the caller has the rows. kInvalidArgument without a matching verify.
  Status keep_verified(SequenceState& state, int64_t n_keep);
  // Tokens one verify takes: kMaxVerifyTokens, or the prefill chunk where that is smaller.
  int64_t max_verify_tokens() const;

  // ---- state streams (see state/state_io.h) ----
  Result<std::vector<uint8_t>> save_state(const SequenceState& state, int64_t n_tokens) const;
  Result<std::unique_ptr<SequenceState>> load_state(std::span<const uint8_t> bytes) const;
  // Only the layers of `range` (a shard's part of a split state), and the import of such parts
  // one after another into one state.
  Result<std::vector<uint8_t>> save_state(const SequenceState& state, int64_t n_tokens, LayerRange range) const;
  // Into an existing state (see state_deserialize_into: layer ranges one after another, a delta on top
  // of the state it continues; without `with_recurrent` the KV alone).
  Status load_state_into(std::span<const uint8_t> bytes, SequenceState& state, bool with_recurrent = true) const;

  // ---- units of execution ----
  // Tensors are on the model's device; token ids and logits are host memory. On CUDA these calls
  // queue work on the model's stream; head() waits for it.
  // hidden [n_tokens, n_embd] F32 = token embeddings (ids checked against the vocabulary).
  Status embed(std::span<const int32_t> tokens, const TensorView& hidden);
  // Layers [range.first, range.last) over n_tokens tokens at positions state.pos() + i. hidden_in and
  // hidden_out are [n_tokens, n_embd] F32 and may alias. Writes the range's KV and recurrent state,
  // but does not advance state.pos() (the caller does, once every range has run).
  Status forward(LayerRange range, SequenceState& state, const TensorView& hidden_in,
                 const TensorView& hidden_out);
  // logits [n_vocab] (host) = output * RMSNorm(hidden_row; output_norm), for one hidden row [n_embd].
  Status head(const TensorView& hidden_row, float* logits);

  // Debug hook: on CUDA it receives host copies of device tensors, and decode runs without graphs.
  void set_debug_hook(DebugHook hook) { debug_hook_ = std::move(hook); }

 private:
  Model();
  Status init(const ModelOptions& options);
  Status run_segment(SequenceState& state, std::span<const int32_t> tokens, bool want_logits);
  // forward() without argument checks; on CUDA the position of the first token is already in the
  // device step buffer.
  Status forward_layers(LayerRange range, SequenceState& state, const TensorView& hidden_in,
                        const TensorView& hidden_out);
  // head() on the model's device; the logits land in `logits` (CPU), or on CUDA (asynchronously) in
  // `logits` where it is page-locked host memory (a sequence's own, SequenceState::logits_pinned),
  // else (null) in the model's pinned logits buffer.
  // With top_k (CUDA: page-locked host memory) only the best logits are copied there, not the row.
  Status head_queue(const TensorView& hidden_row, float* logits, TopKResult* top_k = nullptr);
  // Reports an intermediate to the debug hook (host copy of device tensors).
  void dump(std::string_view name, const TensorView& t) const;

  // ---- CUDA (model_cuda.cpp; kUnsupported in builds without the backend) ----
  int64_t cuda_auto_prefill_chunk() const;  // prefill_chunk 0 on CUDA (ModelOptions)
  Status cuda_init();  // stream, step and logits buffers, weight upload
  // Writes pos0 and the token ids to the pinned step buffer (at most min(prefill_chunk, n_ctx) ids),
  // once the previous upload from it has run; returns it for a step that uploads it itself.
  Result<int32_t*> cuda_step_write(int64_t pos0, std::span<const int32_t> tokens);
  // cuda_step_write, then the upload queued.
  Status cuda_stage(int64_t pos0, std::span<const int32_t> tokens);
  Status cuda_embed_staged(int64_t n_tokens, const TensorView& hidden);  // rows of the staged ids
  // logits = output * norm, its copy queued to `pinned` (page-locked host memory) or, null, to the
  // model's pinned logits buffer; with top_k (page-locked), only the best logits are copied, there.
  Status cuda_head_output(const TensorView& norm, float* pinned, TopKResult* top_k = nullptr);
  // Waits for the stream; then the logits go from the model's pinned buffer to `logits`, unless
  // cuda_head_output copied them there itself (in_place).
  Status cuda_finish_logits(float* logits, bool in_place);
  Status cuda_run_segment(SequenceState& state, std::span<const int32_t> tokens, bool want_logits);
  Status cuda_decode_graph(SequenceState& state, int32_t token);
  // A verify on CUDA (a captured graph per token count): verify_queue, then the best logits of each
  // row of `logits` [n_vocab, n] (device) into `best` (page-locked host), waiting for the stream; a row
  // whose selection overflowed (or every row, with whole_rows or where the vocabulary has no device
  // selection) is copied whole into `rows` [n_vocab * n] (host) and its best.n set to 0.
  Status cuda_verify_step(SequenceState& state, std::span<const int32_t> tokens, const TensorView& logits,
                          TopKResult* best, float* rows, bool whole_rows);
  // keep_queue on CUDA (a captured graph per kept count); queued, not waited for.
  Status cuda_keep_step(SequenceState& state, int64_t pos0, int64_t n_keep);
  // The verify's buffers on first use, and its copy of a state's recurrent allocation (model_verify.cpp).
  Status verify_init();
  Status copy_recurrent(SequenceState& state, bool save);
  // Queues a verify of `tokens` at state.pos() (tokens already staged on CUDA): the recurrent copy,
  // the forward with each DeltaNet layer's inputs kept, every row's logits into `logits` [n_vocab, n].
  Status verify_queue(SequenceState& state, std::span<const int32_t> tokens, const TensorView& logits);
  // Queues the recurrent state's rebuild through the first n_keep tokens of the verify at pos0.
  Status keep_queue(SequenceState& state, int64_t pos0, int64_t n_keep);
  const int32_t* cuda_step_pos() const;  // device int32: position of the staged segment's first token

  ModelConfig config_;
  ModelWeights weights_;
  ModelOptions options_;
  int64_t n_ctx_ = 0;
  StateLayout layout_;
  std::shared_ptr<KvPool> pool_;
  std::unique_ptr<GgufFile> gguf_;
  std::vector<DeviceBuffer> storage_;
  std::unique_ptr<ModelScratch> scratch_;
  DeviceBuffer hidden_buf_;    // [prefill_chunk, n_embd] F32: the residual stream of run_segment
  DeviceBuffer head_norm_;     // [n_embd] F32: the normalized row head() multiplies
  int64_t weight_device_bytes_ = 0;
  OpContext ctx_;
  DebugHook debug_hook_;
  std::unique_ptr<ModelVerify, ModelVerifyDeleter> verify_;
  // Set during a verify's forward: where each DeltaNet layer keeps its inputs (ModelVerify::stash).
  float* verify_stash_ = nullptr;
  std::unique_ptr<ModelCuda, ModelCudaDeleter> cuda_;  // last: destroyed first (synchronizes the stream)
};

}  // namespace ds
