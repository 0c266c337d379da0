// Engine: what the HTTP layer talks to. A request is prompt token ids + sampling parameters; the
// engine prefills (reusing cached prefix state when it can), decodes, and streams token ids back.
// Text (tokenizing, templates, stop strings, tool-call parsing) is the server's business.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace ds {

struct SamplingParams {
  float temperature = 0.0f;      // 0 = greedy
  int32_t top_k = 0;             // 0 = off
  float top_p = 1.0f;            // 1 = off
  float min_p = 0.0f;            // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off; applied to tokens of prompt + generation
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;             // same seed + same request = same output
};

// The Qwen3.5/3.6 recommended sampling for thinking mode: what the server applies to the fields a
// request omits, and what `bench --served` decodes with.
inline constexpr SamplingParams kRecommendedSampling{.temperature = 1.0f, .top_k = 20, .top_p = 0.95f, .min_p = 0.0f};

enum class FinishReason { kStop, kLength, kCancelled };

struct GenerateRequest {
  std::vector<int32_t> prompt;        // token ids, already templated
  SamplingParams sampling;
  int32_t max_tokens = 256;           // generated tokens at most
  std::vector<int32_t> stop_tokens;   // end generation on any of these (in addition to EOS)
  bool ignore_eos = false;
  // Called for each generated token, in order. Return false to stop generation (stop string found,
  // client gone); the engine then finishes with kStop (or kCancelled if cancelled() is true).
  std::function<bool(int32_t token)> on_token;
  // Polled between steps and during long prefills.
  std::function<bool()> cancelled;
};

struct GenerateResult {
  std::vector<int32_t> tokens;     // generated ids (including a final stop token, if any)
  FinishReason finish = FinishReason::kStop;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;       // prompt tokens restored from a snapshot instead of prefilled
  double prefill_ms = 0;            // includes restore_ms
  double decode_ms = 0;
  double restore_ms = 0;            // finding, loading and restoring the snapshot
  uint64_t restored_bytes = 0;      // size of the restored snapshot
  double snapshot_ms = 0;           // its snapshots' captures on its path (inside prefill_ms); the rest is copied after
  // Speculative decoding (EngineOptions::draft): verify steps run, draft tokens they checked, and of
  // those the ones accepted (each saved a decode step).
  int64_t verify_steps = 0, draft_tokens = 0, accepted_tokens = 0;
};

struct EngineInfo {
  std::string model_name;          // general.name or the file stem
  std::string architecture;        // qwen35 / qwen35moe
  int64_t n_ctx = 0;               // maximum prompt + generation tokens per request
  int64_t n_vocab = 0;
  std::vector<int32_t> eos_tokens; // generation ends on these
};

// Counters for /metrics (monotonic since start, except the *_bytes gauges).
struct EngineStats {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  uint64_t cache_ram_hits = 0, cache_disk_hits = 0, cache_misses = 0, snapshots_saved = 0;
  uint64_t draft_tokens = 0, accepted_tokens = 0;  // speculative decoding
  uint64_t cache_ram_bytes = 0, cache_disk_bytes = 0;
  // CUDA single-token and verify steps (Model::cuda_graph_stats) as of the last finished request:
  // replayed from a captured graph, captured (then run), or run op by op (a warm-up). Zero on the CPU.
  uint64_t graph_replayed_steps = 0, graph_captured_steps = 0, graph_op_by_op_steps = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const EngineInfo& info() const = 0;
  // Runs one request to completion (one at a time; the server queues). Errors: prompt longer than
  // the context (kInvalidArgument), cancelled (kCancelled is reported as finish, not an error).
  virtual Result<GenerateResult> generate(const GenerateRequest& request) = 0;
  virtual EngineStats stats() const { return {}; }
};

struct EngineOptions {
  int32_t n_threads = 0;            // CPU threads; 0 = all cores
  int64_t n_ctx = 0;                // context per sequence; 0 = the model's training context, capped at 32768
  std::string device = "cpu";       // "cpu" or "cuda:N" (engine_parse_device)
  bool cuda_graphs = true;          // CUDA: replay decode steps as captured graphs (--no-cuda-graph)
  // CUDA: a decode step whose sampling needs only the best logits (greedy, top-k up to kTopKMax,
  // no penalties) selects them on the device and copies back those instead of the whole row.
  bool step_top_k = true;
  // Tokens per prefill chunk (chunks are aligned to absolute positions); 0 = auto: 256 on the CPU;
  // on CUDA 4096 on devices of 28 GiB or more, else 1024.
  int64_t prefill_chunk = 0;
  // Attention KV cache type (engine_parse_kv_type): "f16", "f32", "q8_0" (8-bit blocks, 8.5 bits an
  // element), "q4_0" (4-bit blocks, 4.5 bits an element; both for models whose head_dim is a multiple
  // of 32), or empty = f16 on CUDA (the tensor-core attention kernels read F16 KV; half the memory),
  // f32 on the CPU. Snapshots are kept apart by it: a cache written with one type is a miss for the
  // others.
  std::string kv_type;
  // Prefix snapshots (see engine/local_engine.h).
  int64_t cache_ram_bytes = -1;     // in-memory snapshot budget; -1 = 25% of available RAM, 0 = off
  std::string kv_cache_dir;         // disk tier directory (--kv-cache-dir); empty = off
  uint64_t kv_cache_disk_budget = 0;  // bytes; 0 = unlimited
  int64_t checkpoint_every = 4096;  // snapshot interval inside long prompts, tokens; 0 = off
  // Speculative decoding: "ngram" drafts from the request's own tokens (NgramDraft), each verified by
  // the model in one step and its rows sampled as decode steps would be; "" = off. The output is the
  // same tokens either way (on CUDA up to float rounding between the verify's and the step's kernels).
  std::string draft;
  int32_t draft_max = 7;            // draft tokens per verify, 1 to kMaxVerifyTokens - 1
};

// The draft kind of EngineOptions::draft: kInvalidArgument for anything but "", "none", "off" and "ngram"
// (the first three: off), or a draft_max outside 1..7.
Status engine_check_draft(const EngineOptions& options);
// Whether EngineOptions::draft (checked) turns speculative drafts on.
inline bool engine_drafts(const EngineOptions& options) { return options.draft == "ngram"; }


// "cpu", "cuda" (= cuda:0) or "cuda:N" as a Device. kInvalidArgument for anything else ("gpu",
// "cuda:x"), kUnsupported for cuda in a build without the CUDA backend. Whether the device exists is
// checked when the model opens it.
Result<Device> engine_parse_device(const std::string& text);

// The KV cache type of EngineOptions::kv_type on `device`: kInvalidArgument for anything but "", "f16",
// "f32", "q8_0" and "q4_0" (whether the model's head_dim allows the block types is checked when the model
// opens).
Result<DType> engine_parse_kv_type(const std::string& text, Device device);

// Loads a GGUF model and returns the local engine for it. Errors name the file and the problem.
Result<std::unique_ptr<Engine>> engine_open(const std::string& model_path, const EngineOptions& options);

}  // namespace ds
