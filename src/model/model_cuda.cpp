// The model on a CUDA device: opening the device, uploading the weights, the per-step parameter
// buffers (position and token ids: the only host inputs of a step), the logits read-back, and the
// decode step replayed as a captured CUDA graph.
// Non-obvious choices:
//  - A graph holds every device address it touched. It is keyed on all addresses that can change
//    between decode steps (the state, its recurrent buffer and device block table, the attention
//    launch bound max_kv, the scratch arena generation, the hidden buffer) and recaptured when the
//    key changes. Everything else a step reads that changes per token (position, token id, block
//    table entries) is read from device memory at run time.
//  - A step's first run is one ordinary step (warm-up), so that any first-use allocation happens
//    outside a capture; after it every new key is captured at once (a capture that allocates scratch
//    is dropped and that step runs op by op). A new capture updates the executable graph in place
//    when the topology allows. A capture that fails right after a warm-up with its own key (an op on
//    the path synchronizes, say) turns graphs off for that step with a warning instead of failing the
//    decode; one that fails after a warm-up with another key runs as the warm-up of its own.
//  - Weights are uploaded into one device allocation (256-byte aligned tensors) through two pinned
//    staging buffers, so a copy overlaps the next host read; pages of the GGUF mapping are released
//    once uploaded (the mapping itself stays: tokenizer and metadata live there).
//  - Q6_K weights that only the matrix products read (upload_as_q6_k_g4) are regrouped on the way
//    into the device layout Q6_K_G4 (quant/blocks.h GroupQ6_K4: 848 bytes per 1024 elements instead
//    of 840, every part 16-byte aligned), which the one-token product decodes with far fewer
//    instructions; every CUDA reader of those tensors takes it (matvec, the BF16 dequantization).
#include "model/model.h"
#include "model/model_internal.h"

#if DS_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "gguf/gguf.h"
#include "model/weight_specs.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_registry.h"
#include "ops/cuda/timeline.h"
#include "ops/cuda/top_k_launch.h"
#include "ops/matmul.h"
#include "quant/quant.h"
#endif

namespace ds {

#if DS_HAVE_CUDA

namespace {

// Tensors that one matmul_many reads together, as (follower, leader) name suffixes within a layer: the
// upload places each follower right after its leader, so the products' weights are adjacent and, with
// adjacent outputs (ModelScratch::f32_outputs), run as one launch.
constexpr std::pair<std::string_view, std::string_view> kUploadFollows[] = {
    {"attn_k.weight", "attn_q.weight"},         {"attn_v.weight", "attn_k.weight"},
    {"attn_gate.weight", "attn_qkv.weight"},    {"ssm_beta.weight", "attn_gate.weight"},
    {"ssm_alpha.weight", "ssm_beta.weight"},    {"ffn_up.weight", "ffn_gate.weight"},
    {"ffn_up_shexp.weight", "ffn_gate_shexp.weight"},
};

// Spec indices in upload order: spec order, except that followers come right after their leaders.
std::vector<size_t> upload_sequence(const std::vector<WeightSpec>& specs) {
  std::map<std::string, size_t, std::less<>> index;
  for (size_t i = 0; i < specs.size(); ++i) index.emplace(specs[i].name, i);
  // The spec at `prefix + other` where name = prefix + suffix, if any.
  auto sibling = [&](const std::string& name, std::string_view suffix, std::string_view other) -> std::optional<size_t> {
    if (!name.ends_with(suffix)) return std::nullopt;
    const auto it = index.find(name.substr(0, name.size() - suffix.size()) + std::string(other));
    return it == index.end() ? std::nullopt : std::optional<size_t>(it->second);
  };
  auto leader = [&](size_t i) {
    for (auto [f, l] : kUploadFollows) {
      if (auto j = sibling(specs[i].name, f, l)) return j;
    }
    return std::optional<size_t>();
  };
  auto follower = [&](size_t i) {
    for (auto [f, l] : kUploadFollows) {
      if (auto j = sibling(specs[i].name, l, f)) return j;
    }
    return std::optional<size_t>();
  };
  std::vector<size_t> seq;
  std::vector<char> placed(specs.size(), 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (placed[i] || leader(i)) continue;
    for (std::optional<size_t> j = i; j && !placed[*j]; j = follower(*j)) {
      seq.push_back(*j);
      placed[*j] = 1;
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!placed[i]) seq.push_back(i);  // a chain whose leader was placed elsewhere (not expected)
  }
  return seq;
}

// Where a step's logits copy can go directly: the sequence's own logits where they are page-locked
// (no host copy after the step), else null (through the model's pinned buffer).
float* direct_logits(SequenceState& state) { return state.logits_pinned() ? state.logits().data() : nullptr; }

// What a captured decode graph depends on besides the model's own fixed buffers.
struct GraphKey {
  const SequenceState* state = nullptr;
  const void* recurrent = nullptr;
  const void* slot_table = nullptr;
  int64_t max_kv = 0;
  uint64_t scratch_generation = 0;
  const void* hidden = nullptr;
  const float* logits = nullptr;  // where the step's logits copy goes (the sequence's pinned logits)
  const TopKResult* top_k = nullptr;  // or where its best logits go, when only they are copied
  bool operator==(const GraphKey&) const = default;
};

// Layer weights read by the matrix products only (matmul, matmul_many, matmul_swiglu), and output.weight
// when it is not tied to the token embedding (get_rows reads that; a shared source keeps its layout).
constexpr std::string_view kProductOnlySuffixes[] = {
    ".attn_qkv.weight", ".attn_gate.weight", ".ssm_beta.weight", ".ssm_alpha.weight", ".ssm_out.weight",
    ".attn_q.weight",   ".attn_k.weight",    ".attn_v.weight",   ".attn_output.weight", ".ffn_gate.weight",
    ".ffn_up.weight",   ".ffn_down.weight",
};

// True when tensor `name` goes to the device as Q6_K_G4: a 2-D Q6_K product weight whose rows are whole
// 1024-element groups.
bool upload_as_q6_k_g4(std::string_view name, const TensorView& t) {
  if (t.dtype != DType::Q6_K || t.ne[2] * t.ne[3] != 1 || t.ne[0] % dtype_block_size(DType::Q6_K_G4) != 0) return false;
  if (name == "output.weight") return true;
  for (std::string_view suffix : kProductOnlySuffixes) {
    if (name.starts_with("blk.") && name.ends_with(suffix)) return true;
  }
  return false;
}

constexpr int64_t kWeightAlign = 256;                 // bytes; start of each tensor in the device copy
constexpr int64_t kStagingBytes = int64_t{64} << 20;  // per pinned staging buffer

// Drops the resident pages of a read-only file mapping range (they are re-read from the file if
// touched again). Only whole pages inside the range are released.
void release_mapped_pages(const void* p, int64_t bytes) {
  const long page = ::sysconf(_SC_PAGESIZE);
  if (page <= 0 || bytes <= 0) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) / page * page;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

// A step replayed as a captured graph: its executable graph and the key it was captured for, whether
// the step has run op by op (warm), and the key of the last such run (a capture that fails with that
// key turns the step's graphs off).
struct StepGraph {
  cudaGraphExec_t exec = nullptr;
  GraphKey key;
  bool warm = false;
  GraphKey warm_key;
  bool failed = false;  // a capture of this step failed: op by op from then on
  bool refusal_logged = false;  // an in-place update was refused and that was logged
};

struct ModelCuda {
  int device = 0;
  cuda::Stream stream;
  int64_t max_segment = 0;          // tokens the step buffers hold
  cuda::PinnedBuffer step_host;     // int32 [1 + max_segment]: pos0, then the segment's token ids
  DeviceBuffer step_dev;            // the same on the device
  cuda::Event step_uploaded;        // recorded after each queued upload of step_host
  bool step_pending = false;        // an upload queued from step_host may not have run yet
  DeviceBuffer logits_dev;          // [n_vocab] F32
  cuda::PinnedBuffer logits_host;   // [n_vocab] F32
  DeviceBuffer top_k_dev;           // one TopKResult; empty where the vocabulary is too large
  DeviceBuffer top_k_scratch;       // its block maxima
  DeviceBuffer verify_top_k;        // TopKResult [kMaxVerifyTokens]: a verify's rows (first verify)
  const SequenceState* logits_of = nullptr;  // whose step logits_dev holds (fetch_logits), at which position
  int64_t logits_pos = -1;
  // The single-token decode step: [0] copies the logits row back, [1] only its best logits (the two
  // differ in topology, so requests of both kinds in turn would otherwise re-instantiate one graph).
  StepGraph decode[2];
  StepGraph verify[kMaxVerifyTokens + 1];  // a speculative verify of n tokens (Model::verify)
  StepGraph keep[kMaxVerifyTokens + 1];    // keeping m of a verify's tokens: the recurrent replay
  CudaGraphStats stats;
  cuda::Event replay_start, replay_end;  // ModelOptions::cuda_time_steps only

  std::vector<StepGraph*> all_graphs() {
    std::vector<StepGraph*> v{&decode[0], &decode[1]};
    for (StepGraph& g : verify) v.push_back(&g);
    for (StepGraph& g : keep) v.push_back(&g);
    return v;
  }

  ~ModelCuda() {
    if (stream.handle() != nullptr) (void)stream.synchronize();  // nothing in flight reads our buffers
    cuda::DeviceGuard guard(device);
    for (StepGraph* g : all_graphs()) {
      if (g->exec != nullptr) (void)cudaGraphExecDestroy(g->exec);
    }
  }
};

void ModelCudaDeleter::operator()(ModelCuda* p) const { delete p; }

CudaGraphStats Model::cuda_graph_stats() const { return cuda_ ? cuda_->stats : CudaGraphStats{}; }

const int32_t* Model::cuda_step_pos() const { return static_cast<const int32_t*>(cuda_->step_dev.data()); }

// A device that cannot be queried gets the small chunk; cuda_init reports its error.
int64_t Model::cuda_auto_prefill_chunk() const {
  const Result<cuda::DeviceInfo> info = cuda::device_info(options_.device.index);
  return info.is_ok() && info.value().total_bytes >= kPrefillChunkCudaLargeMinBytes ? kPrefillChunkCudaLarge
                                                                                     : kPrefillChunkCuda;
}

Status Model::cuda_init() {
  const Device dev = options_.device;
  const int n_dev = cuda::device_count();
  if (n_dev == 0) {
    return unsupported("model: device {} requested, but no CUDA device is visible (no driver or GPU, or "
                       "CUDA_VISIBLE_DEVICES hides them); use --device cpu",
                       dev.to_string());
  }
  if (dev.index < 0 || dev.index >= n_dev) {
    return invalid_argument("model: device {} does not exist: {} CUDA device(s) visible (cuda:0 .. cuda:{})",
                            dev.to_string(), n_dev, n_dev - 1);
  }
  DS_TRY(cuda::device_status(dev.index));
  cuda::register_ops();

  std::unique_ptr<ModelCuda, ModelCudaDeleter> c(new ModelCuda());
  c->device = dev.index;
  DS_ASSIGN_OR_RETURN(c->stream, cuda::Stream::create(dev.index));
  c->max_segment = std::min(options_.prefill_chunk, n_ctx_);
  const int64_t step_bytes = 4 * (1 + c->max_segment);
  DS_ASSIGN_OR_RETURN(c->step_host, cuda::PinnedBuffer::allocate(step_bytes));
  DS_ASSIGN_OR_RETURN(c->step_dev, DeviceBuffer::alloc(dev, step_bytes, /*zero=*/true));
  DS_ASSIGN_OR_RETURN(c->step_uploaded, cuda::Event::create(dev.index));
  DS_ASSIGN_OR_RETURN(c->logits_dev, DeviceBuffer::alloc(dev, 4 * config_.n_vocab));
  DS_ASSIGN_OR_RETURN(c->logits_host, cuda::PinnedBuffer::allocate(4 * config_.n_vocab));
  if (cuda::top_k_fits(config_.n_vocab)) {
    DS_ASSIGN_OR_RETURN(c->top_k_dev, DeviceBuffer::alloc(dev, sizeof(TopKResult)));
    DS_ASSIGN_OR_RETURN(c->top_k_scratch, DeviceBuffer::alloc(dev, 4 * cuda::top_k_scratch_floats(config_.n_vocab)));
  }
  if (options_.cuda_time_steps) {
    DS_ASSIGN_OR_RETURN(c->replay_start, cuda::Event::create(dev.index));
    DS_ASSIGN_OR_RETURN(c->replay_end, cuda::Event::create(dev.index));
  }
  ctx_.cuda_stream = c->stream.handle();
  cuda::DeviceGuard guard(dev.index);

  // ---- weights: one device allocation, each distinct source tensor once (tied output shares) ----
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<WeightSpec> specs = weight_specs(config_, &weights_);
  struct Source {
    int64_t bytes = 0;         // in the host copy
    int64_t offset = 0;        // in the device allocation
    bool g4 = false;           // regrouped to Q6_K_G4 on the way (every tensor on it qualifies)
    int64_t k = 0, rows = 0;   // the shape, for g4
    int64_t device_bytes() const { return g4 ? rows * dtype_row_bytes(DType::Q6_K_G4, k) : bytes; }
  };
  std::map<const uint8_t*, Source> sources;
  std::vector<const uint8_t*> order;  // upload order: first use, in upload_sequence order
  int64_t total = 0;
  for (const size_t si : upload_sequence(specs)) {
    const WeightSpec& s = specs[si];
    const TensorView& t = *s.slot;
    if (t.data == nullptr) continue;
    if (t.device.kind != DeviceKind::kCpu) {
      return invalid_argument("model: tensor '{}' is already on {}; weights must start in host memory", s.name,
                              t.device.to_string());
    }
    if (!t.is_contiguous()) return invalid_argument("model: tensor '{}' {} is not contiguous", s.name, t.shape_string());
    const auto* src = static_cast<const uint8_t*>(t.data);
    auto [it, inserted] = sources.try_emplace(src);
    const bool g4 = upload_as_q6_k_g4(s.name, t);
    if (inserted) {
      order.push_back(src);
      it->second = Source{t.n_bytes(), 0, g4, t.ne[0], t.n_rows()};
    } else if (it->second.bytes != t.n_bytes()) {
      return invalid_argument("model: tensor '{}' shares its data with another tensor of {} bytes, not {}", s.name,
                              it->second.bytes, t.n_bytes());
    } else {
      it->second.g4 = it->second.g4 && g4 && it->second.k == t.ne[0];
    }
  }
  for (const uint8_t* src : order) {
    Source& e = sources[src];
    e.offset = total;
    total += (e.device_bytes() + kWeightAlign - 1) / kWeightAlign * kWeightAlign;
  }
  DS_ASSIGN_OR_RETURN(DeviceBuffer wbuf, DeviceBuffer::alloc(dev, total));
  uint8_t* base = static_cast<uint8_t*>(wbuf.data());

  // Double-buffered staging: fill one pinned buffer while the other one's copy runs.
  const int64_t stage_bytes = std::max<int64_t>(1, std::min(kStagingBytes, total));
  cuda::PinnedBuffer stage[2];
  cuda::Event staged[2];
  bool in_flight[2] = {false, false};
  for (int b = 0; b < 2; ++b) {
    DS_ASSIGN_OR_RETURN(stage[b], cuda::PinnedBuffer::allocate(stage_bytes));
    DS_ASSIGN_OR_RETURN(staged[b], cuda::Event::create(dev.index));
  }
  int64_t done = 0, next_report = total / 10;
  int b = 0;
  for (const uint8_t* src : order) {
    const Source& e = sources[src];
    // Whole rows per staging buffer when regrouping (a row is at most a few tens of KB).
    const int64_t src_row = e.g4 ? dtype_row_bytes(DType::Q6_K, e.k) : 1;
    const int64_t dst_row = e.g4 ? dtype_row_bytes(DType::Q6_K_G4, e.k) : 1;
    const int64_t step = e.g4 ? std::max<int64_t>(1, stage_bytes / dst_row) * src_row : stage_bytes;
    for (int64_t off = 0; off < e.bytes; off += step) {
      const int64_t len = std::min(step, e.bytes - off);
      if (in_flight[b]) DS_TRY(staged[b].synchronize());
      int64_t dev_off = off, dev_len = len;
      if (e.g4) {
        dev_off = off / src_row * dst_row;
        dev_len = len / src_row * dst_row;
        for (int64_t r = 0; r < len / src_row; ++r) {
          quant::q6_k_to_g4(src + off + r * src_row, static_cast<uint8_t*>(stage[b].data()) + r * dst_row, e.k);
        }
      } else {
        std::memcpy(stage[b].data(), src + off, static_cast<size_t>(len));
      }
      DS_TRY(cuda::copy_to_device(base + e.offset + dev_off, stage[b].data(), dev_len, c->stream));
      DS_TRY(staged[b].record(c->stream));
      in_flight[b] = true;
      b ^= 1;
      done += len;
      if (done >= next_report && total >= (int64_t{256} << 20)) {
        DS_LOG_INFO("model: uploading weights to {}: {}% ({} / {} MiB)", dev.to_string(), 100 * done / total,
                    done >> 20, total >> 20);
        next_report += total / 10;
      }
    }
    if (gguf_) release_mapped_pages(src, e.bytes);
  }
  DS_TRY(c->stream.synchronize());
  int64_t n_g4 = 0;
  for (WeightSpec& s : specs) {
    TensorView& t = *s.slot;
    if (t.data == nullptr) continue;
    const Source& e = sources[static_cast<const uint8_t*>(t.data)];
    if (e.g4) {
      t = TensorView::contiguous(nullptr, DType::Q6_K_G4, {t.ne[0], t.ne[1]});
      ++n_g4;
    }
    t.data = base + e.offset;
    t.device = dev;
  }
  storage_.clear();  // host copies of from_weights models are no longer needed
  storage_.push_back(std::move(wbuf));
  weight_device_bytes_ = total;
  cuda_ = std::move(c);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  DS_LOG_INFO("model: {} weight tensors ({} of them Q6_K regrouped to q6_K_g4), {:.1f} MiB uploaded to {} in "
              "{:.2f} s ({:.2f} GB/s)",
              order.size(), n_g4, static_cast<double>(total) / (1 << 20), dev.to_string(), secs,
              secs > 0 ? total / secs / 1e9 : 0.0);
  return Status::ok();
}

Result<int32_t*> Model::cuda_step_write(int64_t pos0, std::span<const int32_t> tokens) {
  ModelCuda& c = *cuda_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n > c.max_segment) {
    return invalid_argument("model: {} tokens in one step exceed the CUDA step buffer of {} tokens (prefill_chunk)", n,
                            c.max_segment);
  }
  DS_CHECK(pos0 >= 0 && pos0 <= INT32_MAX, "position {} does not fit the int32 step buffer", pos0);
  if (c.step_pending) {  // the previous upload must have read the pinned buffer before it is rewritten
    DS_TRY(c.step_uploaded.synchronize());
    c.step_pending = false;
  }
  auto* h = static_cast<int32_t*>(c.step_host.data());
  h[0] = static_cast<int32_t>(pos0);
  if (n > 0) std::memcpy(h + 1, tokens.data(), static_cast<size_t>(4 * n));
  return h;
}

Status Model::cuda_stage(int64_t pos0, std::span<const int32_t> tokens) {
  ModelCuda& c = *cuda_;
  DS_ASSIGN_OR_RETURN(int32_t* h, cuda_step_write(pos0, tokens));
  DS_TRY(cuda::copy_to_device(c.step_dev.data(), h, 4 * (1 + static_cast<int64_t>(tokens.size())), c.stream));
  DS_TRY(c.step_uploaded.record(c.stream));
  c.step_pending = true;
  return Status::ok();
}

Status Model::cuda_embed_staged(int64_t n_tokens, const TensorView& hidden) {
  const TensorView ids = TensorView::contiguous(static_cast<int32_t*>(cuda_->step_dev.data()) + 1, DType::I32,
                                                {n_tokens}, options_.device);
  DS_TRY(cuda::get_rows_trusted(ctx_, weights_.token_embd, ids, hidden));
  dump("token_embd", hidden);
  return Status::ok();
}

Status Model::cuda_head_output(const TensorView& norm, float* pinned, TopKResult* top_k) {
  ModelCuda& c = *cuda_;
  const TensorView out = c.logits_dev.view(DType::F32, {config_.n_vocab, 1});
  DS_TRY(matmul(ctx_, weights_.output, norm, out));
  dump("result_output", out);
  if (top_k != nullptr) {
    DS_CHECK(!c.top_k_dev.empty(), "best logits asked of a model whose vocabulary of {} has none", config_.n_vocab);
    const TensorView scratch = c.top_k_scratch.view(DType::F32, {cuda::top_k_scratch_floats(config_.n_vocab)});
    auto* best = static_cast<TopKResult*>(c.top_k_dev.data());
    DS_TRY(cuda::top_k(ctx_, c.logits_dev.view(DType::F32, {config_.n_vocab}), scratch, best));
    return cuda::copy_to_host(top_k, c.top_k_dev.data(), sizeof(TopKResult), c.stream);
  }
  void* to = pinned != nullptr ? static_cast<void*>(pinned) : c.logits_host.data();
  return cuda::copy_to_host(to, c.logits_dev.data(), 4 * config_.n_vocab, c.stream);
}

Status Model::fetch_logits(SequenceState& state) {
  if (state.logits_valid()) return Status::ok();
  if (!cuda_ || !state.top_k_valid() || cuda_->logits_of != &state || cuda_->logits_pos != state.pos()) {
    return invalid_argument("fetch_logits: the device no longer holds the logits of this state's last step");
  }
  ModelCuda& c = *cuda_;
  cuda::DeviceGuard guard(c.device);
  DS_TRY(cuda::copy_to_host(state.logits().data(), c.logits_dev.data(), 4 * config_.n_vocab, c.stream));
  DS_TRY(c.stream.synchronize());
  state.set_logits_valid(true);
  return Status::ok();
}

Status Model::cuda_finish_logits(float* logits, bool in_place) {
  ModelCuda& c = *cuda_;
  DS_TRY(c.stream.synchronize());
  c.step_pending = false;  // everything queued has run
  c.logits_of = nullptr;   // logits_dev holds this head's row (cuda_decode_graph names its state after)
  if (!in_place) std::memcpy(logits, c.logits_host.data(), static_cast<size_t>(4 * config_.n_vocab));
  return Status::ok();
}

Status Model::cuda_run_segment(SequenceState& state, std::span<const int32_t> tokens, bool want_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size()), E = config_.n_embd;
  if (n == 1 && want_logits && options_.cuda_graphs && !debug_hook_) {
    return cuda_decode_graph(state, tokens[0]);
  }
  const TensorView hidden = hidden_buf_.view(DType::F32, {E, n});
  DS_TRY(cuda_stage(state.pos(), tokens));
  DS_TRY(cuda_embed_staged(n, hidden));
  DS_TRY(forward_layers(LayerRange{0, config_.n_layer}, state, hidden, hidden));
  state.set_logits_valid(false);
  if (want_logits) {
    const TensorView last = TensorView::contiguous(hidden.as<float>() + (n - 1) * E, DType::F32, {E, 1},
                                                   options_.device);
    float* direct = direct_logits(state);
    DS_TRY(head_queue(last, direct));
    DS_TRY(cuda_finish_logits(state.logits().data(), direct != nullptr));
  }
  state.set_pos(state.pos() + n);
  state.set_logits_valid(want_logits);
  return Status::ok();
}

namespace {

enum class StepRun { kReplayed, kCaptured, kOpByOp };

// Runs one step through `g`: a replay where its key matches, else a capture (then a launch) once the step
// has run op by op (warmed up) with any key, else op by op, remembering the key for the next call.
// `queue` queues the step's ops on the stream; `key_now` is the key as things stand. With `timed`, a
// replay is timed by c's events.
// Non-obvious choice: the warm-up (one step op by op before a capture) is for the step's first run, whose
// ops may allocate or synchronize on first use. After it every op has run: a new key (another sequence,
// the next max_kv bucket) is captured at once, so a request's first decode step replays instead of
// running op by op; where such a capture fails, the step runs op by op as the warm-up of its key.
Result<StepRun> run_step_graph(ModelCuda& c, StepGraph& g, const std::function<GraphKey()>& key_now,
                               const std::function<Status()>& queue, const char* what, int64_t pos, bool timed) {
  const auto stream = static_cast<cudaStream_t>(c.stream.handle());
  const GraphKey key = key_now();
  if (g.exec != nullptr && g.key == key) {
    if (timed) DS_TRY(c.replay_start.record(c.stream));
    DS_CUDA_TRY(cudaGraphLaunch(g.exec, stream), "{} graph replay at position {}", what, pos);
    if (timed) DS_TRY(c.replay_end.record(c.stream));
    return StepRun::kReplayed;
  }
  const bool warmed = g.warm && g.warm_key == key;  // warmed up with this very key
  if (!g.failed && g.warm) {
    DS_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "{} graph capture at position {}", what,
                pos);
    cuda::timeline_capture_begin();  // the graph's launches, for a diagnostic timeline (timeline.h)
    const Status queued = queue();
    cudaGraph_t captured = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &captured);
    cuda::timeline_capture_end(queued.is_ok() && ended == cudaSuccess);
    if (!queued.is_ok() || ended != cudaSuccess) {
      // An op that cannot be captured (it synchronizes or copies from pageable memory) or a real
      // error: either way nothing ran. Warmed up with another key, the step runs op by op as the
      // warm-up of this one; after a warm-up with this key it runs op by op from now on, and a real
      // error shows up again.
      if (captured != nullptr) (void)cudaGraphDestroy(captured);
      (void)cudaGetLastError();
      if (warmed) {
        g.failed = true;
        DS_LOG_WARN("model: {} graph capture at position {} failed ({}); that step runs op by op from now on", what,
                    pos, !queued.is_ok() ? queued.to_string() : std::string(cudaGetErrorString(ended)));
      }
    } else if (!(key_now() == key)) {
      // The step allocated scratch while capturing: the graph would hold a stale block. Drop it and
      // run this step op by op, the warm-up of the new key.
      if (warmed) DS_LOG_WARN("model: {} graph capture at position {} allocated scratch; retrying after warm-up", what, pos);
      (void)cudaGraphDestroy(captured);
    } else {
      // Same topology, new addresses (another sequence, the next max_kv bucket): updating the
      // executable graph in place is much cheaper than instantiating; fall back when refused.
      bool updated = false;
      if (g.exec != nullptr) {
        cudaGraphExecUpdateResultInfo info{};
        updated = cudaGraphExecUpdate(g.exec, captured, &info) == cudaSuccess;
        if (!updated) {
          (void)cudaGetLastError();  // the refusal is not sticky; clear it
          if (!g.refusal_logged) {
            cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
            if (info.errorNode != nullptr) (void)cudaGraphNodeGetType(info.errorNode, &type);
            DS_LOG_INFO("model: the {} graph at position {} was instantiated anew: an in-place update was refused "
                        "(cudaGraphExecUpdateResult {}, node type {})",
                        what, pos, static_cast<int>(info.result), static_cast<int>(type));
            g.refusal_logged = true;
          }
          (void)cudaGraphExecDestroy(g.exec);
          g.exec = nullptr;
        }
      }
      if (!updated) {
        const cudaError_t inst = cudaGraphInstantiate(&g.exec, captured, 0);
        if (inst != cudaSuccess) {
          (void)cudaGraphDestroy(captured);
          g.exec = nullptr;
          DS_CUDA_TRY(inst, "{} graph instantiate at position {}", what, pos);
        }
      }
      (void)cudaGraphDestroy(captured);
      g.key = key;
      c.stats.captures++;
      DS_CUDA_TRY(cudaGraphLaunch(g.exec, stream), "{} graph launch at position {}", what, pos);
      return StepRun::kCaptured;
    }
  }
  DS_TRY(queue());
  g.warm = true;
  g.warm_key = key_now();  // a capture failing with this key is final
  return StepRun::kOpByOp;
}

}  // namespace

Status Model::cuda_decode_graph(SequenceState& state, int32_t token) {
  ModelCuda& c = *cuda_;
  const int64_t pos = state.pos();
  const TensorView hidden = hidden_buf_.view(DType::F32, {config_.n_embd, 1});
  cuda::DeviceGuard guard(c.device);
  scratch_->reset();  // outside any capture: merging spilled scratch blocks allocates
  float* direct = direct_logits(state);
  // Only the best logits come back where the state wants no more and can take them as the logits.
  TopKResult* top_k = state.want_top_k() && direct != nullptr && !c.top_k_dev.empty() ? state.top_k_data() : nullptr;
  const auto key_now = [&] {
    return GraphKey{&state,
                    state.recurrent_data(),
                    state.device_slot_table(),
                    cuda::attention_launch_bound(pos + 1, n_ctx_),
                    scratch_->generation,
                    hidden_buf_.data(),
                    direct,
                    top_k};
  };

  // This step's inputs go into the pinned step buffer; the step itself (graph or ops) uploads them.
  DS_ASSIGN_OR_RETURN(int32_t* h, cuda_step_write(pos, std::span<const int32_t>(&token, 1)));
  const auto queue_step = [&]() -> Status {
    DS_TRY(cuda::copy_to_device(c.step_dev.data(), h, 8, c.stream));
    DS_TRY(cuda_embed_staged(1, hidden));
    DS_TRY(forward_layers(LayerRange{0, config_.n_layer}, state, hidden, hidden));
    return head_queue(hidden, direct, top_k);
  };

  const bool timed = options_.cuda_time_steps;
  DS_ASSIGN_OR_RETURN(const StepRun run,
                      run_step_graph(c, c.decode[top_k != nullptr], key_now, queue_step, "decode", pos, timed));
  if (run == StepRun::kOpByOp) {
    c.stats.uncaptured++;
  } else {
    c.stats.replays++;
  }
  c.step_pending = true;  // cleared by the synchronization below
  DS_TRY(cuda_finish_logits(state.logits().data(), direct != nullptr || top_k != nullptr));
  c.logits_of = &state;
  c.logits_pos = pos + 1;
  if (timed && run == StepRun::kReplayed) {
    DS_ASSIGN_OR_RETURN(const float ms, cuda::Event::elapsed_ms(c.replay_start, c.replay_end));
    c.stats.timed_replays++;
    c.stats.replay_device_ms += ms;
  }
  state.set_pos(pos + 1);
  if (top_k != nullptr) {
    state.set_top_k_valid();
  } else {
    state.set_logits_valid(true);
  }
  return Status::ok();
}

Status Model::cuda_verify_step(SequenceState& state, std::span<const int32_t> tokens, const TensorView& logits,
                               TopKResult* best, float* rows, bool whole_rows) {
  ModelCuda& c = *cuda_;
  const int64_t n = static_cast<int64_t>(tokens.size()), V = config_.n_vocab, pos0 = state.pos();
  cuda::DeviceGuard guard(c.device);
  scratch_->reset();  // outside any capture
  const bool select = !c.top_k_dev.empty() && !whole_rows;  // else every row comes whole
  if (select && c.verify_top_k.empty()) {
    DS_ASSIGN_OR_RETURN(c.verify_top_k, DeviceBuffer::alloc(options_.device, sizeof(TopKResult) * kMaxVerifyTokens));
  }
  DS_ASSIGN_OR_RETURN(int32_t* h, cuda_step_write(pos0, tokens));  // uploaded by the step itself
  auto* dev_best = static_cast<TopKResult*>(c.verify_top_k.data());
  const auto queue_step = [&]() -> Status {
    DS_TRY(cuda::copy_to_device(c.step_dev.data(), h, 4 * (1 + n), c.stream));
    DS_TRY(verify_queue(state, tokens, logits));
    if (!select) return Status::ok();
    const TensorView scratch = c.top_k_scratch.view(DType::F32, {cuda::top_k_scratch_floats(V)});
    for (int64_t i = 0; i < n; ++i) {
      const TensorView row = TensorView::contiguous(logits.as<float>() + i * V, DType::F32, {V}, options_.device);
      DS_TRY(cuda::top_k(ctx_, row, scratch, dev_best + i));
    }
    return cuda::copy_to_host(best, dev_best, static_cast<int64_t>(sizeof(TopKResult)) * n, c.stream);
  };
  const auto key_now = [&] {
    return GraphKey{&state,          state.recurrent_data(), state.device_slot_table(),
                    cuda::attention_launch_bound(pos0 + n, n_ctx_), scratch_->generation, hidden_buf_.data(),
                    logits.as<float>(), best};
  };
  if (options_.cuda_graphs && !debug_hook_ && select) {
    DS_TRY(run_step_graph(c, c.verify[n], key_now, queue_step, "verify", pos0, false).status());
  } else {
    DS_TRY(queue_step());
  }
  c.step_pending = true;
  DS_TRY(c.stream.synchronize());
  c.step_pending = false;
  c.logits_of = nullptr;  // logits_dev holds no state's step now
  for (int64_t i = 0; i < n; ++i) {
    if (select && best[i].n >= 1) continue;
    best[i].n = 0;  // this row comes whole: no selection, or it overflowed (values tied across the vocabulary)
    DS_TRY(cuda::copy_to_host(rows + i * V, logits.as<float>() + i * V, 4 * V, c.stream));
  }
  return c.stream.synchronize();
}

Status Model::cuda_keep_step(SequenceState& state, int64_t pos0, int64_t n_keep) {
  ModelCuda& c = *cuda_;
  cuda::DeviceGuard guard(c.device);
  scratch_->reset();  // outside any capture
  const auto queue_step = [&] { return keep_queue(state, pos0, n_keep); };
  const auto key_now = [&] {
    return GraphKey{&state, state.recurrent_data(), nullptr, 0, scratch_->generation, nullptr, nullptr, nullptr};
  };
  if (options_.cuda_graphs && !debug_hook_) {
    return run_step_graph(c, c.keep[n_keep], key_now, queue_step, "keep", pos0, false).status();
  }
  return queue_step();
}

#else  // !DS_HAVE_CUDA

struct ModelCuda {};

void ModelCudaDeleter::operator()(ModelCuda* p) const { delete p; }

CudaGraphStats Model::cuda_graph_stats() const { return {}; }

namespace {
Status no_cuda(const Device& d) {
  return unsupported("model: device {} needs the CUDA backend, which this build does not have (rebuild with "
                     "-DDELTASERVE_CUDA=ON) ; use --device cpu",
                     d.to_string());
}
}  // namespace

Status Model::cuda_init() { return no_cuda(options_.device); }
Result<int32_t*> Model::cuda_step_write(int64_t, std::span<const int32_t>) { return no_cuda(options_.device); }
Status Model::cuda_stage(int64_t, std::span<const int32_t>) { return no_cuda(options_.device); }
Status Model::cuda_embed_staged(int64_t, const TensorView&) { return no_cuda(options_.device); }
Status Model::cuda_head_output(const TensorView&, float*, TopKResult*) { return no_cuda(options_.device); }
Status Model::fetch_logits(SequenceState& state) {
  if (state.logits_valid()) return Status::ok();
  return invalid_argument("fetch_logits: the state's last step left no logits");
}
Status Model::cuda_finish_logits(float*, bool) { return no_cuda(options_.device); }
Status Model::cuda_run_segment(SequenceState&, std::span<const int32_t>, bool) { return no_cuda(options_.device); }
Status Model::cuda_decode_graph(SequenceState&, int32_t) { return no_cuda(options_.device); }
Status Model::cuda_verify_step(SequenceState&, std::span<const int32_t>, const TensorView&, TopKResult*, float*,
                               bool) {
  return no_cuda(options_.device);
}
Status Model::cuda_keep_step(SequenceState&, int64_t, int64_t) { return no_cuda(options_.device); }
const int32_t* Model::cuda_step_pos() const { return nullptr; }
int64_t Model::cuda_auto_prefill_chunk() const { return kPrefillChunkCuda; }

#endif  // DS_HAVE_CUDA

}  // namespace ds
